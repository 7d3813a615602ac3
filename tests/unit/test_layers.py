"""STYLE: imports point downward only, down the layers of ``LAYERS`` (commands -> client ->
workers -> startup -> composition -> web, service -> settings -> shard, cluster -> listing ->
storage -> the pure core), with no import circle between modules or between packages, so the
pure fold loads without grpc or lmdb. Each rule of the layout is one test below, named in its
docstring."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

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


# -- the import graph, read from the source (ast), every module of the server package ----------

PACKAGE = Path(__file__).resolve().parents[2] / "server" / "sessionlog"
COMPOSITION = "sessionlog.server"
WIRE_WRITERS = {"uint_field", "int_field", "length_delimited", "message_field", "packed_uints"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, ast.Module]:
    """Every hand-written module of the server package (the generated v1/ left out), parsed."""
    return {
        _module_name(path): ast.parse(path.read_text(), str(path))
        for path in sorted(PACKAGE.rglob("*.py"))
        if "v1" not in path.relative_to(PACKAGE).parts
    }


SOURCES = _sources()


def _imports(tree: ast.Module) -> set[str]:
    """Every module a module imports, TYPE_CHECKING and function-local imports included;
    ``from a import b`` counts as importing both ``a`` and ``a.b``."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _in(layer: str, module: str) -> bool:
    return module == layer or module.startswith(layer + ".")


def _offenders(layer: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    """The modules of ``layer`` that import something under one of ``forbidden``."""
    out = {}
    for name, tree in SOURCES.items():
        if _in(layer, name):
            bad = sorted(m for m in _imports(tree) if any(_in(f, m) for f in forbidden))
            if bad:
                out[name] = bad
    return out


# -- the layers: every module's place, and the graph of who imports whom ------------------------

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "commands",
        (
            "sessionlog.cli",
            "sessionlog.transfer",
            "sessionlog.testing",
        ),
    ),
    ("workers", ("sessionlog.workers",)),
    ("startup", ("sessionlog.startup",)),
    ("composition", (COMPOSITION,)),
    ("front ends", ("sessionlog.web", "sessionlog.service")),
    ("settings", ("sessionlog.config",)),
    ("groups", ("sessionlog.shard", "sessionlog.cluster")),
    ("listing", ("sessionlog.listing",)),
    ("storage", ("sessionlog.storage",)),
    (
        "core",
        (
            "sessionlog.fold",
            "sessionlog.records",
            "sessionlog.retention",
            "sessionlog.wire",
            "sessionlog.mirrors",
            "sessionlog.stats",
            "sessionlog.logs",
            "sessionlog.terminal",
            "sessionlog.errors",
            "sessionlog.defaults",
        ),
    ),
)
"""The layers from top to bottom, each a few packages or top-level modules: a module may import
its own layer's modules and those of the layers below it, never one above (docs/architecture.md,
Layers, draws them)."""

Graph = Mapping[str, set[str]]


def module_graph() -> dict[str, set[str]]:
    """Who imports whom among the server package's modules (the empty root package left out)."""
    known = set(SOURCES) - {"sessionlog"}
    return {
        name: {m for m in _imports(tree) if m in known and m != name}
        for name, tree in SOURCES.items()
        if name in known
    }


def unit_of(module: str) -> str:
    """The package or top-level module a module belongs to: ``sessionlog.storage.store`` is in
    ``sessionlog.storage``, ``sessionlog.fold`` is its own."""
    return ".".join(module.split(".")[:2])


def unit_graph(graph: Graph) -> dict[str, set[str]]:
    """The module graph seen from one floor up: who imports whom among packages and top-level
    modules (the imports inside one package left out)."""
    units: dict[str, set[str]] = {}
    for name, imported in graph.items():
        units.setdefault(unit_of(name), set()).update(
            unit_of(m) for m in imported if unit_of(m) != unit_of(name)
        )
    return units


