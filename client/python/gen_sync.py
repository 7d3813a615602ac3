"""The blocking client, generated from the asyncio client (as httpcore's unasync).

``_aio.py`` is the source of the whole of ``_sync.py``: ``render`` rewrites its text from async
to blocking with a small, explicit table (``RULES``: ``async def``, ``await``, ``async for`` /
``with``, ``grpc.aio``, the asyncio names and the ``Async`` class names their blocking twins
replace), then puts back what the blocking file says in its own words: its docstrings (module,
classes, members: the blocking client documents each call in full, the asyncio one points to
it) and the few members ``HAND_WRITTEN`` names (the blocking client's ``channel`` property, and
``shard_map``, a property there and a coroutine in the asyncio client). Then ``ruff`` sorts
the imports, drops the unused ones and formats the file.

Where the two clients truly differ (threads vs the event loop: a stream's silence deadline, its
pause between reconnects, a close from another thread), ``_aio.py`` calls a helper of
``_async_io`` and the rule ``_async_io`` -> ``_sync_io`` calls the blocking twin, so no
generated line needs a hand edit. ``client/python/gen.py`` calls ``rendered``: ``make
gen-client`` writes ``_sync.py``, ``gen.py --check`` (``make gen-check``) fails when it is stale.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tokenize
from io import StringIO
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent / "sessionlog_client"
SOURCE = PACKAGE / "_aio.py"
TARGET = PACKAGE / "_sync.py"
SOURCE_CLASS = "AsyncClient"
TARGET_CLASS = "Client"

# Members of the blocking classes written by hand in _sync.py: (class, member, anchor). Each takes
# the place of the generated member of its name, or follows the generated member ``anchor``.
HAND_WRITTEN = (
    ("Client", "channel", "_open_member"),
    ("Client", "shard_map", "epoch"),
)

# (pattern, replacement), applied in order to the whole source text.
RULES = (
    (r"\basync def\b", "def"),
    (r"\basync (for|with)\b", r"\1"),
    (r"\bawait ", ""),
    (r"^import asyncio$", "import threading\nimport time"),
    (r"\basyncio\.(Event|Lock)\b", r"threading.\1"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\basyncio\.to_thread\(\s*([\w.]+),\s*", r"\1("),
    (r"\bgrpc\.aio\.", "grpc."),
    (r"\b_async_io\b", "_sync_io"),
    (r"\bAsyncGenerator\[([^\]]*), None\]", r"Generator[\1, None, None]"),
    (r"\b_AsyncShardedStream\b", "_ShardedStream"),
    (r"\b_AsyncShards\b", "_Shards"),
    (r"\bAsync(Client|EventStream|SessionsStream|AppendStream|Iterator|Generator)\b", r"\1"),
    (r"\bpick_async\b", "pick"),
    (r"\baclose\b", "close"),
    (r"\b__a(enter|exit|iter|next)__\b", r"__\1__"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
)

# The rules of one method only, applied before ``RULES``: an awaited unary call gives the reply
# and, awaited again, the trailing metadata; a blocking one gives both from ``with_call``.
METHOD_RULES = {
    "_send": (
        (r"\bcall = (getattr\(member\.stubs\[stub\], method\))\(", r"reply, call = \1.with_call("),
        (r"\n *reply = await call\n", "\n"),
    ),
}

# Names no blocking code may hold once the rules ran (outside strings and comments).
ASYNC_NAMES = frozenset({"async", "await", "asyncio"})

HEADER = (
    "# Generated from _aio.py by client/python/gen_sync.py (make gen-client): edit _aio.py, not\n"
    "# this file. Only the docstrings and the members gen_sync.HAND_WRITTEN names are kept from\n"
    "# here when it is generated again.\n"
)


def _unwrap_awaits(text: str) -> str:
    """``(await CALL)`` as ``CALL`` where CALL is a primary (a name, attribute, call, subscript),
    so the parentheses the await needed do not outlive it."""
    start = text.find("(await ")
    while start != -1:
        depth, end = 0, start
        for end in range(start, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        inner = text[start + len("(await ") : end]
        before = text[start - 1] if start else " "
        if before.isalnum() or before in "_)]":  # the parentheses of a call: they stay
            start = text.find("(await ", start + 1)
            continue
        try:
            primary = isinstance(
                ast.parse(inner.strip(), mode="eval").body,
                ast.Call | ast.Attribute | ast.Name | ast.Subscript,
            )
        except SyntaxError:
            primary = False
        if primary:
            text = text[:start] + "await " + inner + text[end + 1 :]
        start = text.find("(await ", start + 1)
    return text


def unasync(text: str) -> str:
    """``text`` (Python source) with ``RULES`` applied."""
    text = _unwrap_awaits(text)
    for pattern, replacement in RULES:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    return text


Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def _members(node: ast.Module | ast.ClassDef) -> dict[str, Definition]:
    return {
        m.name: m
        for m in node.body
        if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }


def _first(node: Definition) -> int:
    """The 0-based index of a definition's first line, its decorators included."""
    return min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1


