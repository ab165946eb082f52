"""Code review over N files: one ReAct sibling per file, structured findings, a reduce step.

    python examples/code_review.py --n 8                       # built-in emulator (EMULATED)
    python examples/code_review.py --n 32 --backend-url vllm://127.0.0.1:8000

The graph: `prepare` (the files) -> `review` (`fan_out` of a `create_agent`
reviewer per file) -> `report` (the reduce: findings by severity, worst files,
failed siblings). Each reviewer gets its file in the prompt and two tools:

- `read_file(path)`: another file of the repository, or a package's interface
  when given a package name; coalesced, so siblings reviewing files of the
  same package that read the same thing share one execution;
- `search_docs(query)`: the team's review guidelines; coalesced.

Both go through `BatchMiddleware` (coalescing + admission); the model is a
`BatchedChatModel`, so every reviewer's LLM calls share one scheduler. The
review is structured (`ProviderStrategy(FileReview)`: `response_format`
json_schema, enforced by vLLM/SGLang structured outputs).

The repository is synthetic and generated from the path (no I/O): each module
carries a few classic defects for a real model to find. Task texts carry a
`key=<package>` tag; the emulator derives its tool arguments from that tag, so
under the emulator the siblings of one package request identical tool calls.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import operator
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Literal

from langchain.agents import create_agent
from langchain.agents.structured_output import ProviderStrategy
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from pydantic import BaseModel, Field
from typing_extensions import TypedDict  # not typing's: see _common.py

if __package__ in (None, ""):  # run as a script: make `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples import _common
from langgraph_batch.nodes.fan_out import SiblingError, fan_out
from langgraph_batch.tools import BatchMiddleware, coalesce, reset_tool_stats, tool_stats

PACKAGES = ("billing", "auth", "search", "storage", "notify", "export", "ingest", "report")

# ---------------------------------------------------------------------------------------
# The synthetic repository (pure functions of the path)
# ---------------------------------------------------------------------------------------

_DEFECTS = (
    "def load_or_none(store, key):\n"
    "    try:\n"
    "        return store.load(key)\n"
    "    except:\n"
    "        return None\n",
    "def add_item(item, bucket=[]):\n    bucket.append(item)\n    return bucket\n",
    "def find_user(db, name):\n"
    '    return db.execute("SELECT * FROM users WHERE name = \'" + name + "\'")\n',
    "def read_config(path):\n    return open(path).read()\n",
    "def total(values):\n    t = 0\n    for i in range(len(values) - 1):\n"
    "        t += values[i]\n    return t\n",
    "import pickle\n\n\ndef restore(blob):\n    return pickle.loads(blob)\n",
)


def module_path(index: int, groups: int) -> str:
    """The path of the `index`-th file to review, its package chosen round-robin."""
    package = PACKAGES[index % groups]
    return f"{package}/module_{index // groups}.py"


def file_content(path: str) -> str:
    """The synthetic source of `path` (deterministic)."""
    digest = int(hashlib.sha256(path.encode()).hexdigest(), 16)
    package = path.split("/", 1)[0]
    picks = [_DEFECTS[(digest >> (8 * k)) % len(_DEFECTS)] for k in range(2)]
    body = "\n\n".join(dict.fromkeys(picks))
    return (
        f'"""{path}: part of the {package} service."""\n\n'
        f"from {package} import api\n\n\n{body}\n\n"
        f"def handle(request):\n    return api.respond(request, {digest % 997})\n"
    )


def package_interface(package: str) -> str:
    """What `read_file("<package>")` returns: the package's public API."""
    return (
        f"# {package}/__init__.py (public interface)\n"
        f"from {package}.api import respond  # respond(request, code) -> Response\n"
        f"# Modules: {package}/module_<k>.py; all handlers must validate input and\n"
        f"# never swallow exceptions (see the guideline 'errors').\n"
    )


_GUIDELINES = {
    "errors": "Never use a bare `except:`; catch specific exceptions and log them.",
    "defaults": "Never use mutable default arguments; use None and create inside.",
    "sql": "Never build SQL by string concatenation; use parameterised queries.",
    "files": "Open files with `with open(...)` so they are always closed.",
    "pickle": "Never unpickle untrusted data; use JSON.",
    "loops": "Iterate over values directly; off-by-one range() bounds are a common bug.",
    "tests": "Every handler needs a unit test for the error path.",
}


@tool
async def read_file(path: str) -> str:
    """Read a file of the repository (`pkg/module_k.py`), or a package's interface (`pkg`)."""
    path = path.strip().strip("/")
    if path in PACKAGES:
        return package_interface(path)
    package = path.split("/", 1)[0]
    if package in PACKAGES and path.endswith(".py"):
        return file_content(path)
    return f"No such file: {path!r}. Packages: {', '.join(PACKAGES)}."


@tool
async def search_docs(query: str) -> str:
    """Search the team's code review guidelines."""
    await asyncio.sleep(0.05)  # a docs service over the network, roughly
    words = {w.lower().strip(".,`'\"") for w in query.split()}
    hits = [f"[{k}] {v}" for k, v in _GUIDELINES.items() if k in words or words & set(v.split())]
    return "\n".join(hits[:3] or [f"[{k}] {v}" for k, v in list(_GUIDELINES.items())[:2]])


TOOLS = [coalesce(read_file), coalesce(search_docs)]

# ---------------------------------------------------------------------------------------
# Structured findings and the graph
# ---------------------------------------------------------------------------------------