def circles(graph: Graph) -> list[list[str]]:
    """One circle of imports (``[a, b, ..., a]``) for each group of nodes that reach each other,
    found with Tarjan's strongly connected components; [] when the graph has none."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:  # recursion depth is bounded by the number of modules
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, set())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group: set[str] = set()
            member = ""
            while member != node:
                member = stack.pop()
                group.add(member)
            if len(group) > 1 or node in graph.get(node, set()):
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(_circle_through(min(group), group, graph) for group in groups)


def _circle_through(start: str, group: set[str], graph: Graph) -> list[str]:
    """A shortest circle from ``start`` back to itself inside ``group`` (breadth first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for other in sorted(set(graph.get(node, set())) & group):
                if other == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if other not in came_from:
                    came_from[other] = node
                    following.append(other)
        frontier = following
    raise AssertionError(f"{start} is in no circle of {sorted(group)}")


def layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> int:
    """The layer's position from the top (0) that holds ``module``; -1 when none does."""
    for position, (_, members) in enumerate(layers):
        if any(_in(member, module) for member in members):
            return position
    return -1


def upward_imports(
    graph: Graph, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS
) -> list[tuple[str, str]]:
    """Every (importer, imported) where the imported module sits in a higher layer."""
    return sorted(
        (name, imported)
        for name, imports in graph.items()
        for imported in imports
        if layer_of(imported, layers) < layer_of(name, layers)
    )


GRAPH = module_graph()


def test_every_module_has_one_layer() -> None:
    """Rule: every module of the server package sits in exactly one layer of ``LAYERS`` (a new
    module is placed before it is used), and every name ``LAYERS`` lists exists."""
    placed = [
        (name, [layer for layer, members in LAYERS if any(_in(m, name) for m in members)])
        for name in GRAPH
    ]
    assert [(name, layers) for name, layers in placed if len(layers) != 1] == []
    listed = [member for _, members in LAYERS for member in members]
    assert [member for member in listed if member not in SOURCES] == []
    assert len(listed) == len(set(listed))


def test_no_import_circle_between_modules() -> None:
    """Rule: no module imports, directly or through others, a module that imports it (function-
    local and TYPE_CHECKING imports count: a circle dodged at run time is still a circle)."""
    assert circles(GRAPH) == []


def test_no_import_circle_between_packages() -> None:
    """Rule: no circle between packages and top-level modules either (``config`` importing
    ``cluster/`` while ``cluster/`` imports ``config``, say, through different modules)."""
    assert circles(unit_graph(GRAPH)) == []


def test_no_import_runs_up_a_layer() -> None:
    """Rule: no module imports a module of a higher layer of ``LAYERS``."""
    assert upward_imports(GRAPH) == []


ARCHITECTURE = PACKAGE.parents[1] / "docs" / "architecture.md"


def _drawn_layers(page: str) -> list[tuple[str, str]]:
    """A page's layer diagram (the text block of its Layers section), box by box from the top:
    each box's ``[name]`` and its text."""
    section = page.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    diagram = section.split("```text\n", 1)[1].split("```", 1)[0]
    parts = re.split(r"\[([a-z ]+)\]", diagram)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def _file_of(member: str) -> str:
    """How the diagram names a layer's member: ``service/`` for a package, ``fold.py`` else."""
    relative = member.removeprefix("sessionlog.").replace(".", "/")
    return f"{relative}/" if (PACKAGE / relative).is_dir() else f"{relative}.py"


def _diagram_differences(
    drawn: list[tuple[str, str]], layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS
) -> list[str]:
    """What a drawn diagram gets wrong about ``layers``: boxes missing, extra or out of order,
    and the packages and top-level modules a box does not name; [] when it draws them."""
    if [name for name, _ in drawn] != [name for name, _ in layers]:
        return [f"boxes {[name for name, _ in drawn]} != layers {[name for name, _ in layers]}"]
    return [
        f"[{name}] does not name {_file_of(member)}"
        for (name, text), (_, members) in zip(drawn, layers, strict=True)
        for member in members
        if _file_of(member) not in text
    ]


def test_the_architecture_page_draws_the_declared_layers() -> None:
    """Rule: docs/architecture.md's layer diagram is ``LAYERS``: its boxes are the layers, named
    in the same order, and each box names every package and top-level module of its layer."""
    drawn = _drawn_layers(ARCHITECTURE.read_text())
    assert len(drawn) == len(LAYERS)
    assert _diagram_differences(drawn) == []


def test_the_diagram_check_reports_a_stale_diagram() -> None:
    """The diagram rule is not blind: a box dropped, two boxes swapped, or a module missing from
    its box (the page's own diagram, edited) is reported."""
    page = ARCHITECTURE.read_text()
    drawn = _drawn_layers(page)
    assert _diagram_differences(drawn[1:]) != []
    assert _diagram_differences([drawn[1], drawn[0], *drawn[2:]]) != []
    without_fold = _drawn_layers(page.replace("fold.py", "fold"))
    assert _diagram_differences(without_fold) == ["[core] does not name fold.py"]
    moved = (("commands", ("sessionlog.cli",)), ("core", ("sessionlog.listing",)))
    assert _diagram_differences([("commands", "cli/"), ("core", "fold.py")], moved) == [
        "[core] does not name listing.py"
    ]


def test_the_checker_reports_a_planted_circle() -> None:
    """The circle rules are not blind: a planted circle, a long one and a self-import are each
    reported as the circle they make, and a tree (shared leaves) is none."""
    tree: dict[str, set[str]] = {"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}
    assert circles(tree) == []
    assert circles({**tree, "d": {"a"}}) == [["a", "b", "d", "a"]]
    assert circles({**tree, "c": {"c"}}) == [["c", "c"]]
    long = {"m1": {"m2"}, "m2": {"m3"}, "m3": {"m4"}, "m4": {"m2"}, "x": {"y"}, "y": {"x"}}
    assert circles(long) == [["m2", "m3", "m4", "m2"], ["x", "y", "x"]]
    planted_circle = ["sessionlog.errors", "sessionlog.fold", "sessionlog.errors"]
    assert planted_circle in circles(GRAPH | {"sessionlog.errors": {"sessionlog.fold"}})
    # two packages that import each other through different modules: no module circle, but
    # a circle between the packages
    tie = {"p.a.x": {"p.b.y"}, "p.b.y": set(), "p.b.z": {"p.a.w"}, "p.a.w": set()}
    assert circles(tie) == []
    assert circles(unit_graph(tie)) == [["p.a", "p.b", "p.a"]]
    assert unit_graph({"p.a.x": {"p.a.w", "p.f"}, "p.a.w": {"p.a.x"}}) == {"p.a": {"p.f"}}


def test_the_checker_reports_a_planted_upward_import() -> None:
    """The layer rule is not blind: an import from storage up to the service, or from the fold
    up to storage, is reported by name, and imports within a layer or down are not."""
    layers = (("top", ("p.top",)), ("middle", ("p.mid", "p.side")), ("bottom", ("p.low",)))
    down = {"p.top": {"p.mid", "p.low"}, "p.mid": {"p.side", "p.low"}, "p.side": {"p.mid"}}
    assert upward_imports(down, layers) == []
    assert upward_imports({**down, "p.low.x": {"p.side.y"}}, layers) == [("p.low.x", "p.side.y")]
    store, paging = "sessionlog.storage.store", "sessionlog.service.paging"
    planted = GRAPH | {store: GRAPH[store] | {paging}, "sessionlog.fold": {store}}
    found = set(upward_imports(planted)) - set(upward_imports(GRAPH))
    assert found == {("sessionlog.fold", store), (store, paging)}


def test_the_source_walk_sees_every_layer() -> None:
    """The rules below are not vacuous: the walk finds each layer's modules and their imports."""
    for layer in ("sessionlog.fold", "sessionlog.storage.store", "sessionlog.service.servicer"):
        assert layer in SOURCES
    assert "sessionlog.web.app" in SOURCES
    assert COMPOSITION in SOURCES
    assert "sessionlog.storage.store" in _imports(SOURCES["sessionlog.service.servicer"])


def test_fold_imports_no_grpc_lmdb_storage_or_service() -> None:
    """Rule: the fold is pure, it imports neither grpc, lmdb, storage, service nor web."""
    forbidden = ("grpc", "lmdb", "sessionlog.storage", "sessionlog.service", "sessionlog.web")
    assert _offenders("sessionlog.fold", forbidden) == {}


def test_storage_imports_no_service_web_or_grpc() -> None:
    """Rule: storage owns LMDB and knows nothing above it: no service, web, composition, grpc."""
    forbidden = ("sessionlog.service", "sessionlog.web", COMPOSITION, "grpc")
    assert _offenders("sessionlog.storage", forbidden) == {}


def test_the_store_is_a_facade_on_top_of_storage() -> None:
    """Rule: storage/store.py only composes storage's modules (opening, preparing, fold_cache,
    views, eraser, the writer): it imports no lmdb itself, and no storage module imports it."""
    store = "sessionlog.storage.store"
    parts = ("opening", "preparing", "fold_cache", "views", "eraser", "writer")
    assert {f"sessionlog.storage.{part}" for part in parts} <= _imports(SOURCES[store])
    assert _offenders(store, ("lmdb",)) == {}
    importers = [
        name
        for name, tree in SOURCES.items()
        if _in("sessionlog.storage", name) and store in _imports(tree)
    ]
    assert importers == []


def test_service_imports_no_web_and_no_composition() -> None:
    """Rule: no arrow runs from service/ up to web/ or to the composition module."""
    assert _offenders("sessionlog.service", ("sessionlog.web", COMPOSITION)) == {}


def test_sync_replication_knows_no_transport() -> None:
    """Rule: cluster/sync.py (when a write has enough replicas) knows no transport; the service
    adapts it to gRPC (the whole of cluster/ reaches no service or web module: see below)."""
    assert "sessionlog.cluster.sync" in SOURCES
    assert _offenders("sessionlog.cluster.sync", ("grpc",)) == {}


def test_web_imports_no_composition() -> None:
    """Rule: the console reads a running server through its protocol, never the composition."""
    assert _offenders("sessionlog.web", (COMPOSITION,)) == {}


def test_only_the_composition_module_imports_both_service_and_web() -> None:
    """Rule: the one module that wires service/ and web/ together is ``sessionlog.server``."""
    both = [
        name
        for name, tree in SOURCES.items()
        if not _in("sessionlog.service", name)
        and not _in("sessionlog.web", name)
        and any(_in("sessionlog.service", m) for m in _imports(tree))
        and any(_in("sessionlog.web", m) for m in _imports(tree))
    ]
    assert both == [COMPOSITION]


def test_only_the_entry_points_import_the_composition_module() -> None:
    """Rule: nothing below the composition imports it; the CLI, ``testing`` and the workers
    (the supervisor and its worker processes) start servers."""
    importers = sorted(n for n, tree in SOURCES.items() if COMPOSITION in _imports(tree))
    assert importers == [
        "sessionlog.cli.serve",
        "sessionlog.startup",
        "sessionlog.testing",
        "sessionlog.workers.supervisor",
        "sessionlog.workers.worker",
    ]


def cli_importers(graph: Graph) -> list[str]:
    """The modules outside cli/ that import a module of it."""
    return sorted(
        name
        for name, imported in graph.items()
        if not _in("sessionlog.cli", name) and any(_in("sessionlog.cli", m) for m in imported)
    )


def test_nothing_imports_the_cli() -> None:
    """Rule: the CLI (cli/) sits on top: no module outside it imports it (the console script and
    ``python -m sessionlog.cli`` start it; ``testing`` runs it as a process, by name). The rule
    is not blind: a planted import of a CLI module from the composition is reported."""
    assert "sessionlog.cli.admin_offline" in GRAPH
    assert cli_importers(GRAPH) == []
    planted = GRAPH | {COMPOSITION: GRAPH[COMPOSITION] | {"sessionlog.cli.client"}}
    assert cli_importers(planted) == [COMPOSITION]


def test_folder_tools_and_server_calls_are_apart() -> None:
    """Rule: as etcdutl and etcdctl, the admin folder tools (cli/admin_offline.py, LMDB opened
    directly) import no server call nor AdminService stub, and the server calls
    (cli/admin_online.py, gRPC) import no lmdb (a saved snapshot is checked by a folder tool)."""
    offline, online = "sessionlog.cli.admin_offline", "sessionlog.cli.admin_online"
    assert _offenders(offline, (online, "sessionlog.v1.admin_service_pb2_grpc")) == {}
    assert _offenders(online, ("lmdb", "sessionlog.storage.usage.open_readonly")) == {}
    assert "lmdb" in _imports(SOURCES[offline])
    assert "sessionlog.v1.admin_service_pb2_grpc" in _imports(SOURCES[online])


def test_defaults_is_a_leaf() -> None:
    """Rule: defaults.py (the settings' defaults and ConfigError) imports nothing of sessionlog,
    nor grpc or lmdb, so every layer may take its defaults from it."""
    imported = _imports(SOURCES["sessionlog.defaults"])
    assert sorted(m for m in imported if m.split(".")[0] in ("sessionlog", "grpc", "lmdb")) == []


def test_config_reaches_no_service_storage_or_transport() -> None:
    """Rule: config.py (ServerConfig: the settings, read and checked with the cluster's and the
    shard map's parsers) imports no service, storage, web, composition, grpc or lmdb."""
    forbidden = (
        "sessionlog.service",
        "sessionlog.storage",
        "sessionlog.web",
        COMPOSITION,
        "grpc",
        "lmdb",
    )
    assert _offenders("sessionlog.config", forbidden) == {}


def test_setting_defaults_are_written_only_in_defaults() -> None:
    """Rule: no module but defaults.py assigns a DEFAULT_* that defaults.py declares."""
    declared = {
        target.id
        for node in SOURCES["sessionlog.defaults"].body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name) and target.id.startswith("DEFAULT_")
    }
    assert {"DEFAULT_HEARTBEAT_SECONDS", "DEFAULT_MAX_MESSAGE_BYTES"} <= declared
    again = [
        (name, target.id)
        for name, tree in SOURCES.items()
        if name != "sessionlog.defaults"
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name) and target.id in declared
    ]
    assert again == []


