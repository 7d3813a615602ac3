"""The examples of README.md and of every page of the documentation site (docs/, in the order of
mkdocs.yml's nav), run in that order against one real `sessionlog serve`.

A new user follows the README and then the docs top to bottom with `make run` in one terminal
and pastes each example into another. This test does the same, so an example that stops working
(or an expected output that stops being true) fails here. The pages build on each other's
state (the quickstart's session, the grpcurl walkthrough's `api-...` sessions), so they share
the one server, in nav order.

Every fenced block of those files is one of:

- ```sh or ```bash: run by bash (`set -eo pipefail`), ```python: run by this virtualenv's python,
  both from a temporary folder that plays the checkout (so `./sessionlog-data` is the server's
  data folder), with the virtualenv's bin first on PATH (as `source .venv/bin/activate` does);
- ```toml, ```yaml, ```ini or ```text: data (configuration files, diagrams), never run;
- marked on the line just before it with `<!-- readme-test: skip (REASON) -->`: not run
  (installing packages, starting servers of its own, docker, systemd, ...).

A block of any other language, or with none, fails the test until it is marked, so a new
example is either run or knowingly skipped. A runnable block marked `<!-- readme-test: interrupt
(REASON) -->` ends with a command that follows until Ctrl-C: it is sent SIGINT once its expected
output has appeared, and must still be running then. A line `--8<-- "PATH"` in a block is
pymdownx.snippets' include of PATH (from the repository root, as mkdocs.yml sets its base_path):
the test runs the block with that file's text in its place, as the site shows it.

Expected output: a line `# -> TEXT` on its own under a command. Each must appear in the block's
output (stdout and stderr together), in order, ignoring whitespace; `...` in TEXT matches
anything (times, ids).

The server is the one `make run` starts (`sessionlog serve` with its defaults, checked below),
on a free port instead of 50051, plus `--metrics-listen` for the metrics example (the docs show
it as a restart with that flag). Blocks get `127.0.0.1:50051` and `127.0.0.1:9090` rewritten to
the test's addresses, and SESSIONLOG_SERVER for the CLI commands that use the default `--server`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sessionlog.defaults import DEFAULT_DATA_DIR, DEFAULT_LISTEN
from tests.e2e._proc import BIN_DIR, ServerProcess, clean_env, free_port

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MKDOCS = ROOT / "mkdocs.yml"

RUN_LANGUAGES = {"sh": "bash", "bash": "bash", "python": "python"}
DATA_LANGUAGES = {"toml", "yaml", "ini", "text"}
MARKS = {"skip", "interrupt"}

README_LISTEN = "127.0.0.1:50051"
README_METRICS = "127.0.0.1:9090"

# Bounds for a block that hangs. A healthy one takes a few seconds, and the whole walk (the README
# and every page) about 30 s of CPU, most of it starting Python for each CLI call: on a busy 2-core
# machine shared with other builds, over three minutes.
BLOCK_SECONDS = 60.0
RUN_SECONDS = 600

FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>.*)$")
MARK = re.compile(r"^\s*<!--\s*readme-test:\s*(?P<verb>\w+)\s*(?:\((?P<reason>[^)]*)\))?\s*-->\s*$")
SNIPPET = re.compile(r'^\s*--8<--\s+"(?P<path>[^"]+)"\s*$')
NAV_PAGE = re.compile(r"^\s*-\s+(?:[^:\n]+:\s+)?(?P<page>[\w./-]+\.md)\s*$")
EXPECT = re.compile(r"^\s*#\s*->\s?(?P<text>.*)$")
ADDRESS = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}:\d+\b|\blocalhost:\d+\b")


@dataclass
class Block:
    """One fenced block: where it starts, its language, its marker, its text, what it expects."""

    line: int
    language: str
    mark: str | None
    text: str
    expected: list[str] = field(default_factory=list)
    source: str = "README.md"

    @property
    def runs(self) -> bool:
        return self.language in RUN_LANGUAGES and self.mark != "skip"

    def where(self) -> str:
        return f"{self.source} line {self.line} (```{self.language})"


class ReadmeError(AssertionError):
    """The README breaks the rules above (an unmarked block, a stray marker, ...)."""


def parse(text: str, source: str = "README.md") -> list[Block]:
    """Every fenced block of ``text`` (the file ``source``) with its marker; ReadmeError when a
    rule is broken."""
    lines = text.split("\n")
    blocks: list[Block] = []
    pending: tuple[int, str] | None = None
    index = 0
    while index < len(lines):
        number, line = index + 1, lines[index]
        if line.lstrip().startswith("<!--") and "readme-test" in line:
            mark = MARK.match(line)
            if mark is None or mark["verb"] not in MARKS or not (mark["reason"] or "").strip():
                raise ReadmeError(
                    f"{source} line {number}: write a marker as "
                    "<!-- readme-test: skip (why) --> or "
                    f"<!-- readme-test: interrupt (why) -->, got {line.strip()!r}"
                )
            pending = (number, mark["verb"])
            index += 1
            continue
        fence = FENCE.match(line)
        if fence is None:
            if pending is not None:
                raise ReadmeError(
                    f"{source} line {pending[0]}: a readme-test marker must precede a block"
                )
            index += 1
            continue
        indent = len(fence["indent"])
        language = fence["info"].strip().split(" ")[0] if fence["info"].strip() else ""
        body: list[str] = []
        index += 1
        while index < len(lines) and not lines[index].strip().startswith("```"):
            body.append(lines[index][indent:] if lines[index][:indent].isspace() else lines[index])
            index += 1
        if index == len(lines):
            raise ReadmeError(f"{source} line {number}: the block is never closed")
        index += 1
        verb = pending[1] if pending else None
        block = Block(number, language, verb, included("\n".join(body) + "\n"), source=source)
        pending = None
        check(block)
        blocks.append(block)
    if pending is not None:
        raise ReadmeError(f"{source} line {pending[0]}: a readme-test marker must precede a block")
    return blocks


def included(text: str) -> str:
    """``text`` with each snippet line (`--8<-- "PATH"`) replaced by PATH's text, PATH taken
    from the repository root (mkdocs.yml's snippets base_path)."""
    lines = []
    for line in text.splitlines(keepends=True):
        snippet = SNIPPET.match(line)
        if snippet is None:
            lines.append(line)
            continue
        path = ROOT / snippet["path"]
        if not path.is_file():
            raise ReadmeError(f"a snippet names {snippet['path']}, which is not a file")
        body = path.read_text()
        lines.append(body if body.endswith("\n") else body + "\n")
    return "".join(lines)


def nav_pages() -> list[Path]:
    """The pages of mkdocs.yml's nav, in order (each a `- page.md` or `- Title: page.md` line)."""
    pages = []
    in_nav = False
    for line in MKDOCS.read_text().splitlines():
        if not line.startswith((" ", "-")):
            in_nav = line.startswith("nav:")
            continue
        page = NAV_PAGE.match(line) if in_nav else None
        if page is not None:
            pages.append(DOCS / page["page"])
    return pages


def documents() -> list[tuple[str, str]]:
    """README.md, then each nav page: (its path from the repository root, its text)."""
    files = [README, *nav_pages()]
    return [(str(path.relative_to(ROOT)), path.read_text()) for path in files]


def all_blocks() -> list[Block]:
    return [block for source, text in documents() for block in parse(text, source)]


def check(block: Block) -> None:
    """Fill in ``block.expected``; refuse a block that is neither runnable, data nor marked."""
    if block.mark == "skip":
        return
    if block.language in DATA_LANGUAGES:
        if block.mark is not None:
            raise ReadmeError(f"{block.where()}: a data block is never run; drop its marker")
        return
    if block.language not in RUN_LANGUAGES:
        raise ReadmeError(
            f"{block.where()}: the test runs sh, bash and python blocks; mark this one "
            "<!-- readme-test: skip (why) --> or give it one of those languages "
            f"(data: {', '.join(sorted(DATA_LANGUAGES))})"
        )
    for offset, line in enumerate(block.text.splitlines(), start=1):
        expected = EXPECT.match(line)
        if expected is not None:
            block.expected.append(expected["text"].strip())
        elif "# ->" in line:
            raise ReadmeError(
                f"{block.where()}, its line {offset}: put an expected output `# -> ...` on a "
                "line of its own, under the command"
            )
    if block.mark == "interrupt" and not block.expected:
        raise ReadmeError(
            f"{block.where()}: an interrupt block needs an expected output to wait for"
        )


def squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def unmatched(expected: list[str], output: str) -> str | None:
    """The first of ``expected`` not found in ``output`` after the one before it, else None."""
    haystack = squeeze(output)
    position = 0
    for text in expected:
        pattern = ".*?".join(re.escape(squeeze(piece)) for piece in text.split("..."))
        found = re.compile(pattern).search(haystack, position)
        if found is None:
            return text
        position = found.end()
    return None


# -- the rules, on made-up READMEs -----------------------------------------------------------------


def test_an_unmarked_block_of_another_language_fails() -> None:
    """A ```js (or untagged, or ```console) block with no marker is refused, naming its line."""
    for info in ("js", "", "console"):
        text = f"# t\n\n```{info}\nsomething\n```\n"
        with pytest.raises(ReadmeError, match="line 3"):
            parse(text)
    skipped = parse("<!-- readme-test: skip (needs npm) -->\n```js\nx\n```\n")
    assert [(b.language, b.mark, b.runs) for b in skipped] == [("js", "skip", False)]


def test_markers_must_be_well_formed_and_attached() -> None:
    """A marker without a reason, with an unknown verb, or not just before a block is refused."""
    bad = [
        "<!-- readme-test: skip -->\n```sh\nls\n```\n",
        "<!-- readme-test: ignore (x) -->\n```sh\nls\n```\n",
        "<!-- readme-test: skip (x) -->\n\n```sh\nls\n```\n",
        "```sh\nls\n```\n<!-- readme-test: skip (x) -->\n",
        "<!-- readme-test: interrupt (follows) -->\n```sh\ntail -f x\n```\n",
        "<!-- readme-test: interrupt (x) -->\n```toml\na = 1\n```\n",
    ]
    for text in bad:
        with pytest.raises(ReadmeError):
            parse(text)


def test_expected_outputs_are_ordered_and_ignore_whitespace() -> None:
    """`# -> ` lines are collected; they match in order, spacing aside, with `...` as a wildcard."""
    [block] = parse('```sh\necho a\n# -> "x": 1\n#   -> b ... d\n```\n')
    assert block.expected == ['"x": 1', "b ... d"]
    assert unmatched(block.expected, '{\n  "x":  1\n}\nb c\n d') is None
    assert unmatched(block.expected, 'b c d\n{"x": 1}') == "b ... d"
    with pytest.raises(ReadmeError, match="line of its own"):
        parse("```sh\necho a   # -> a\n```\n")


def test_a_snippet_line_runs_the_file_it_names() -> None:
    """A `--8<-- "PATH"` line inside a block stands for PATH's text; a missing PATH is refused."""
    [block] = parse('```python\n--8<-- "pyproject.toml"\n```\n')
    assert block.text == (ROOT / "pyproject.toml").read_text()
    with pytest.raises(ReadmeError, match="not a file"):
        parse('```python\n--8<-- "examples/no-such-file.py"\n```\n')


def test_every_page_is_in_the_nav() -> None:
    """Each page under docs/ is in mkdocs.yml's nav (so its examples run here), and only once."""
    pages = nav_pages()
    assert len(pages) == len(set(pages)), "a page is in the nav twice"
    assert sorted(pages) == sorted(DOCS.rglob("*.md"))


def test_the_readme_follows_the_rules() -> None:
    """Every block of README.md and the docs is runnable, data or marked; the walkthroughs run,
    with outputs."""
    blocks = all_blocks()
    running = [b for b in blocks if b.runs]
    for needle in ("sessionlog.v1", "sessionlog_client", "sessionlog tail", "grpcurl", "buf curl"):
        assert any(needle in b.text for b in running), f"no block running {needle!r} is run"
    assert all(b.expected for b in running), [b.where() for b in running if not b.expected]


# -- the README, run -------------------------------------------------------------------------------


def test_make_run_is_the_server_this_test_starts() -> None:
    """`make run` is `sessionlog serve` with its defaults: 127.0.0.1:50051, ./sessionlog-data."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert [line.strip() for line in recipe.splitlines()[1:]] == ["$(BIN)/sessionlog serve"]
    assert DEFAULT_LISTEN == README_LISTEN
    assert DEFAULT_DATA_DIR == "./sessionlog-data"


def rewrite(block: Block, addresses: dict[str, str]) -> str:
    text = block.text
    for readme, test in addresses.items():
        text = text.replace(readme, test)
    strays = set(ADDRESS.findall(text)) - set(addresses.values())
    assert not strays, f"{block.where()} names {sorted(strays)}, which this test does not serve"
    return text


def command(block: Block, script: Path) -> list[str]:
    if RUN_LANGUAGES[block.language] == "python":
        return [sys.executable, str(script)]
    return ["bash", "-eo", "pipefail", str(script)]


def run_block(block: Block, script: Path, cwd: Path, env: dict[str, str]) -> None:
    """Run one block to its end (or, for an interrupt block, to SIGINT) and check its output."""
    log = script.with_suffix(".log")
    with log.open("wb") as out:
        process = subprocess.Popen(
            command(block, script),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        if block.mark == "interrupt":
            interrupt_when_shown(block, process, log)
        else:
            process.wait(BLOCK_SECONDS)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"{block.where()} still running after {BLOCK_SECONDS:.0f} s:\n"
            f"{log.read_text(errors='replace')}"
        ) from None
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    output = log.read_text(errors="replace")
    shown = f"{block.where()}:\n{script.read_text()}\n--- output:\n{output}"
    if block.mark == "interrupt":
        assert process.returncode in (130, -signal.SIGINT), f"exit {process.returncode}; {shown}"
        assert "Traceback" not in output, shown
    else:
        assert process.returncode == 0, f"exit {process.returncode}; {shown}"
    missing = unmatched(block.expected, output)
    assert missing is None, f"expected output not found: {missing!r}; {shown}"


def interrupt_when_shown(block: Block, process: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until the expected output is there, then Ctrl-C (SIGINT to the block's group)."""
    deadline = time.monotonic() + BLOCK_SECONDS
    while (missing := unmatched(block.expected, log.read_text(errors="replace"))) is not None:
        assert process.poll() is None, (
            f"{block.where()} ended by itself (exit {process.returncode}) before Ctrl-C:\n"
            f"{log.read_text(errors='replace')}"
        )
        assert time.monotonic() < deadline, (
            f"{block.where()}: {missing!r} not shown within {BLOCK_SECONDS:.0f} s:\n"
            f"{log.read_text(errors='replace')}"
        )
        time.sleep(0.05)
    assert process.poll() is None, f"{block.where()} ended by itself before Ctrl-C"
    os.killpg(process.pid, signal.SIGINT)
    process.wait(10)


@pytest.mark.timeout(RUN_SECONDS)
def test_readme_examples_run_in_order_against_one_server(tmp_path: Path) -> None:
    """Each runnable block, in README then nav order, succeeds and prints what its `# ->` lines
    say."""
    blocks = [b for b in all_blocks() if b.runs]
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    listen = f"127.0.0.1:{free_port()}"
    metrics = f"127.0.0.1:{free_port()}"
    addresses = {README_LISTEN: listen, README_METRICS: metrics}
    env = clean_env(
        PATH=f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
        HOME=str(home),
        SESSIONLOG_SERVER=listen,
    )
    with ServerProcess(
        ["--listen", listen, "--metrics-listen", metrics], cwd=checkout, name="readme"
    ) as server:
        server.wait_serving(listen)
        for number, block in enumerate(blocks):
            suffix = ".py" if RUN_LANGUAGES[block.language] == "python" else ".sh"
            page = re.sub(r"\W+", "-", block.source.removesuffix(".md"))
            script = tmp_path / f"block-{number:03d}-{page}-line-{block.line}{suffix}"
            script.write_text(rewrite(block, addresses))
            run_block(block, script, checkout, env)
        assert server.process is not None
        assert server.process.poll() is None, server.log()
