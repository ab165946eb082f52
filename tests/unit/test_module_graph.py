"""The package's shape: no import cycles, modules of a readable size, the bench on top.

Read statically (`ast`): every `import` of a `langgraph_batch` module, at
module level or inside a function (a lazy import still ties two modules
together), except under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

import ast
from pathlib import Path

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


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
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


def test_the_graph_reader_sees_imports() -> None:
    graph = _graph()
    assert "langgraph_batch.scheduler" in graph["langgraph_batch.chat_model"]
    assert "langgraph_batch.tools._middleware" in graph["langgraph_batch.tools"]  # lazy import
    assert _cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_the_demo_and_the_bench_are_applications_on_top_of_the_library() -> None:
    # `langgraph_batch.bench` (the benchmark harness and the demo built from its
    # workload and contenders) uses the library; the library never imports it,
    # except the CLI, lazily, to run `bench` and `demo`. Nothing in the package
    # reaches into the source checkout's `benchmarks/` (results and scripts).
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
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] != "benchmarks", name
            elif isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] != "benchmarks" for a in node.names), name
    demo = graph["langgraph_batch.bench.demo"]
    for part in ("contenders.lgb", "contenders.naive", "workloads", "toolservice"):
        assert f"langgraph_batch.bench.{part}" in demo, part  # it reuses the benchmark's parts


def test_modules_stay_readable() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    over = {name: lines for name, lines in sizes.items() if lines > OVERSIZE.get(name, MAX_LINES)}
    assert over == {}, f"over {MAX_LINES} lines (or past their OVERSIZE cap): {over}"
    stale = {
        name: sizes.get(name) for name, cap in OVERSIZE.items() if sizes.get(name, 0) <= MAX_LINES
    }
    assert stale == {}, f"back under {MAX_LINES} lines: drop them from OVERSIZE: {stale}"