def test_every_server_config_field_is_declared_by_its_setting() -> None:
    """Rule: each ServerConfig field comes from the setting(s) that fill it, and SETTINGS is
    exactly those declarations, in field order (flags, env, TOML and docs share one source)."""
    from sessionlog import config

    declared = [
        setting
        for field in dataclasses.fields(config.ServerConfig)
        for setting in field.metadata["settings"]
    ]
    assert all(field.metadata["settings"] for field in dataclasses.fields(config.ServerConfig))
    assert list(config.SETTINGS) == declared


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    return [n for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)]


def test_commands_module_defines_only_commands() -> None:
    """Rule: storage/commands.py holds the commands the writer applies (each with ``apply``)
    and their inputs and results; no table handles, no public read helpers."""
    tree = SOURCES["sessionlog.storage.commands"]
    classes = [n for n in _top_level(tree) if isinstance(n, ast.ClassDef)]
    commands = [
        c.name
        for c in classes
        if any(isinstance(item, ast.FunctionDef) and item.name == "apply" for item in c.body)
    ]
    assert commands == ["AppendCommand", "ForkCommand", "LeaseCommand"]
    others = {c.name for c in classes} - set(commands)
    assert others == {"AppendBatch", "AppendResult", "ForkResult", "LeaseChange", "Written"}
    public_functions = [
        n.name for n in _top_level(tree) if isinstance(n, ast.FunctionDef) and n.name[0] != "_"
    ]
    assert public_functions == []


