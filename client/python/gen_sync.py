"""The blocking client's methods, generated from the asyncio client's (as httpcore's unasync).

``_aio.AsyncClient`` is the source of every method of ``_sync.Client`` named in ``METHODS``:
``render`` rewrites each of them from async to blocking (``RULES``: ``async def``, ``await``,
``async for``/``with`` and the asyncio names their blocking twins replace), puts the method's
own docstring back (the blocking client documents each call in full, the asyncio one points to
it), writes it over the method of the same name in ``_sync.py`` and formats the file with ruff.
``client/python/gen.py`` calls it, so ``make gen-client`` writes these methods and
``gen.py --check`` fails when one was edited by hand or its async source changed.

What is still written by hand in ``_sync.py`` differs by more than async/await: the streams
(a watchdog thread and a lock instead of ``asyncio.timeout``), the shard routing (an ``RLock``
and a ``table`` property instead of an ``asyncio.Lock`` and ``load()``), ``Client``'s
docstring, ``_open_member`` (``grpc`` channels, the replication stub), ``channel``,
``shard_map`` and ``replication_status`` (which the asyncio client does not have).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent / "sessionlog_client"
SOURCE = PACKAGE / "_aio.py"
TARGET = PACKAGE / "_sync.py"
SOURCE_CLASS = "AsyncClient"
TARGET_CLASS = "Client"

# Every method of Client generated from AsyncClient's of the same name (``__aenter__`` for
# ``__enter__``: the name rewritten by ``RULES``).
METHODS = (
    "__init__",
    "members",
    "current",
    "epoch",
    "close",
    "__enter__",
    "__exit__",
    "_call",
    "_send",
    "_stream",
    "append",
    "since",
    "follow",
    "follow_sessions",
    "surface",
    "get_state",
    "get_state_with_count",
    "get_usage",
    "derive_messages",
    "last_messages",
    "list_events",
    "last_events",
    "hide",
    "pop_last",
    "clear",
    "chat_messages",
    "create_session",
    "seed_session",
    "get_session",
    "list_sessions",
    "list_lease_audit",
    "update_session",
    "children",
    "fork_session",
    "import_session",
    "acquire_lease",
    "renew_lease",
    "release_lease",
    "delete_session",
    "redact_events",
)

# (pattern, replacement), applied in order to the source text of each method.
RULES = (
    (r"\basync def\b", "def"),
    (r"\basync (for|with)\b", r"\1"),
    (r"\bawait ", ""),
    (r"\b_AsyncShardedStream\b", "_ShardedStream"),
    (r"\b_AsyncShards\b", "_Shards"),
    (r"\bAsync(Client|EventStream|SessionsStream|Iterator|Generator)\b", r"\1"),
    (r"\bpick_async\b", "pick"),
    (r"\basyncio\.sleep\b", "time.sleep"),
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
        text = re.sub(pattern, replacement, text)
    return text


def _methods(tree: ast.Module, name: str) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {
                m.name: m
                for m in node.body
                if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)
            }
    raise ValueError(f"no class {name}")


def _first(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The 0-based index of the method's first line, its decorators included."""
    return min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1


def _docstring(node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.Expr | None:
    first = node.body[0]
    if not isinstance(first, ast.Expr) or not isinstance(first.value, ast.Constant):
        return None
    return first if isinstance(first.value.value, str) else None


def _with_docstring(method: str, docstring: list[str]) -> str:
    """``method`` (one method's source) with its docstring lines replaced by ``docstring``."""
    node = ast.parse(textwrap.dedent(method)).body[0]
    assert isinstance(node, ast.FunctionDef)
    own = _docstring(node)
    if own is None or own.end_lineno is None:
        if docstring:
            raise ValueError(f"{node.name}: the async source has no docstring to replace")
        return method
    lines = method.splitlines()
    return "\n".join(lines[: own.lineno - 1] + docstring + lines[own.end_lineno :])


def format_source(text: str, path: Path) -> str:
    """``text`` as ``ruff format`` (the repository's settings) writes it."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(path), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        cwd=path.parent,
    )
    return done.stdout


def render(source: str, target: str) -> str:
    """``target`` (``_sync.py``'s text), every method in ``METHODS`` generated from ``source``."""
    source_lines = source.splitlines()
    target_lines = target.splitlines()
    made = {unasync(name): node for name, node in _methods(ast.parse(source), SOURCE_CLASS).items()}
    kept = _methods(ast.parse(target), TARGET_CLASS)
    spans = []
    for name in METHODS:
        origin, twin = made[name], kept[name]
        doc = _docstring(twin)
        docstring = [] if doc is None else target_lines[doc.lineno - 1 : doc.end_lineno]
        method = "\n".join(source_lines[_first(origin) : origin.end_lineno])
        for pattern, replacement in METHOD_RULES.get(name, ()):
            method, found = re.subn(pattern, replacement, method)
            if found != 1:
                raise ValueError(f"{SOURCE_CLASS}.{name}: {pattern!r} matched {found} times")
        method = unasync(method)
        method = _with_docstring(method, docstring)
        spans.append((_first(twin), twin.end_lineno or twin.lineno, method.splitlines()))
    for start, end, lines in sorted(spans, reverse=True):
        target_lines[start:end] = lines
    return format_source("\n".join(target_lines) + "\n", TARGET)


def rendered() -> bytes:
    """What ``_sync.py`` must hold, from today's ``_aio.py`` and ``_sync.py``."""
    return render(SOURCE.read_text(), TARGET.read_text()).encode()