class Finding(BaseModel):
    """One problem in the file."""

    line: int = Field(description="1-based line number")
    severity: Literal["low", "medium", "high"]
    message: str = Field(description="what is wrong and how to fix it")


class FileReview(BaseModel):
    """The review of one file."""

    summary: str = Field(description="one sentence")
    findings: list[Finding]


class ReviewState(TypedDict, total=False):
    n: int
    """How many files to review when `files` is not given (default 8)."""
    groups: int
    """How many packages the files are spread over (default n // 2, at most 8)."""
    files: list[dict[str, str]]
    reviews: list[Any]
    report: dict[str, Any]
    log: Annotated[list[str], operator.add]


SYSTEM_PROMPT = (
    "You are a senior Python reviewer. Review the file you are given. Use read_file to look "
    "at the package interface or other files when it helps, and search_docs for the team's "
    "guidelines. Then answer with the findings: line, severity, message."
)


def task_text(file: dict[str, str]) -> str:
    """The reviewer's task for one file (carries the `key=<package>` tag)."""
    return (
        f"Review {file['path']} of the {file['package']} package. key={file['package']}\n\n"
        f"```python\n{file['content']}```"
    )


def review_result(final: dict[str, Any]) -> dict[str, Any]:
    """A finished reviewer's structured answer, as plain JSON."""
    answer = final.get("structured_response")
    if isinstance(answer, BaseModel):
        return answer.model_dump()
    if isinstance(answer, dict):
        return FileReview.model_validate(answer).model_dump()
    raise ValueError("the reviewer ended without a structured response")


def make_report(files: list[dict[str, str]], reviews: list[Any]) -> dict[str, Any]:
    """The reduce step: findings by severity, the worst files, failed siblings."""
    severities: Counter[str] = Counter()
    per_file = []
    failed = []
    for file, review in zip(files, reviews, strict=True):
        if isinstance(review, SiblingError) or not isinstance(review, dict):
            failed.append({"path": file["path"], "error": str(review)})
            continue
        counts = Counter(f["severity"] for f in review["findings"])
        severities.update(counts)
        per_file.append(
            {
                "path": file["path"],
                "high": counts.get("high", 0),
                "findings": len(review["findings"]),
                "summary": review["summary"],
            }
        )
    per_file.sort(key=lambda r: (-r["high"], -r["findings"], r["path"]))
    return {
        "files": len(files),
        "reviewed": len(per_file),
        "failed": failed,
        "findings": sum(severities.values()),
        "by_severity": {s: severities.get(s, 0) for s in ("high", "medium", "low")},
        "worst": per_file[:5],
    }


def build_graph() -> CompiledStateGraph[Any, Any, Any, Any]:
    """The code review graph, for the backend in `_common.settings()`."""
    reviewer = create_agent(
        _common.chat_model(max_tokens=512, temperature=0.0),
        TOOLS,
        system_prompt=SYSTEM_PROMPT,
        middleware=[BatchMiddleware()],
        response_format=ProviderStrategy(FileReview),
        name="reviewer",
    )

    async def prepare(state: ReviewState) -> dict[str, Any]:
        await _common.ensure_backend()
        if state.get("files"):
            return {"files": state["files"]}
        n = int(state.get("n") or 8)
        groups = int(state.get("groups") or max(1, min(len(PACKAGES), n // 2)))
        files = []
        for i in range(n):
            path = module_path(i, groups)
            package = path.split("/", 1)[0]
            files.append({"path": path, "package": package, "content": file_content(path)})
        return {"files": files}

    async def report(state: ReviewState) -> dict[str, Any]:
        return {"report": make_report(state["files"], state["reviews"])}

    builder = StateGraph(ReviewState)
    builder.add_node("prepare", prepare)
    builder.add_node(
        "review",
        fan_out(
            reviewer,
            items="files",
            into="reviews",
            scheduler=_common.SCHEDULER,
            make_input=lambda file, _i: {"messages": [HumanMessage(task_text(file))]},
            result=review_result,
        ),
    )
    builder.add_node("report", report)
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "review")
    builder.add_edge("review", "report")
    builder.add_edge("report", END)
    return builder.compile(name="code_review")


# For `langgraph dev` / Studio (langgraph.json). Building it does no I/O unless
# LGB_BACKEND_URL names a server and LGB_MODEL is unset (then /v1/models is asked).
graph = build_graph()


async def amain(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=8, help="files to review")
    parser.add_argument("--groups", type=int, default=None, help="packages (default n // 2)")
    _common.add_backend_args(parser)
    args = parser.parse_args(argv)
    await _common.start(args)

    app = build_graph()
    reset_tool_stats()
    inputs: ReviewState = {"n": args.n}
    if args.groups:
        inputs["groups"] = args.groups
    final, last_event = await _common.run_with_progress(app, inputs, quiet=args.quiet)

    report = final["report"]
    stats = tool_stats()
    failed = len(report["failed"])
    print(f"files: {report['files']} reviewed: {report['reviewed']} failed: {failed}")
    print(f"findings: {report['findings']} by severity: {report['by_severity']}")
    for row in report["worst"]:
        print(f"  {row['path']}: {row['findings']} findings ({row['high']} high) {row['summary']}")
    for row in report["failed"]:
        print(f"  FAILED {row['path']}: {row['error']}")
    print(
        f"tool calls: requested {stats.requested} executed {stats.executed} shared {stats.shared}"
    )
    _common.print_llm_stats(last_event)
    return 0 if report["reviewed"] == report["files"] else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(amain()))
