"""Status -> error mapping (backends._errormap), Retry-After and context-length parsing
(backends._errortext), client settings (backends._http)."""

from __future__ import annotations

import email.utils
import json

import pytest
from langchain_core.exceptions import ContextOverflowError, ModelRateLimitError

from langgraph_batch.backends._errormap import error_from_response, is_route_not_found
from langgraph_batch.backends._errortext import (
    parse_context_length_message,
    parse_retry_after,
    summarize_body,
)
from langgraph_batch.backends._http import make_request_id, make_timeout
from langgraph_batch.errors import (
    BackendAuthenticationError,
    BackendBadRequestError,
    BackendRateLimitError,
    BackendServerError,
    ContextLengthExceededError,
    ModelNotFoundError,
)
from tests.fakes.http import error_body

URL = "http://127.0.0.1:8000/v1/chat/completions"


def _body(message: str, code: int = 400) -> bytes:
    return json.dumps(error_body(message, code=code)).encode()


class TestRetryAfter:
    def test_seconds(self) -> None:
        assert parse_retry_after({"retry-after": "7"}) == 7.0
        assert parse_retry_after({"retry-after": "0.5"}) == 0.5

    def test_http_date(self) -> None:
        now = 1_700_000_000.0
        date = email.utils.formatdate(now + 30, usegmt=True)
        assert parse_retry_after({"retry-after": date}, now=now) == pytest.approx(30.0)

    def test_past_date_is_zero(self) -> None:
        now = 1_700_000_000.0
        date = email.utils.formatdate(now - 30, usegmt=True)
        assert parse_retry_after({"retry-after": date}, now=now) == 0.0

    def test_milliseconds_header_wins(self) -> None:
        assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25

    @pytest.mark.parametrize("value", ["", "soon", "Thu, 99 Foo 2024"])
    def test_unparsable(self, value: str) -> None:
        assert parse_retry_after({"retry-after": value}) is None

    def test_absent(self) -> None:
        assert parse_retry_after({}) is None


class TestContextLengthMessages:
    @pytest.mark.parametrize(
        ("message", "prompt", "max_len"),
        [
            (
                "This model's maximum context length is 32768 tokens. However, you requested "
                "40000 tokens (39000 in the messages, 1000 in the completion). Please reduce the "
                "length of the messages or completion.",
                39000,
                32768,
            ),
            (
                "This model's maximum context length is 32768 tokens. However, your prompt "
                "contains 40000 input tokens, which exceeds this limit even without any output "
                "tokens. Please reduce the length of the input prompt. "
                "(parameter=input_tokens, value=40000)",
                40000,
                32768,
            ),
            (
                "This model's maximum context length is 32768 tokens. However, your prompt "
                "contains at least 32769 input tokens, which exceeds this limit",
                32769,
                32768,
            ),
            (
                "This model's maximum context length is 4096 tokens. However, your prompt "
                "contains 99999 characters (more than 16384 characters, which is the upper "
                "bound for 4096 input tokens). Please reduce the length of the input prompt.",
                None,
                4096,
            ),
            (
                "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's "
                "maximum context length is 32768 tokens and your request has 32000 input tokens "
                "(1000 > 32768 - 32000).",
                32000,
                32768,
            ),
            (
                "The decoder prompt (length 40000) is longer than the maximum model length of "
                "32768. Make sure that `max_model_len` is no smaller than the number of text "
                "tokens.",
                40000,
                32768,
            ),
            (
                "The decoder prompt (length 32768) plus the number of requested output tokens "
                "(at least 1) is longer than the maximum model length of 32768.",
                32768,
                32768,
            ),
            ("Input length (40000) exceeds model's maximum context length (32768).", 40000, 32768),
            (
                "This model's maximum context length is 4096 tokens. However, you requested 5000 "
                "tokens in the messages, Please reduce the length of the messages.",
                5000,
                4096,
            ),
            (
                "This model's maximum context length is 32768 tokens. However, your request has "
                "40000 input tokens. Please reduce the length of the input messages.",
                40000,
                32768,
            ),
            (
                "The engine prompt length 40000 exceeds the max_model_len 32768. Please reduce "
                "prompt.",
                40000,
                32768,
            ),
            (
                "The input (40000 tokens) is longer than the model's context length "
                "(32768 tokens).",
                40000,
                32768,
            ),
            (
                "Requested token count exceeds the model's maximum context length of 32768 "
                "tokens. You requested a total of 41000 tokens: 40000 tokens from the input "
                "messages and 1000 tokens for the completion.",
                40000,
                32768,
            ),
            (
                "max_tokens=40000 cannot be greater than max_total_tokens=32768. Please "
                "request fewer output tokens.",
                None,
                32768,
            ),
        ],
    )
    def test_parsed(self, message: str, prompt: int | None, max_len: int) -> None:
        assert parse_context_length_message(message) == (True, prompt, max_len)

    def test_other_message(self) -> None:
        assert parse_context_length_message("temperature must be >= 0") == (False, None, None)


