from __future__ import annotations

from typing import TypedDict

import pytest
from pydantic import BaseModel

from langgraph_batch.chat_model._structured import (
    format_tools,
    normalize_tool_choice,
    to_response_format,
)


class Person(BaseModel):
    """A person."""

    name: str
    age: int


class PersonDict(TypedDict):
    """A person."""

    name: str
    age: int


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, None),
        (False, None),
        (True, "required"),
        ("any", "required"),
        ("required", "required"),
        ("auto", "auto"),
        ("none", "none"),
        ("search", {"type": "function", "function": {"name": "search"}}),
        (
            {"type": "function", "function": {"name": "x"}},
            {"type": "function", "function": {"name": "x"}},
        ),
    ],
)
def test_normalize_tool_choice(choice: object, expected: object) -> None:
    assert normalize_tool_choice(choice, ["search"]) == expected  # type: ignore[arg-type]


def test_unknown_tool_choice_names_the_value() -> None:
    with pytest.raises(ValueError, match="'lookup'"):
        normalize_tool_choice("lookup", ["search"])


def test_format_tools_strict() -> None:
    (tool,) = format_tools([Person], strict=True)
    assert tool["function"]["name"] == "Person"
    assert tool["function"]["strict"] is True
    assert tool["function"]["parameters"]["additionalProperties"] is False


@pytest.mark.parametrize("schema", [Person, PersonDict, Person.model_json_schema()])
def test_response_format_from_schemas(schema: object) -> None:
    rf = to_response_format(schema)
    assert rf["type"] == "json_schema"
    js = rf["json_schema"]
    assert js["name"] in {"Person", "PersonDict"}
    assert js["schema"]["properties"].keys() == {"name", "age"}
    assert "strict" not in js


def test_response_format_strict_and_passthrough() -> None:
    rf = to_response_format(Person, strict=True)
    assert rf["json_schema"]["strict"] is True
    ready = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": False},
    }
    assert to_response_format(ready) == ready
    with pytest.raises(ValueError, match="strict"):
        to_response_format(ready, strict=True)
    named = to_response_format({"name": "x", "schema": {"type": "object"}}, strict=True)
    assert named == {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True},
    }