def test_storage_needs_no_type_ignores_and_the_writer_no_getattr() -> None:
    """Rule: commands are typed against the transaction they get (no ``type: ignore`` in
    storage/), and the writer tells replicated commands apart without a ``getattr``."""
    for path in sorted((PACKAGE / "storage").glob("*.py")):
        assert "type: ignore" not in path.read_text(), path.name
    calls = [
        node
        for node in ast.walk(SOURCES["sessionlog.storage.writer"])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    ]
    assert calls
    assert [c for c in calls if isinstance(c.func, ast.Name) and c.func.id == "getattr"] == []


def test_service_and_web_never_touch_the_internal_session_id() -> None:
    """Rule: storage's internal ``sid`` stays in storage; the service and console read by id."""
    touching = sorted(
        name
        for name, tree in SOURCES.items()
        if _in("sessionlog.service", name) or _in("sessionlog.web", name)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "sid"
    )
    assert touching == []


def _field_number_argument(node: ast.Call) -> ast.expr | None:
    """The argument a ``wire`` call takes its field number in (None for other calls)."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    position = {**dict.fromkeys(WIRE_WRITERS | {"tag"}, 0), "split_field": 1}.get(name)
    if position is None or len(node.args) <= position:
        return None
    return node.args[position]


def test_no_field_number_is_written_as_a_literal() -> None:
    """Rule: hand encoding (``wire``) takes field numbers from the generated descriptors: no
    call in the server passes a bare number as a field number."""
    literal = sorted(
        (name, node.lineno)
        for name, tree in SOURCES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(argument := _field_number_argument(node), ast.Constant)
        and type(argument.value) is int
    )
    assert literal == []


def test_cluster_imports_no_service_web_or_composition() -> None:
    """Rule: cluster/ (epochs, promotion, rejoin, sync, the election) is used by service/, the
    CLI and the composition: no arrow runs from it up to service/, web/ or the composition."""
    forbidden = ("sessionlog.service", "sessionlog.web", COMPOSITION)
    assert _offenders("sessionlog.cluster", forbidden) == {}


def test_the_election_talks_to_etcd_only() -> None:
    """Rule: the election's modules hand roles and ``may_write`` to the composition; they reach
    no storage (nor grpc or lmdb): what a role change does to the folder is promotion's."""
    forbidden = ("sessionlog.storage", "grpc", "lmdb")
    assert "sessionlog.cluster.election" in SOURCES
    for module in ("election", "etcd", "fence", "members", "settings"):
        assert _offenders(f"sessionlog.cluster.{module}", forbidden) == {}