class TestErrorFromResponse:
    def test_429_with_retry_after(self) -> None:
        exc = error_from_response(
            429, _body("slow down", 429), {"retry-after": "3"}, url=URL, request_id="r1"
        )
        assert isinstance(exc, BackendRateLimitError)
        assert isinstance(exc, ModelRateLimitError)
        assert exc.retry_after_s == 3.0
        assert exc.is_retryable
        assert exc.status_code == 429
        assert exc.request_id == "r1"
        assert "retry after 3 s" in str(exc)

    @pytest.mark.parametrize("status", [500, 502, 503])
    def test_5xx(self, status: int) -> None:
        exc = error_from_response(status, b"upstream died", {}, url=URL)
        assert isinstance(exc, BackendServerError)
        assert exc.is_retryable
        assert exc.status_code == status
        assert "upstream died" in str(exc)

    @pytest.mark.parametrize("status", [401, 403])
    def test_auth(self, status: int) -> None:
        exc = error_from_response(status, _body("bad key", status), {}, url=URL)
        assert isinstance(exc, BackendAuthenticationError)
        assert not exc.is_retryable
        assert "api_key" in str(exc)

    def test_context_length(self) -> None:
        message = (
            "This model's maximum context length is 32768 tokens. However, you requested "
            "40000 tokens (39000 in the messages, 1000 in the completion)."
        )
        exc = error_from_response(400, _body(message), {}, url=URL)
        assert isinstance(exc, ContextLengthExceededError)
        assert isinstance(exc, ContextOverflowError)
        assert (exc.prompt_tokens, exc.max_model_len) == (39000, 32768)
        assert not exc.is_retryable
        assert "prompt 39000 tokens" in str(exc)
        assert "max_model_len 32768" in str(exc)

    def test_unknown_model(self) -> None:
        exc = error_from_response(
            404,
            _body("The model `gpt-9` does not exist.", 404),
            {},
            url=URL,
            model="gpt-9",
            available_models=("llama", "qwen"),
        )
        assert isinstance(exc, ModelNotFoundError)
        assert exc.model == "gpt-9"
        assert exc.available == ("llama", "qwen")
        assert "'gpt-9'" in str(exc)
        assert "llama, qwen" in str(exc)

    def test_unknown_route(self) -> None:
        body = b'{"detail":"Not Found"}'
        assert is_route_not_found(404, body)
        exc = error_from_response(404, body, {}, url=URL + "x", model="m")
        assert isinstance(exc, ModelNotFoundError)
        assert "check base_url" in str(exc)

    def test_model_404_is_not_route(self) -> None:
        assert not is_route_not_found(404, _body("The model `x` does not exist.", 404))
        assert is_route_not_found(405, b"")

    def test_other_400(self) -> None:
        exc = error_from_response(400, _body("temperature must be >= 0"), {}, url=URL)
        assert type(exc) is BackendBadRequestError
        assert not exc.is_retryable
        assert exc.body is not None
        assert "temperature" in exc.body


def test_make_timeout_validates() -> None:
    t = make_timeout(30.0, connect_timeout=2.0)
    assert (t.connect, t.read, t.write, t.pool) == (2.0, 30.0, 30.0, None)
    assert make_timeout(30.0, pool_timeout=7.0).pool == 7.0
    with pytest.raises(ValueError, match="-1"):
        make_timeout(-1)
    with pytest.raises(ValueError, match="pool_timeout"):
        make_timeout(1.0, pool_timeout=0)
    with pytest.raises(ValueError, match="connect_timeout"):
        make_timeout(1.0, connect_timeout=0)


def test_make_request_id_names_sibling_and_turn() -> None:
    rid = make_request_id(sibling_id="run 7/3", turn=2)
    assert rid.startswith("lgb-run.7.3-t2-")
    assert rid != make_request_id(sibling_id="run 7/3", turn=2)


NGINX_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.25.3</center>\r\n"
    + b"<!-- padding -->" * 200
    + b"</body>\r\n</html>\r\n"
)


def test_html_error_page_becomes_one_line() -> None:
    exc = error_from_response(502, NGINX_502, {"content-type": "text/html"}, url=URL)
    assert isinstance(exc, BackendServerError)
    assert "HTML page: 502 Bad Gateway" in str(exc)
    assert "<" not in str(exc)
    assert "\n" not in str(exc)
    assert len(str(exc)) < 300


def test_html_without_content_type_and_plain_text() -> None:
    assert summarize_body(b"<html><body><h1>Service\n  Unavailable</h1></body></html>") == (
        "HTML page: Service Unavailable"
    )
    assert summarize_body(b"upstream connect error\nreset reason: overflow") == (
        "upstream connect error reset reason: overflow"
    )
    assert summarize_body(b"x" * 5000).endswith("...")
    assert len(summarize_body(b"x" * 5000)) == 203
    exc = error_from_response(400, b"bad things\nhappened", {}, url=URL)
    assert "bad things happened" in str(exc)
