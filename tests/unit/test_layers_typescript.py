"""The Node client's modules (client/typescript/src/*.ts) import downward only, down the layers
of ``TS_LAYERS`` (adapters -> client -> streams -> values -> errors -> types), with no import
circle (issue 30: index.ts and append-stream.ts used to import each other). Imports are read
from the source text: every ``import``/``export ... from "./x.js"``, ``import type`` ones too (a
circle erased at run time is still a circle), and ``import("./x.js")``."""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.test_layers import circles, upward_imports

SOURCE = Path(__file__).resolve().parents[2] / "client" / "typescript" / "src"
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"

TS_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("adapters", ("claude-agent-sdk", "langgraph", "openai-agents")),
    ("client", ("index",)),
    ("streams", ("append-stream",)),
    ("values", ("values",)),
    ("errors", ("errors",)),
    ("types", ("types", "proto")),
)
"""Top to bottom: a module imports its own layer's and the layers' below, never one above."""

# `import x from "./a.js"`, `import type { A } from "./a.js"`, `export { a } from "./a.js"`,
# `export * from "./a.js"`, `import "./a.js"`: the statement may span lines (no ';' inside);
# and `import("./a.js")`.
_STATIC = re.compile(
    r'^\s*(?:import|export)\b[^;]*?\bfrom\s*["\']\./([\w.-]+?)\.js["\']'
    r'|^\s*import\s*["\']\./([\w.-]+?)\.js["\']',
    re.MULTILINE | re.DOTALL,
)
_DYNAMIC = re.compile(r'\bimport\(\s*["\']\./([\w.-]+?)\.js["\']\s*\)')


def imports_of(text: str) -> set[str]:
    """The sibling modules (names without .js) a TypeScript source imports or re-exports."""
    found = {a or b for a, b in _STATIC.findall(text)}
    return found | set(_DYNAMIC.findall(text))


def ts_graph(folder: Path = SOURCE) -> dict[str, set[str]]:
    """Every module of ``folder`` (its *.ts, by name without .ts) and the siblings it imports."""
    return {path.stem: imports_of(path.read_text()) for path in sorted(folder.glob("*.ts"))}


GRAPH = ts_graph()


def test_every_typescript_module_has_one_layer() -> None:
    """Rule: every src/*.ts sits in exactly one layer of ``TS_LAYERS``, and every module listed
    exists (a new module is placed before it is used)."""
    listed = [module for _, members in TS_LAYERS for module in members]
    assert sorted(listed) == sorted(GRAPH)
    assert len(listed) == len(set(listed))


def test_no_import_circle_between_typescript_modules() -> None:
    """Rule: no src/*.ts imports, directly or through others, a module that imports it."""
    assert circles(GRAPH) == []


def test_no_typescript_import_runs_up_a_layer() -> None:
    """Rule: no src/*.ts imports a module of a higher layer of ``TS_LAYERS``."""
    assert upward_imports(GRAPH, TS_LAYERS) == []


def test_the_reader_sees_every_form_of_import() -> None:
    """The import reader is not blind: one-line, multi-line, type-only, re-export, side-effect
    and dynamic imports of siblings are read; packages and node: modules are not siblings."""
    text = """
import { a } from "./one.js";
import type { B } from './two.js';
import {
  c,
  type D,
} from "./three.js";
export { e } from "./four.js";
export * from "./five.js";
import "./six.js";
const later = await import("./seven.js");
import * as grpc from "@grpc/grpc-js";
import { randomUUID } from "node:crypto";
// a word from "./nothing" is no import
"""
    assert imports_of(text) == {"one", "two", "three", "four", "five", "six", "seven"}
    assert {"errors", "values", "types"} <= GRAPH["append-stream"]
    assert "append-stream" in GRAPH["index"]


def test_a_planted_typescript_circle_is_reported() -> None:
    """The rules are not blind: append-stream.ts importing index.ts again (issue 30's circle)
    is reported as that circle and as an upward import."""
    planted = GRAPH | {"append-stream": GRAPH["append-stream"] | {"index"}}
    assert ["append-stream", "index", "append-stream"] in circles(planted)
    assert ("append-stream", "index") in upward_imports(planted, TS_LAYERS)


def test_the_architecture_page_names_the_typescript_layers() -> None:
    """Rule: docs/architecture.md names each layer of ``TS_LAYERS`` with its modules, top to
    bottom, on one line each of its TypeScript section."""
    page = ARCHITECTURE.read_text()
    section = page.split("\n### The Node client's modules\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ") and "`" in line]
    assert len(lines) == len(TS_LAYERS)
    for line, (name, members) in zip(lines, TS_LAYERS, strict=True):
        assert f"| {name} |" in line
        assert all(f"`{member}.ts`" in line for member in members), line
