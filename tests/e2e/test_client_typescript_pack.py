"""The Node client as a user installs it: `npm pack` in client/typescript, `npm install` elsewhere.

The tarball must carry sessionlog's .proto files (prepack copies them in, postpack removes the
copy); the google/protobuf imports come from protobufjs's bundled well-known types. The install
fetches the dependencies from the npm registry, so its timeout is generous but bounded.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from sessionlog.testing import RunningServer
from tests.e2e._proc import clean_env
from tests.e2e.test_client_typescript import PACKAGE, ROOT, installed_and_built, node, npm

# One test process runs every module that runs Node out of client/typescript (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("node-client")


INSTALL_SECONDS = 300
SCRIPT = """\
import { SessionLogClient, DEFAULT_PROTO_DIR } from "sessionlog-client";

const client = new SessionLogClient(process.argv[2]);
await client.append("packed", [
  { type: "user_message", data: { content: "What is LMDB?" } },
  { type: "assistant_message", data: { content: "A memory-mapped B+tree store." } },
]);
const { messages, seqs } = await client.deriveMessages("packed");
console.log(JSON.stringify({ protoDir: DEFAULT_PROTO_DIR, messages, seqs }));
client.close();
"""


@dataclass(frozen=True)
class Installed:
    """The packed tarball and a fresh folder with it installed under node_modules."""

    tarball: Path
    folder: Path


def run_npm(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [npm(), *args, "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=INSTALL_SECONDS,
        check=False,
    )
    assert result.returncode == 0, f"npm {args[0]} failed:\n{result.stdout}\n{result.stderr}"
    return result


def packed_files(tarball: Path, prefix: str) -> dict[str, bytes]:
    """The regular files under ``prefix`` in ``tarball``, by path below it."""
    files: dict[str, bytes] = {}
    with tarfile.open(tarball) as tar:
        for member in tar.getmembers():
            content = tar.extractfile(member) if member.name.startswith(prefix) else None
            if content is not None:
                files[member.name.removeprefix(prefix)] = content.read()
    return files


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """`npm pack` of client/typescript (its prepack compiles src/ to lib/ with the devDependency
    typescript, so node_modules first), installed by `npm install TARBALL` in an empty folder."""
    installed_and_built()
    packs = tmp_path_factory.mktemp("npm-pack")
    packed = run_npm(["pack", "--json", "--pack-destination", str(packs)], PACKAGE)
    tarball = packs / json.loads(packed.stdout)[0]["filename"]
    folder = tmp_path_factory.mktemp("npm-user")
    run_npm(["install", str(tarball)], folder)
    return Installed(tarball=tarball, folder=folder)


@pytest.mark.timeout(2 * INSTALL_SECONDS)
def test_tarball_ships_the_repository_protos(installed: Installed) -> None:
    """The tarball's proto/ is byte-for-byte proto/sessionlog, and pack leaves no copy behind."""
    shipped = packed_files(installed.tarball, "package/proto/")
    repo = {
        str(p.relative_to(ROOT / "proto")): p.read_bytes()
        for p in sorted((ROOT / "proto").rglob("*.proto"))
    }
    assert repo, "no .proto under proto/"
    assert shipped == repo
    assert not (PACKAGE / "proto").exists(), "postpack left client/typescript/proto behind"


@pytest.mark.timeout(2 * INSTALL_SECONDS)
def test_installed_package_appends_and_derives(installed: Installed, server: RunningServer) -> None:
    """A script importing the installed sessionlog-client appends and derives, with its protos."""
    script = installed.folder / "packed.mjs"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [node(), str(script), server.address],
        cwd=installed.folder,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    package = installed.folder / "node_modules" / "sessionlog-client"
    assert Path(reply["protoDir"]) == package / "proto"
    assert reply["messages"] == [
        {"role": "user", "content": "What is LMDB?"},
        {"role": "assistant", "content": "A memory-mapped B+tree store."},
    ]
    assert reply["seqs"] == [0, 1]
