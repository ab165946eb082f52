"""The package's shape: no import cycles, no reaching into another package's privates,
modules of a readable size, the bench on top.

Read statically (`ast`): every `import` of a `langgraph_batch` module, at
module level, inside a function (a lazy import still ties two modules
together) or under `if TYPE_CHECKING:` (a circle the type checker sees is a
circle: the two modules cannot be understood apart), and every module named
by a string to `importlib.import_module` or `sys.modules`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests._parse import parse_source

PACKAGE = Path(__file__).resolve().parents[2] / "langgraph_batch"

MAX_LINES = 600
# Modules over the limit today, with the size they may not grow past; shrink
# a module and lower or drop its entry (the test says when one is back under).
OVERSIZE: dict[str, int] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _named_module(node: ast.AST) -> str | None:
    """The module a call names by string: `import_module("m")`, `sys.modules["m"]` / `.get("m")`."""
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = ast.unparse(node.func)
        if func.endswith("import_module") or func == "sys.modules.get":
            return str(node.args[0].value)
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "sys.modules":
        key = node.slice
        return str(key.value) if isinstance(key, ast.Constant) else None
    return None


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = parse_source(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if (named := _named_module(node)) is not None:
            found.add(named)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([module] if module else [])])
            for alias in node.names:
                sub = f"{module}.{alias.name}"  # `from pkg import submodule`
                found.add(sub if sub in modules else module)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def dfs(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            dfs(node)
    return cycles


def _owner(module: str) -> str | None:
    """The package a private module belongs to (`a.b._c.d` -> `a.b`); None: public."""
    parts = module.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def _reaches_in(importer: str, imported: str) -> bool:
    """`importer` uses a private module of a package it is not inside."""
    owner = _owner(imported)
    if owner is None or owner == "langgraph_batch":  # the top level's privates are everyone's
        return False
    return not (importer == owner or importer.startswith(owner + "."))


def test_the_graph_reader_sees_imports() -> None:
    graph = _graph()
    assert "langgraph_batch.scheduler" in graph["langgraph_batch.chat_model._model"]
    assert "langgraph_batch.chat_model._model" in graph["langgraph_batch.chat_model"]
    assert "langgraph_batch.tools._middleware" in graph["langgraph_batch.tools"]  # lazy import
    # Under `if TYPE_CHECKING:` (tools' __init__ names BatchMiddleware there too).
    source = (PACKAGE / "tools" / "__init__.py").read_text()
    assert "if TYPE_CHECKING:\n    from langgraph_batch.tools._middleware" in source
    assert _cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]
    tree = parse_source(
        'sys.modules.get("x.y")\nimportlib.import_module("x.z")\nsys.modules["x.w"]'
    )
    assert {_named_module(n) for n in ast.walk(tree)} - {None} == {"x.y", "x.z", "x.w"}


def test_no_import_cycles_of_any_kind() -> None:
    # TYPE_CHECKING imports and lazy ones count: no circle at all.
    assert _cycles(_graph()) == []


def test_packages_form_layers() -> None:
    # Importing `pkg.mod` runs `pkg/__init__.py` first: between the top level's
    # modules and subpackages (the units one `import` really loads), no circle
    # either. The top-level package itself runs before everything and is left out.
    def unit(module: str) -> str:
        return ".".join(module.split(".")[:2])

    layers: dict[str, set[str]] = {}
    for importer, deps in _graph().items():
        if importer == "langgraph_batch":
            continue
        layers.setdefault(unit(importer), set()).update(
            unit(d) for d in deps if unit(d) not in (unit(importer), "langgraph_batch")
        )
    for deps in list(layers.values()):
        for dep in deps:
            layers.setdefault(dep, set())
    assert _cycles(layers) == []
    assert "langgraph_batch.scheduler" in layers["langgraph_batch.nodes"]
    assert "langgraph_batch.nodes" not in layers["langgraph_batch.scheduler"]
    # Observation: the seam sits below what feeds it, the Prometheus sink above
    # what it reads (why `metrics` is not inside `_observe`).
    assert "langgraph_batch._observe" in layers["langgraph_batch.scheduler"]
    assert "langgraph_batch.scheduler" not in layers["langgraph_batch._observe"]
    assert "langgraph_batch.scheduler" in layers["langgraph_batch.metrics"]
    assert "langgraph_batch.chat_model" not in layers["langgraph_batch.scheduler"]


def test_the_private_rule_reads_packages() -> None:
    assert _reaches_in("langgraph_batch.nodes._spec", "langgraph_batch.scheduler._capacity")
    assert _reaches_in("langgraph_batch.bench.demo", "langgraph_batch.bench.contenders._common")
    assert not _reaches_in("langgraph_batch.scheduler", "langgraph_batch.scheduler._runner")
    assert not _reaches_in("langgraph_batch.scheduler._runner", "langgraph_batch.scheduler._item")
    assert not _reaches_in("langgraph_batch.nodes.fan_out", "langgraph_batch._context")
    assert not _reaches_in("langgraph_batch.nodes", "langgraph_batch.scheduler.registry")
    # A private package at the top level is everyone's; chat_model's parts are its own.
    assert not _reaches_in("langgraph_batch.scheduler._stats", "langgraph_batch._observe.sinks")
    assert _reaches_in("langgraph_batch.nodes._run", "langgraph_batch.chat_model._request")
    assert not _reaches_in("langgraph_batch.chat_model", "langgraph_batch.chat_model._model")


def test_no_module_reaches_into_another_packages_privates() -> None:
    # A package's private modules (`pkg._x`, `pkg._x.y`) are imported from inside
    # `pkg` only; other packages use what its public modules expose.
    graph = _graph()
    reaching = sorted(
        f"{importer} -> {imported}"
        for importer, deps in graph.items()
        for imported in deps
        if _reaches_in(importer, imported)
    )
    assert reaching == []


def test_the_demo_and_the_bench_are_applications_on_top_of_the_library() -> None:
    # `langgraph_batch.bench` (the benchmark harness and the demo built from its
    # workload and contenders) uses the library; the library never imports it,
    # except the CLI, lazily, to run `bench` and `demo`. Nothing in the package
    # reaches into the repository's `benchmarks/` (the research harness, results).
    modules = _modules()
    demos = [name for name in modules if name.rpartition(".")[2].lstrip("_").startswith("demo")]
    assert demos
    assert all(name.startswith("langgraph_batch.bench.") for name in demos), demos
    graph = _graph()
    importers = {
        name
        for name, deps in graph.items()
        if not name.startswith("langgraph_batch.bench")
        and any(
            d == "langgraph_batch.bench" or d.startswith("langgraph_batch.bench.") for d in deps
        )
    }
    assert importers == {"langgraph_batch.cli"}
    for name, path in modules.items():
        for node in ast.walk(parse_source(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] != "benchmarks", name
            elif isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] != "benchmarks" for a in node.names), name
    demo = graph["langgraph_batch.bench.demo"]
    for part in ("contenders.lgb", "contenders.naive", "workloads", "toolservice"):
        assert f"langgraph_batch.bench.{part}" in demo, part  # it reuses the benchmark's parts


def test_the_research_harness_stays_out_of_the_package() -> None:
    # The bounds, goals, routers and the prior-art contender are `benchmarks/` (a
    # distribution of its own); the wheel's bench only leaves a seam for them.
    bench = {n.rpartition(".")[2] for n in _modules() if n.startswith("langgraph_batch.bench.")}
    assert "extension" in bench
    assert not bench & {"goals", "routers", "ideal", "kv_bound", "batchagent_runner"}, bench


def test_modules_stay_readable() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    over = {name: lines for name, lines in sizes.items() if lines > OVERSIZE.get(name, MAX_LINES)}
    assert over == {}, f"over {MAX_LINES} lines (or past their OVERSIZE cap): {over}"
    stale = {
        name: sizes.get(name) for name, cap in OVERSIZE.items() if sizes.get(name, 0) <= MAX_LINES
    }
    assert stale == {}, f"back under {MAX_LINES} lines: drop them from OVERSIZE: {stale}"
