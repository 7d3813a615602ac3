"""The project's own invariants: generated code matches proto/, and the protos pass buf lint."""

from __future__ import annotations

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


def test_readme_settings_table_is_current() -> None:
    """The README's configuration table is what `make docs` generates from the settings."""
    from sessionlog.config import readme_with_table

    readme = (ROOT / "README.md").read_text()
    assert readme_with_table(readme) == readme, "README settings table is stale: run make docs"
