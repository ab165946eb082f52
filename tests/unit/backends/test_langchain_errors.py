"""What a wrapped model raises becomes the error an HTTP backend raises for the same failure."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from langchain_core.exceptions import ContextOverflowError, ModelRateLimitError
from langchain_core.messages import BaseMessage
from langchain_openai.chat_models.base import OpenAIAPIError, OpenAIRateLimitError

from langgraph_batch.backends import LangChainBackend
from langgraph_batch.backends.base import ChatRequest
from langgraph_batch.errors import (
    BackendAuthenticationError,
    BackendBadRequestError,
    BackendConnectionError,
    BackendError,
    BackendRateLimitError,
    BackendServerError,
    BackendTimeoutError,
    ContextLengthExceededError,
    ModelNotFoundError,
)
from tests.fakes.chat_models import ProviderFake, rate_limit_error

_REQUEST = httpx.Request("POST", "https://api.example.test/v1/chat/completions")


def _response(status: int, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, headers=headers or {}, request=_REQUEST, json={"error": {}})


class OverloadedError(Exception):
    """Shaped like anthropic.OverloadedError: a status, no langchain-core base."""

    def __init__(self) -> None:
        super().__init__("Overloaded")
        self.status_code = 529
        self.response = _response(529)


class ProviderTimeout(Exception):
    """An unknown SDK's timeout, recognised by its name only."""


def _context_error() -> openai.BadRequestError:
    return openai.BadRequestError(
        "This model's maximum context length is 8192 tokens. However, your messages "
        "resulted in 9000 tokens.",
        response=_response(400),
        body=None,
    )


def _chained_rate_limit() -> Exception:
    try:
        raise rate_limit_error("250")
    except openai.RateLimitError as exc:
        try:
            raise RuntimeError("wrapper of a 429") from exc
        except RuntimeError as outer:
            return outer


CASES: list[tuple[str, Any, type[BackendError], dict[str, Any]]] = [
    ("openai 429", lambda: rate_limit_error("1500"), BackendRateLimitError,
     {"retry_after_s": 1.5, "status_code": 429}),
    ("langchain-openai 429", lambda: OpenAIRateLimitError(
        "slow down", response=_response(429, {"retry-after": "3"}), body=None),
     BackendRateLimitError, {"retry_after_s": 3.0}),
    ("plain ModelRateLimitError", lambda: ModelRateLimitError("slow"), BackendRateLimitError,
     {"retry_after_s": None}),
    ("429 raised from inside a wrapper", _chained_rate_limit, BackendRateLimitError,
     {"retry_after_s": 0.25}),
    ("openai 500", lambda: openai.InternalServerError(
        "boom", response=_response(500), body=None), BackendServerError, {"status_code": 500}),
    ("langchain-openai 503", lambda: OpenAIAPIError(
        "unavailable", response=_response(503), body=None), BackendServerError,
     {"status_code": 503}),
    ("anthropic-like 529", OverloadedError, BackendServerError, {"status_code": 529}),
    ("openai timeout", lambda: openai.APITimeoutError(request=_REQUEST), BackendTimeoutError, {}),
    ("httpx read timeout", lambda: httpx.ReadTimeout("slow", request=_REQUEST),
     BackendTimeoutError, {}),
    ("named timeout", ProviderTimeout, BackendTimeoutError, {}),
    ("openai connection", lambda: openai.APIConnectionError(request=_REQUEST),
     BackendConnectionError, {}),
    ("httpx connect", lambda: httpx.ConnectError("refused", request=_REQUEST),
     BackendConnectionError, {}),
    ("openai 401", lambda: openai.AuthenticationError(
        "bad key", response=_response(401), body=None), BackendAuthenticationError,
     {"status_code": 401}),
    ("openai 404", lambda: openai.NotFoundError(
        "no such model", response=_response(404), body=None), ModelNotFoundError,
     {"model": "fake-model"}),
    ("openai 400", lambda: openai.BadRequestError(
        "bad field", response=_response(400), body={"error": "bad field"}),
     BackendBadRequestError, {"body": "{'error': 'bad field'}"}),
    ("openai 400 context", _context_error, ContextLengthExceededError,
     {"max_model_len": 8192, "prompt_tokens": 9000}),
    ("ContextOverflowError", lambda: ContextOverflowError("too long"),
     ContextLengthExceededError, {}),
    ("unknown", lambda: KeyError("oops"), BackendError, {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "expected", "attrs"),
    [pytest.param(make, exp, attrs, id=name) for name, make, exp, attrs in CASES],
)
async def test_provider_errors_map_into_the_tree(
    make: Any, expected: type[BackendError], attrs: dict[str, Any]
) -> None:
    raised = make()

    def script(messages: list[BaseMessage], kwargs: dict[str, Any]) -> BaseException:
        return raised

    backend = LangChainBackend(ProviderFake(script=script))
    request = ChatRequest(
        model="m", messages=[{"role": "user", "content": "x"}], request_id="lgb-err-1"
    )
    with pytest.raises(BackendError) as info:
        await backend.chat(request)
    err = info.value
    assert type(err) is expected
    assert err.__cause__ is raised
    assert err.request_id == "lgb-err-1"
    assert "ProviderFake(fake-model)" in str(err)
    assert type(raised).__name__ in str(err)
    for name, value in attrs.items():
        assert getattr(err, name) == value, name
    # The scheduler retries exactly what an HTTP backend's error would let it retry.
    retryable = expected in (
        BackendRateLimitError,
        BackendServerError,
        BackendTimeoutError,
        BackendConnectionError,
    )
    assert err.is_retryable is retryable
