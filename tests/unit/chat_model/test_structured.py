from __future__ import annotations

import json
import uuid
from typing import Any, TypedDict

import pytest
from langchain_core.exceptions import OutputParserException
from langchain_core.messages import AIMessage
from pydantic import BaseModel

from langgraph_batch.backends.base import ChatRequest
from langgraph_batch.chat_model import BatchedChatModel
from tests.fakes.backends import Reply, ScriptedBackend


class Verdict(BaseModel):
    """A judgement."""

    label: str
    confidence: float


class VerdictDict(TypedDict):
    """A judgement."""

    label: str
    confidence: float


ANSWER = {"label": "yes", "confidence": 0.9}


def answer_by_method(request: ChatRequest) -> Reply:
    """JSON text for response_format requests, a tool call when a tool is forced."""
    if "tools" in request.params and isinstance(request.params.get("tool_choice"), dict):
        name = request.params["tool_choice"]["function"]["name"]
        return Reply(tool_calls=[(name, json.dumps(ANSWER))])
    return Reply(content=json.dumps(ANSWER))


def make(script: Any = answer_by_method) -> tuple[BatchedChatModel, ScriptedBackend]:
    backend = ScriptedBackend(script, base_url=f"fake://{uuid.uuid4().hex}")
    return BatchedChatModel(model="m", backend=backend), backend


async def test_json_schema_is_the_default_with_pydantic() -> None:
    llm, backend = make()
    out = await llm.with_structured_output(Verdict).ainvoke("judge")
    assert out == Verdict(label="yes", confidence=0.9)
    rf = backend.requests[0].params["response_format"]
    assert rf["type"] == "json_schema"
    assert rf["json_schema"]["name"] == "Verdict"
    assert set(rf["json_schema"]["schema"]["properties"]) == {"label", "confidence"}
    assert "tools" not in backend.requests[0].params


@pytest.mark.parametrize("schema", [VerdictDict, Verdict.model_json_schema()])
async def test_json_schema_dict_outputs(schema: Any) -> None:
    llm, backend = make()
    out = await llm.with_structured_output(schema, strict=True).ainvoke("judge")
    assert out == ANSWER
    assert backend.requests[0].params["response_format"]["json_schema"]["strict"] is True


@pytest.mark.parametrize("schema", [Verdict, VerdictDict])
async def test_function_calling(schema: Any) -> None:
    llm, backend = make()
    out = await llm.with_structured_output(schema, method="function_calling").ainvoke("judge")
    assert out == (Verdict(**ANSWER) if schema is Verdict else ANSWER)
    params = backend.requests[0].params
    assert params["tool_choice"]["function"]["name"] == schema.__name__
    assert params["parallel_tool_calls"] is False


async def test_json_mode() -> None:
    llm, backend = make()
    out = await llm.with_structured_output(Verdict, method="json_mode").ainvoke("judge")
    assert out == Verdict(**ANSWER)
    assert backend.requests[0].params["response_format"] == {"type": "json_object"}
    assert await llm.with_structured_output(None, method="json_mode").ainvoke("x") == ANSWER


async def test_include_raw_shapes() -> None:
    llm, _ = make()
    out = await llm.with_structured_output(Verdict, include_raw=True).ainvoke("judge")
    assert set(out) == {"raw", "parsed", "parsing_error"}
    assert isinstance(out["raw"], AIMessage)
    assert out["parsed"] == Verdict(**ANSWER)
    assert out["parsing_error"] is None

    bad, _ = make(lambda r: Reply(content="not json {"))
    out = await bad.with_structured_output(Verdict, include_raw=True).ainvoke("judge")
    assert out["parsed"] is None
    assert isinstance(out["parsing_error"], OutputParserException)
    assert out["raw"].content == "not json {"
    with pytest.raises(OutputParserException, match="not valid JSON"):
        await bad.with_structured_output(Verdict).ainvoke("judge")


async def test_json_schema_with_tools_returns_none_when_model_calls_a_tool() -> None:
    def lookup(q: str) -> str:
        """Look something up."""
        return q

    llm, backend = make(lambda r: Reply(tool_calls=[("lookup", '{"q": "x"}')]))
    out = await llm.with_structured_output(Verdict, tools=[lookup], include_raw=True).ainvoke("j")
    assert out["parsed"] is None
    assert out["raw"].tool_calls[0]["name"] == "lookup"
    assert backend.requests[0].params["tools"][0]["function"]["name"] == "lookup"


def test_bad_combinations() -> None:
    llm = BatchedChatModel(model="m")
    with pytest.raises(ValueError, match="json_mode"):
        llm.with_structured_output(Verdict, method="json_mode", strict=True)
    with pytest.raises(ValueError, match="needs a schema"):
        llm.with_structured_output(None)
    with pytest.raises(ValueError, match="Unknown structured output method"):
        llm.with_structured_output(Verdict, method="xml")  # type: ignore[arg-type]


async def test_pydantic_v1_schema() -> None:
    from pydantic.v1 import BaseModel as BaseModelV1

    class OldVerdict(BaseModelV1):
        """A judgement."""

        label: str
        confidence: float

    llm, _ = make()
    out = await llm.with_structured_output(OldVerdict).ainvoke("judge")
    assert out == OldVerdict(label="yes", confidence=0.9)
