"""What ChatOpenAI users type works: constructor names, `mypy --strict` on the
constructor calls of the README and the docs, and reading the settings back."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from langgraph_batch import BatchedChatModel
from tests._parse import parse_source

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("short", "long", "value", "attribute"),
    [
        ("model", "model_name", "m", "model_name"),
        ("base_url", "openai_api_base", "vllm://127.0.0.1:8000", "openai_api_base"),
        ("timeout", "request_timeout", 7.5, "request_timeout"),
        ("max_tokens", "max_completion_tokens", 99, "max_tokens"),
        ("stop_sequences", "stop", ["END"], "stop"),
    ],
)
def test_chatopenai_constructor_names(short: str, long: str, value: object, attribute: str) -> None:
    base = {"model": "m"} if "model" not in (short, long) else {}
    a = BatchedChatModel(**{**base, short: value})  # type: ignore[arg-type]
    b = BatchedChatModel(**{**base, long: value})  # type: ignore[arg-type]
    assert getattr(a, attribute) == getattr(b, attribute) == value


def test_short_names_read_back() -> None:
    llm = BatchedChatModel(model="m", base_url="vllm://127.0.0.1:8000", api_key="sk-1", timeout=3.0)
    assert (llm.model, llm.model_name) == ("m", "m")
    assert llm.base_url == llm.openai_api_base == "vllm://127.0.0.1:8000"
    assert llm.timeout == llm.request_timeout == 3.0
    # A str key is held as a SecretStr, under both names, and never printed.
    assert isinstance(llm.openai_api_key, SecretStr)
    assert llm.api_key == llm.openai_api_key == SecretStr("sk-1")
    by_long = BatchedChatModel(model="m", openai_api_key="sk-1")  # type: ignore[call-arg]
    assert by_long.api_key == SecretStr("sk-1")
    assert "sk-1" not in repr(llm)
    assert "sk-1" not in str(llm.model_dump())


def _constructor_calls(markdown: str) -> list[str]:
    """Every `BatchedChatModel(...)` call in a Markdown page's Python blocks, as source."""
    calls: list[str] = []
    for code in re.findall(r"```python\n(.*?)```", markdown, re.S):
        try:
            tree = parse_source(code)
        except SyntaxError:  # top-level await: parse it inside a coroutine
            tree = parse_source(
                "async def _():\n" + "\n".join("    " + ln for ln in code.split("\n"))
            )
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "BatchedChatModel"
            ):
                calls.append(ast.unparse(node))
    return calls


def _doc_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_mypy_strict_accepts_the_doc_constructor_calls(tmp_path: Path) -> None:
    calls = [call for page in _doc_pages() for call in _constructor_calls(page.read_text())]
    assert len(calls) >= 8, calls
    assert _constructor_calls((REPO / "README.md").read_text()), "the README's example"
    names: set[str] = set()
    for call in calls:
        for node in ast.walk(parse_source(call)):
            if isinstance(node, ast.Name) and node.id != "BatchedChatModel":
                names.add(node.id)
    lines = [
        "from typing import Any",
        "from langgraph_batch import BatchedChatModel",
        *(f"{name}: Any" for name in sorted(names)),
        *(f"llm{i} = {call}" for i, call in enumerate(calls)),
        # What ChatOpenAI users type, spelled out (a str key included).
        'typed = BatchedChatModel(model="m", base_url="vllm://h:8000", api_key="sk",'
        " timeout=5.0, max_tokens=64, temperature=0.0, max_retries=3)",
        "name: str = typed.model_name",
    ]
    source = tmp_path / "doc_calls.py"
    source.write_text("\n".join(lines) + "\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr + source.read_text()


def test_dumps_and_loads_keep_settings_and_never_write_the_key() -> None:
    from langchain_core.load import dumps, loads

    llm = BatchedChatModel(
        model="m",
        base_url="vllm://127.0.0.1:8000",
        api_key="sk-secret",
        max_tokens=5,
        timeout=3.0,
        extra_body={"top_k": 3},
        default_headers={"X-Tenant": "hdr-secret"},
    )
    assert BatchedChatModel.is_lc_serializable()
    text = dumps(llm)
    assert "sk-secret" not in text
    assert "hdr-secret" not in text  # headers may carry credentials: not written
    assert '"LGB_API_KEY"' in text
    with pytest.warns(Warning, match="beta"):  # langchain-core marks loads as beta
        back = loads(
            text,
            valid_namespaces=["langgraph_batch"],
            secrets_map={"LGB_API_KEY": "sk-secret"},
            allowed_objects=[BatchedChatModel],
        )
    assert isinstance(back, BatchedChatModel)
    assert (back.model, back.base_url, back.max_tokens, back.timeout, back.extra_body) == (
        "m",
        "vllm://127.0.0.1:8000",
        5,
        3.0,
        {"top_k": 3},
    )
    assert back.api_key == SecretStr("sk-secret")
    assert back.default_headers is None


async def test_a_backend_that_cannot_count_gives_the_estimate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from tests.fakes.backends import InstantBackend

    llm = BatchedChatModel(model="m", backend=InstantBackend())
    with caplog.at_level("WARNING", logger="langgraph_batch.chat_model"):
        assert await llm.aget_num_tokens("abcdefgh") == 2
        assert await llm.aget_num_tokens("abcd") == 1
    (record,) = [r for r in caplog.records if "get_num_tokens" in r.getMessage()]
    assert "InstantBackend cannot ask its server" in record.getMessage()
