"""``python -m sessionlog.cli``: the `sessionlog` command, as the console script runs it."""

import sys

from sessionlog.cli import main

sys.exit(main())
