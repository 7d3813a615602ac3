"""The project's own invariants: generated code matches proto/, and the protos pass buf lint."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "server" / "sessionlog" / "v1"


def _bin(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    assert found, f"{name} is not installed next to {sys.executable}; install the dev extras"
    return found


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    """server/sessionlog/v1 is exactly what `make gen` makes of proto/ (nothing stale or extra)."""
    protos = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "proto").rglob("*.proto"))
    services = [p for p in protos if p.endswith("_service.proto")]
    run = [sys.executable, "-m", "grpc_tools.protoc", "-Iproto"]
    subprocess.run(
        [*run, f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", *protos], cwd=ROOT, check=True
    )
    subprocess.run([*run, f"--grpc_python_out={tmp_path}", *services], cwd=ROOT, check=True)
    fresh = {p.name: p.read_bytes() for p in (tmp_path / "sessionlog" / "v1").iterdir()}
    committed = {p.name: p.read_bytes() for p in GENERATED.glob("*_pb2*.py*")}
    assert sorted(committed) == sorted(fresh), "generated files differ from proto/: run make gen"
    stale = [name for name, body in fresh.items() if committed[name] != body]
    assert not stale, f"stale generated code {stale}: run make gen"


@pytest.mark.parametrize("command", [["lint"], ["format", "--diff", "--exit-code"]])
def test_buf_is_clean(command: list[str]) -> None:
    """buf lint (STANDARD + COMMENTS) and buf format find nothing to say about proto/."""
    result = subprocess.run([_bin("buf"), *command], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_docs_settings_table_is_current() -> None:
    """The configuration page's settings table is what `make gen-docs` generates from the
    settings."""
    from sessionlog.config import page_with_table

    page = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    assert page_with_table(page) == page, "the settings table is stale: run make gen-docs"


def test_client_generated_code_and_errors_copy_are_up_to_date() -> None:
    """client/python's v1/ and errors.py are exactly what `make gen` makes (via gen.py)."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "client" / "python" / "gen.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_go_stubs_name_every_rpc_message_and_field_of_proto() -> None:
    """client/go's generated Go names every RPC, message and field of proto/ (make gen-go ran)."""
    go = ROOT / "client" / "go" / "sessionlog" / "v1"
    for proto in sorted((ROOT / "proto" / "sessionlog" / "v1").glob("*.proto")):
        text = proto.read_text()
        generated = (go / f"{proto.stem}.pb.go").read_text()
        for name in re.findall(r"^(?:message|enum) (\w+)", text, flags=re.MULTILINE):
            assert f"\ntype {name} " in generated, f"{name} of {proto.name} missing: make gen-go"
        fields = re.findall(
            r"^\s+(?:optional |repeated )?[\w.<>, ]+ ([a-z][a-z0-9_]*) = \d+;", text, re.MULTILINE
        )
        for field in fields:
            assert f"name={field}," in generated, f"field {field} of {proto.name}: make gen-go"
        service = re.search(r"^service (\w+)", text, flags=re.MULTILINE)
        if service:
            stubs = (go / f"{proto.stem}_grpc.pb.go").read_text()
            for rpc in re.findall(r"^\s+rpc (\w+)\(", text, flags=re.MULTILINE):
                method = f'"/sessionlog.v1.{service.group(1)}/{rpc}"'
                assert method in stubs, f"{method} missing from the Go stubs: make gen-go"


def _make_target(name: str) -> str:
    """The recipe line(s) and prerequisites of one Makefile target, as written."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{name}:(.*?)(?=^\S|\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"no {name} target in the Makefile"
    return match.group(1)


def test_ci_runs_make_check_which_runs_every_gate() -> None:
    """CI runs `make check`: format, lint, mypy, buf lint and format, fresh generated code, the
    docs site built strictly, and the tests (`make test`), not the tests alone."""
    commands = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert commands[-1] == "make check"
    assert "make test" not in commands
    assert _make_target("check").split() == ["lint", "gen-check", "docs", "test"]
    lint = _make_target("lint")
    for gate in ("ruff format --check", "ruff check", "mypy", "buf lint", "buf format --diff"):
        assert gate in lint, gate


def test_make_docs_builds_strictly_and_test_fast_runs_unit_and_integration() -> None:
    """`make docs` is `mkdocs build --strict` after the settings table is rewritten, with mkdocs'
    link and anchor validation turned into warnings (so errors under --strict); `make
    test-fast` runs tests/unit and tests/integration and nothing else."""
    docs = _make_target("docs")
    assert docs.split("\n")[0].split() == ["gen-docs"]
    assert "mkdocs build --strict" in docs
    assert "--quiet" not in docs  # mkdocs --quiet hides the warnings --strict would fail on
    assert "--write-table $(SETTINGS_PAGE)" in _make_target("gen-docs")
    assert "--check-table $(SETTINGS_PAGE)" in _make_target("gen-check")
    config = (ROOT / "mkdocs.yml").read_text()
    for option in ("not_found: warn", "anchors: warn", "omitted_files: warn"):
        assert option in config, option
    assert 'base_path: ["."]' in config  # snippets include files from the repository root
    fast = _make_target("test-fast")
    assert "pytest tests/unit tests/integration" in fast
    assert "apt-get" not in fast
    assert "tests/e2e" not in fast
