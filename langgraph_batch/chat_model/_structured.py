"""Tool binding and structured output for `BatchedChatModel`.

The request side (OpenAI tool dicts, `tool_choice`, `response_format`) and
the parsing side (`with_structured_output` runnables) follow
`langchain_openai.ChatOpenAI`, with one difference: `method="json_schema"` is
the default, because vLLM and SGLang enforce `response_format` json_schema
with guided decoding, which local models follow far more reliably than a
forced tool call.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import Any, Literal

from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.output_parsers import (
    JsonOutputKeyToolsParser,
    JsonOutputParser,
    PydanticOutputParser,
    PydanticToolsParser,
)
from langchain_core.outputs import Generation
from langchain_core.runnables import (
    Runnable,
    RunnableLambda,
    RunnableMap,
    RunnablePassthrough,
)
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import (
    convert_to_openai_function,
    convert_to_openai_tool,
)
from langchain_core.utils.pydantic import is_basemodel_subclass

__all__ = (
    "StructuredMethod",
    "format_tools",
    "normalize_tool_choice",
    "structured_output",
    "to_response_format",
)

StructuredMethod = Literal["json_schema", "function_calling", "json_mode"]

ToolLike = Mapping[str, Any] | type | Callable[..., Any] | BaseTool


def _is_pydantic_class(obj: Any) -> bool:
    return isinstance(obj, type) and is_basemodel_subclass(obj)


def format_tools(tools: Sequence[ToolLike], *, strict: bool | None = None) -> list[dict[str, Any]]:
    """OpenAI tool dicts for LangChain tools, functions, pydantic models or dicts."""
    return [convert_to_openai_tool(t, strict=strict) for t in tools]


def normalize_tool_choice(
    tool_choice: Mapping[str, Any] | str | bool | None, tool_names: Sequence[str]
) -> dict[str, Any] | str | None:
    """Map LangChain's `tool_choice` spellings to the wire format.

    Args:
        tool_choice: `"auto"`, `"none"`, `"required"`, `"any"` (-> `"required"`),
            `True` (-> `"required"`), a tool name (-> that function), an OpenAI
            dict (passed through), or `None`/`False` (server default).
        tool_names: The names of the bound tools.

    Returns:
        The `tool_choice` body field, or None to leave it out.

    Raises:
        ValueError: If `tool_choice` names no bound tool and is no known mode.
    """
    if tool_choice is None or tool_choice is False:
        return None
    if tool_choice is True:
        return "required"
    if isinstance(tool_choice, Mapping):
        return dict(tool_choice)
    if isinstance(tool_choice, str):
        if tool_choice in tool_names:
            return {"type": "function", "function": {"name": tool_choice}}
        if tool_choice == "any":
            return "required"
        if tool_choice in {"auto", "none", "required"}:
            return tool_choice
        msg = (
            f"tool_choice={tool_choice!r} is neither a bound tool "
            f"({', '.join(tool_names) or 'none bound'}) nor one of "
            "'auto', 'none', 'required', 'any'."
        )
        raise ValueError(msg)
    msg = f"tool_choice must be a str, bool or dict, got {type(tool_choice).__name__}"
    raise ValueError(msg)


def to_response_format(schema: Any, *, strict: bool | None = None) -> dict[str, Any]:
    """The `response_format` json_schema body field for a schema.

    Args:
        schema: A pydantic class, TypedDict, JSON schema dict, OpenAI function
            dict, `{"name", "schema"}` dict, or a complete
            `{"type": "json_schema", "json_schema": {...}}` response format.
        strict: Sent as `json_schema.strict` (None: from the schema, else False).

    Returns:
        `{"type": "json_schema", "json_schema": {"name", "schema", "strict"?, ...}}`.

    Raises:
        ValueError: If `strict` contradicts a `strict` already in the schema.
    """
    if isinstance(schema, Mapping) and schema.get("type") == "json_schema":
        response_format = dict(schema)
        given = response_format.get("json_schema", {}).get("strict")
        if strict is not None and given is not None and given is not strict:
            msg = (
                f"The response format already sets strict={given}, but strict={strict} "
                "was also passed; set it in one place."
            )
            raise ValueError(msg)
        return response_format
    if isinstance(schema, Mapping) and "name" in schema and "schema" in schema:
        json_schema = dict(schema)
        if strict is not None:
            json_schema["strict"] = strict
        return {"type": "json_schema", "json_schema": json_schema}
    if strict is None and isinstance(schema, Mapping) and isinstance(schema.get("strict"), bool):
        strict = schema["strict"]
    function = convert_to_openai_function(schema, strict=bool(strict))
    function["schema"] = function.pop("parameters")
    if strict is None:
        function.pop("strict", None)
    return {"type": "json_schema", "json_schema": function}


def _message_text(message: BaseMessage) -> str:
    text = message.text
    return text if isinstance(text, str) else str(text)


def _json_schema_parser(schema: Any) -> Callable[[AIMessage], Any]:
    """Parse the JSON text of a json_schema response (None if the model called tools)."""
    pydantic_schema = schema if _is_pydantic_class(schema) else None

    def parse(message: AIMessage) -> Any:
        text = _message_text(message).strip()
        if not text and message.tool_calls:
            return None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            msg = f"The model's structured output is not valid JSON: {text[:200]!r}"
            raise OutputParserException(msg, llm_output=text) from exc
        if pydantic_schema is not None:
            # pydantic.v1 models (still accepted by LangChain) have parse_obj only.
            validate = getattr(pydantic_schema, "model_validate", None)
            return validate(data) if validate else pydantic_schema.parse_obj(data)
        return data

    return parse


class _StreamingJsonSchemaParser(JsonOutputParser):
    """json_schema output for dict / TypedDict / JSON-schema schemas, streamed.

    Partial dicts while the JSON streams in (as ChatOpenAI's
    `JsonOutputParser`), then the strictly parsed whole.

    LangChain's cumulative parsers stop at the last partial parse, so a
    truncated or invalid JSON stream would end on a partial dict, silently;
    here the accumulated message is parsed strictly at the end, which raises
    `OutputParserException` as `invoke` does.
    """

    strict_parse: Callable[[AIMessage], Any]

    def parse_result(self, result: list[Generation], *, partial: bool = False) -> Any:
        message = getattr(result[0], "message", None)
        if not partial:
            if isinstance(message, AIMessage):
                return self.strict_parse(message)
            return super().parse_result(result)
        if isinstance(message, AIMessage) and message.tool_calls and not _message_text(message):
            return None  # the model called a tool instead of answering
        return super().parse_result(result, partial=True)

    def _final(self, chunks: list[Any]) -> Any:
        """The strict parse of the whole stream (an AIMessageChunk sum is an AIMessage)."""
        merged = functools.reduce(operator.add, chunks)
        if isinstance(merged, AIMessage):
            return self.strict_parse(merged)
        text = merged.content if isinstance(merged, BaseMessage) else str(merged)
        return self.strict_parse(AIMessage(text))

    def _transform(self, input: Iterator[str | BaseMessage]) -> Iterator[Any]:
        seen: list[Any] = []

        def tee() -> Iterator[str | BaseMessage]:
            for chunk in input:
                seen.append(chunk)
                yield chunk

        last: Any = _UNSET
        for parsed in super()._transform(tee()):
            last = parsed
            yield parsed
        if seen:
            final = self._final(seen)
            if final != last:
                yield final

    async def _atransform(self, input: AsyncIterator[str | BaseMessage]) -> AsyncIterator[Any]:
        seen: list[Any] = []

        async def tee() -> AsyncIterator[str | BaseMessage]:
            async for chunk in input:
                seen.append(chunk)
                yield chunk

        last: Any = _UNSET
        async for parsed in super()._atransform(tee()):
            last = parsed
            yield parsed
        if seen:
            final = self._final(seen)
            if final != last:
                yield final


_UNSET = object()


def structured_output(
    model: Any,
    schema: Any,
    *,
    method: StructuredMethod = "json_schema",
    include_raw: bool = False,
    strict: bool | None = None,
    tools: Sequence[ToolLike] | None = None,
    **kwargs: Any,
) -> Runnable[LanguageModelInput, Any]:
    """Build the runnable behind `BatchedChatModel.with_structured_output`.

    Args:
        model: The chat model (needs `bind` and `bind_tools`).
        schema: Pydantic class, TypedDict, or JSON schema dict (None only with
            `method="json_mode"`).
        method: `"json_schema"` (response_format, enforced by vLLM/SGLang),
            `"function_calling"` (a forced tool call) or `"json_mode"`
            (`{"type": "json_object"}`; describe the schema in the prompt).
        include_raw: Return `{"raw", "parsed", "parsing_error"}` instead of
            raising on a parse error.
        strict: Passed as the schema's `strict` flag.
        tools: Extra tools the model may call instead of answering
            (`method="json_schema"` only).
        **kwargs: Bound to the model as call parameters.

    Returns:
        A runnable producing the parsed output (a pydantic instance for a
        pydantic schema, else a dict).

    Raises:
        ValueError: On a missing schema, an unknown method, or `strict` with
            `json_mode`.
    """
    if strict is not None and method == "json_mode":
        msg = "strict is not supported with method='json_mode'; use method='json_schema'."
        raise ValueError(msg)
    if schema is None and method != "json_mode":
        msg = f"with_structured_output(method={method!r}) needs a schema; got None."
        raise ValueError(msg)
    is_pydantic = _is_pydantic_class(schema)
    llm: Runnable[LanguageModelInput, BaseMessage]
    parser: Runnable[Any, Any]
    if method == "function_calling":
        tool_name = convert_to_openai_tool(schema)["function"]["name"]
        llm = model.bind_tools(
            [schema],
            tool_choice=tool_name,
            parallel_tool_calls=False,
            strict=strict,
            ls_structured_output_format={
                "kwargs": {"method": method, "strict": strict},
                "schema": schema,
            },
            **kwargs,
        )
        if is_pydantic:
            parser = PydanticToolsParser(tools=[schema], first_tool_only=True)
        else:
            parser = JsonOutputKeyToolsParser(key_name=tool_name, first_tool_only=True)
    elif method == "json_mode":
        llm = model.bind(
            response_format={"type": "json_object"},
            ls_structured_output_format={"kwargs": {"method": method}, "schema": schema},
            **kwargs,
        )
        parser = PydanticOutputParser(pydantic_object=schema) if is_pydantic else JsonOutputParser()
    elif method == "json_schema":
        bind_kwargs: dict[str, Any] = {
            "response_format": to_response_format(schema, strict=strict),
            "ls_structured_output_format": {
                "kwargs": {"method": method, "strict": strict},
                "schema": convert_to_openai_tool(schema),
            },
            **kwargs,
        }
        if tools:
            bind_kwargs["tools"] = format_tools(tools, strict=strict)
        llm = model.bind(**bind_kwargs)
        parse = _json_schema_parser(schema)
        if is_pydantic:
            # A pydantic object cannot be half-built: one result, when complete.
            parser = RunnableLambda(parse).with_types(output_type=schema)
        else:
            parser = _StreamingJsonSchemaParser(strict_parse=parse)
    else:
        msg = (
            f"Unknown structured output method {method!r}; use 'json_schema', "
            "'function_calling' or 'json_mode'."
        )
        raise ValueError(msg)

    if include_raw:
        parser_assign = RunnablePassthrough.assign(
            parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
        )
        parser_none = RunnablePassthrough.assign(parsed=lambda _: None)
        parser_with_fallback = parser_assign.with_fallbacks(
            [parser_none], exception_key="parsing_error"
        )
        return RunnableMap(raw=llm) | parser_with_fallback
    return llm | parser
