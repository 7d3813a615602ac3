"""The distribution names and versions are the chosen ones everywhere, the server pins the client
built with it, and every package ships the Apache 2.0 text its metadata names."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CLIENT = tomllib.loads((ROOT / "client/python/pyproject.toml").read_text())["project"]
NODE = json.loads((ROOT / "client/typescript/package.json").read_text())


def test_distribution_names() -> None:
    """`sessionlog` on PyPI is someone else's project; these three names were free."""
    assert SERVER["name"] == "sessionlog-server"
    assert CLIENT["name"] == "sessionlog-client"
    assert NODE["name"] == "sessionlog-client"


def test_server_pins_the_client_of_the_same_checkout() -> None:
    pins = [d for d in SERVER["dependencies"] if d.startswith("sessionlog-client")]
    assert pins == [f"sessionlog-client=={CLIENT['version']}"]
    assert SERVER["version"] == CLIENT["version"] == NODE["version"]


def test_every_package_carries_the_apache_license() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert SERVER["license"] == CLIENT["license"] == NODE["license"] == "Apache-2.0"
    # setuptools and npm pack take LICENSE from each package's own folder.
    for copy in ("client/python/LICENSE", "client/typescript/LICENSE"):
        assert (ROOT / copy).read_text() == text, f"{copy} differs from LICENSE"


def test_docs_name_only_the_published_names() -> None:
    """No document tells a reader to install a name that is not ours."""
    docs = [
        ROOT / "README.md",
        *ROOT.glob("docs/**/*.md"),
        *ROOT.glob("client/*/README.md"),
        ROOT / "Dockerfile",
    ]
    for doc in docs:
        text = doc.read_text()
        assert "@sessionlog/client" not in text, doc
        assert "pip install sessionlog\n" not in text, doc
        assert "pip install /path/to/sessionlog-checkout\n" not in text, doc