USE_CASES = "sessionlog.service.usecases"
SERVICER = "sessionlog.service.servicer"


def test_use_cases_know_no_transport_and_no_front_end() -> None:
    """Rule: the use cases (service/usecases.py) and their access checks (service/access.py)
    import no grpc, no aiohttp and no front end above them: not the servicers, the console or
    the composition. Both front ends call down into them."""
    forbidden = (
        "grpc",
        "aiohttp",
        SERVICER,
        "sessionlog.service.admin_service",
        "sessionlog.service.replication",
        "sessionlog.service.app",
        "sessionlog.web",
        COMPOSITION,
    )
    for module in (USE_CASES, "sessionlog.service.access"):
        assert module in SOURCES
        assert _offenders(module, forbidden) == {}
    assert USE_CASES in _imports(SOURCES[SERVICER])
    assert USE_CASES in _imports(SOURCES["sessionlog.web.app"])


def _calls_on(tree: ast.AST, owner: str) -> list[str]:
    """The attributes called or read on ``self.<owner>`` inside ``tree`` (``self.cases.x()``
    gives "x")."""
    return [
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == owner
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "self"
    ]


def _unary_methods() -> dict[str, ast.AsyncFunctionDef]:
    servicer = next(
        node
        for node in SOURCES[SERVICER].body
        if isinstance(node, ast.ClassDef) and node.name == "SessionLogServicer"
    )
    return {
        node.name: node
        for node in servicer.body
        if isinstance(node, ast.AsyncFunctionDef)
        and any(
            isinstance(d, ast.Name) and d.id in ("unary", "unary_write")
            for d in node.decorator_list
        )
    }