def _docstring(node: ast.Module | Definition) -> ast.Expr | None:
    first = node.body[0]
    if not isinstance(first, ast.Expr) or not isinstance(first.value, ast.Constant):
        return None
    return first if isinstance(first.value.value, str) else None


def _lines(lines: list[str], node: ast.stmt) -> list[str]:
    return lines[node.lineno - 1 : node.end_lineno]


# An edit of the generated text: lines [start, end) (0-based) become ``lines``.
Edit = tuple[int, int, list[str]]


def _keep_docstring(
    made: ast.Module | Definition, kept: ast.Module | Definition, kept_lines: list[str]
) -> list[Edit]:
    """The edit that puts ``kept``'s docstring (the blocking file's) in place of ``made``'s."""
    doc = _docstring(kept)
    if doc is None:
        return []
    own = _docstring(made)
    if own is not None and own.end_lineno is not None:
        return [(own.lineno - 1, own.end_lineno, _lines(kept_lines, doc))]
    at = made.body[0].lineno - 1
    return [(at, at, _lines(kept_lines, doc))]


def _method_rules(source: str) -> str:
    """``source`` with ``METHOD_RULES`` applied, each to its own method of ``SOURCE_CLASS``."""
    lines = source.splitlines()
    methods = _members(_class(ast.parse(source), SOURCE_CLASS))
    for name, rules in sorted(METHOD_RULES.items(), key=lambda item: -methods[item[0]].lineno):
        node = methods[name]
        method = "\n".join(lines[_first(node) : node.end_lineno])
        for pattern, replacement in rules:
            method, found = re.subn(pattern, replacement, method)
            if found != 1:
                raise ValueError(f"{SOURCE_CLASS}.{name}: {pattern!r} matched {found} times")
        lines[_first(node) : node.end_lineno] = method.splitlines()
    return "\n".join(lines) + "\n"


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    node = _members(tree).get(name)
    if not isinstance(node, ast.ClassDef):
        raise ValueError(f"no class {name}")
    return node


def _check_blocking(text: str) -> None:
    """Raise when a name of ``ASYNC_NAMES`` survived the rules: a rule is missing."""
    for token in tokenize.generate_tokens(StringIO(text).readline):
        if token.type == tokenize.NAME and token.string in ASYNC_NAMES:
            raise ValueError(
                f"line {token.start[0]}: {token.line.strip()!r} is still async; add a rule"
            )


def _edits(made_text: str, target: str) -> list[Edit]:
    """What to put back from ``target`` (the blocking file as it is) into ``made_text``."""
    made, kept = ast.parse(made_text), ast.parse(target)
    kept_lines = target.splitlines()
    edits = _keep_docstring(made, kept, kept_lines)
    module_doc = _docstring(made)
    at = 0 if module_doc is None or module_doc.end_lineno is None else module_doc.end_lineno
    edits.append((at, at, ["", *HEADER.splitlines()]))
    hand = {(cls, name): anchor for cls, name, anchor in HAND_WRITTEN}
    kept_classes = _members(kept)
    for cls_name, cls in _members(made).items():
        twin = kept_classes.get(cls_name)
        if not isinstance(cls, ast.ClassDef) or not isinstance(twin, ast.ClassDef):
            continue
        edits += _keep_docstring(cls, twin, kept_lines)
        made_members, kept_members = _members(cls), _members(twin)
        for name, member in made_members.items():
            if (cls_name, name) in hand:
                continue
            if name in kept_members:
                edits += _keep_docstring(member, kept_members[name], kept_lines)
        for (hand_cls, name), anchor in hand.items():
            if hand_cls != cls_name:
                continue
            if name not in kept_members:
                raise ValueError(f"{TARGET_CLASS}.{name} is hand-written but not in _sync.py")
            node = kept_members[name]
            text = ["", *kept_lines[_first(node) : node.end_lineno]]
            if name in made_members:
                old = made_members[name]
                edits.append((_first(old), old.end_lineno or old.lineno, text[1:]))
            else:
                end = made_members[anchor].end_lineno or 0
                edits.append((end, end, text))
    return edits


def _ruff(args: list[str], text: str, path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(path), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        cwd=path.parent,
    )
    return done.stdout


def format_source(text: str, path: Path) -> str:
    """``text`` with its imports sorted and the unused dropped, as ``ruff format`` writes it
    (the repository's settings)."""
    text = _ruff(["check", "--fix-only", "--select", "I,F401"], text, path)
    return _ruff(["format"], text, path)


def render(source: str, target: str) -> str:
    """``_sync.py``'s text generated from ``source`` (``_aio.py``), with the docstrings and the
    ``HAND_WRITTEN`` members of ``target`` (``_sync.py`` as it is)."""
    made_text = unasync(_method_rules(source))
    lines = made_text.splitlines()
    for start, end, new in sorted(_edits(made_text, target), key=lambda e: e[:2], reverse=True):
        lines[start:end] = new
    text = "\n".join(lines) + "\n"
    _check_blocking(text)
    return format_source(text, TARGET)


def rendered() -> bytes:
    """What ``_sync.py`` must hold, from today's ``_aio.py`` and ``_sync.py``."""
    return render(SOURCE.read_text(), TARGET.read_text()).encode()
