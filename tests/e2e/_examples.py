"""The client README's framework examples, run as a user would: the first ```python block under
a heading, pointed at a test server, must print exactly what its ``# ->`` lines say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLIENT_README = ROOT / "client" / "python" / "README.md"


def python_block(readme: Path, heading: str) -> tuple[str, list[str]]:
    """The first ```python block after ``heading`` and its ``# ->`` lines."""
    text = readme.read_text()
    start = text.index(heading)
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match is not None, f"no python block under {heading}"
    code = match.group(1)
    return code, re.findall(r"^\s*# -> (.*)$", code, re.M)


def assert_example_prints_what_it_says(heading: str, address: str) -> None:
    """Run the client README's example under ``heading`` against ``address`` (its
    127.0.0.1:50051 replaced) and compare its output with its ``# ->`` lines."""
    code, expected = python_block(CLIENT_README, heading)
    assert expected, f"the example under {heading} says nothing it prints"
    done = subprocess.run(
        [sys.executable, "-c", code.replace("127.0.0.1:50051", address)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == expected