def test_each_unary_rpc_is_one_use_case_between_decode_and_encode() -> None:
    """Rule: each unary method of SessionLogServicer calls exactly one use case
    (``self.cases``) and touches no store and no access check itself: what a call does and
    who may do it live in the use cases (GetShardMap, which names no session, calls none;
    DeriveMessages one of two: the whole view, or a page of it)."""
    methods = _unary_methods()
    assert len(methods) == 20
    shape = {
        name: (
            _calls_on(method, "cases"),
            _calls_on(method, "store"),
            [
                n.attr
                for n in ast.walk(method)
                if isinstance(n, ast.Attribute) and n.attr == "scope"
            ],
        )
        for name, method in methods.items()
    }
    cases = {"get_shard_map": [], "derive_messages": ["messages", "messages_page"]}
    wrong = {
        name: calls
        for name, calls in shape.items()
        if (calls[0] != cases[name] if name in cases else len(calls[0]) != 1)
        or calls[1]
        or calls[2]
    }
    assert wrong == {}


def test_the_console_lists_and_checks_through_the_use_cases() -> None:
    """Rule: the web console lists sessions, reads one and checks a caller's access through
    the use cases, never by its own store listing, usage read or prefix check."""
    own = {"list_records", "usage_of", "check_session", "listing_prefix", "local_sessions"}
    tree = SOURCES["sessionlog.web.app"]
    found = sorted(n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in own)
    assert found == []
    called = set(_calls_on(tree, "cases"))
    assert {"list_sessions", "session", "reading", "state", "messages"} <= called
