"""`sessionlog serve`: run the server (one process, or a supervisor of --workers N).

The settings live in ``config`` (flags, SESSIONLOG_* variables, a TOML file). A server that
cannot start says why in one line on stderr and exits 1; a bad setting exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from sessionlog import config, logs
from sessionlog.config import ConfigError, worker_count
from sessionlog.startup import run_event_loop, start_failure


def add_command(commands: Any) -> None:
    """Register `sessionlog serve` on the `sessionlog` parser."""
    serve_cmd = commands.add_parser(
        "serve",
        help="run the server",
        description="Run the sessionlog server until SIGTERM or SIGINT (then stop gracefully). "
        "Every flag also reads an environment variable and a key of the --config TOML file; "
        "precedence: flag > env > file > default.",
    )
    config.add_flags(serve_cmd)
    serve_cmd.set_defaults(run=None)


def run(args: argparse.Namespace) -> int:
    try:
        resolved = config.resolve(args)
        server_config = config.server_config(resolved)
    except ConfigError as exc:
        print(f"sessionlog: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(config.render(resolved))
        return 0
    level, fmt = resolved.values["log_level"], resolved.values["log_format"]
    logs.configure(level, fmt)
    # The server is imported here, not above: the client commands start without it.
    from sessionlog.server import RestartInPlace, serve
    from sessionlog.workers.supervisor import Supervisor

    try:
        if worker_count(server_config) == 1:
            run_event_loop(serve(server_config))
        else:
            asyncio.run(Supervisor(server_config, level, fmt).run())
    except KeyboardInterrupt:
        return 130
    except RestartInPlace:
        # The same command line in a fresh process (same PID): the server stopped cleanly,
        # its folder and ports are free, and Python opens nothing that survives an exec.
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, sys.orig_argv)
    except Exception as exc:
        message = start_failure(exc, server_config.data_dir)
        if message is None:
            raise
        print(f"sessionlog: {message}", file=sys.stderr)
        return 1
    return 0
