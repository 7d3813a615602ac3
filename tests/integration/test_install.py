"""Installing as a user does, from a fresh copy of the checkout: `make dist`, then the docs'
`pip install dist/*.whl` into a fresh venv, with an "index" that offers a squatted
sessionlog-client of the same version. Our two wheels must come from dist/ (pip never takes a
sibling from an index), `sessionlog --help` must run and both packages import from the new venv.

Third-party dependencies come from this test's own venv (linked in through a .pth file, our own
packages left out), so no index is asked for anything: the install runs with --no-index."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("sessionlog", "__editable__")


def run(*args: str | Path, cwd: Path | None = None, timeout: float = 120) -> str:
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"},
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def fresh_copy(target: Path) -> Path:
    """The checkout's files as a clone would have them (tracked or new, not ignored)."""
    listed = run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def squatted_client(folder: Path) -> Path:
    """A wheel named like our client, same version, that someone else could upload to an index."""
    folder.mkdir()
    wheel = folder / "sessionlog_client-0.1.0-py3-none-any.whl"
    info = "sessionlog_client-0.1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("sessionlog_client/__init__.py", "SQUATTED = True\n")
        z.writestr(
            f"{info}/METADATA", "Metadata-Version: 2.1\nName: sessionlog-client\nVersion: 0.1.0\n"
        )
        z.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        z.writestr(f"{info}/RECORD", "")
    return folder


def third_party_only(folder: Path) -> Path:
    """Links to everything in this venv's site-packages but our own packages and pip."""
    folder.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        name = entry.name.lower()
        if name.startswith(OURS) or name.startswith("pip") or name.endswith(".pth"):
            continue
        (folder / entry.name).symlink_to(entry)
    return folder


# About 45 s on an idle machine (make dist, a venv with pip, one install); room for a busy one.
@pytest.mark.timeout(400)
def test_dist_wheels_install_into_a_fresh_venv_without_an_index(tmp_path: Path) -> None:
    checkout = fresh_copy(tmp_path / "checkout")
    run("make", "--no-print-directory", "dist", f"VENV={sys.prefix}", cwd=checkout, timeout=180)
    dist = checkout / "dist"
    wheels = sorted(dist.glob("*.whl"))
    assert [w.name for w in wheels] == [
        "sessionlog_client-0.1.0-py3-none-any.whl",
        "sessionlog_server-0.1.0-py3-none-any.whl",
    ]
    for wheel in wheels:
        names = zipfile.ZipFile(wheel).namelist()
        assert any(n.endswith("/LICENSE") and ".dist-info/" in n for n in names), wheel.name
    with tarfile.open(dist / "sessionlog-client-0.1.0.tgz") as tgz:
        members = set(tgz.getnames())
        package = tgz.extractfile("package/package.json")
        assert package is not None
        assert json.load(package)["name"] == "sessionlog-client"
    assert {"package/LICENSE", "package/proto/sessionlog/v1/event.proto"} <= members

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    deps = third_party_only(tmp_path / "deps")
    (Path(site) / "zz_third_party.pth").write_text(f"{deps}\n")

    squat = squatted_client(tmp_path / "squat")
    report = tmp_path / "report.json"
    pip_install: list[str | Path] = [
        venv / "bin" / "pip",
        "install",
        "-q",
        "--no-index",
        "--find-links",
        squat,
    ]
    run(*pip_install, "--report", report, *wheels)
    installed = {
        item["metadata"]["name"]: item["download_info"]["url"]
        for item in json.loads(report.read_text())["install"]
    }
    assert installed == {
        "sessionlog-client": wheels[0].as_uri(),
        "sessionlog-server": wheels[1].as_uri(),
    }

    assert "serve" in run(venv / "bin" / "sessionlog", "--help")
    where = run(
        python,
        "-c",
        "import sessionlog, sessionlog_client; from sessionlog_client import Client, AsyncClient;"
        " print(sessionlog.__file__); print(sessionlog_client.__file__);"
        " print(hasattr(sessionlog_client, 'SQUATTED'))",
    ).split()
    assert where[:2] == [
        f"{site}/sessionlog/__init__.py",
        f"{site}/sessionlog_client/__init__.py",
    ]
    assert where[2] == "False"
