"""`sessionlog dev cluster` beside a server already on its port (issue 31): the message gives the
member's last log lines (why it stopped) and names the --port option, not only an exit code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.e2e._proc import clean_env, free_ports_in_a_row, running_server


def test_a_member_whose_port_is_taken_says_why_and_names_port(tmp_path: Path) -> None:
    first = free_ports_in_a_row(5)
    members, etcd_port = first, first + 3
    with running_server(tmp_path / "taken", listen=f"127.0.0.1:{members}"):
        argv = [sys.executable, "-m", "sessionlog.cli", "dev", "cluster"]
        argv += ["--dir", str(tmp_path / "cluster"), "--port", str(members)]
        argv += ["--etcd-port", str(etcd_port)]
        done = subprocess.run(
            argv,
            cwd=tmp_path,
            env=clean_env(workers=False),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert done.returncode == 1, done
    assert "m1 exited with 1 while starting" in done.stderr, done.stderr
    assert f"cannot listen on 127.0.0.1:{members}" in done.stderr, done.stderr
    assert "--port" in done.stderr, done.stderr
    assert f"{members}..{members + 2}" in done.stderr, done.stderr
