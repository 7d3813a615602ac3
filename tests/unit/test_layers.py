"""STYLE: imports point downward, so the pure fold loads without grpc or lmdb."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import {module}
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("grpc", "lmdb"))
print(json.dumps({{"imported": "{module}" in sys.modules, "loaded": loaded}}))
"""


def heavy_modules_after_importing(module: str) -> list[str]:
    """The grpc and lmdb modules a fresh interpreter holds after importing `module`."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(done.stdout)
    assert report["imported"] is True
    loaded: list[str] = report["loaded"]
    return loaded


def test_fold_imports_neither_grpc_nor_lmdb() -> None:
    """A fresh interpreter that imports sessionlog.fold has no grpc or lmdb module loaded."""
    assert heavy_modules_after_importing("sessionlog.fold") == []


def test_probe_sees_grpc_and_lmdb_when_they_are_loaded() -> None:
    """The probe is not blind: importing grpc or lmdb themselves shows up."""
    assert "grpc" in heavy_modules_after_importing("grpc")
    assert "lmdb" in heavy_modules_after_importing("lmdb")
