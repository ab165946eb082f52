"""`backend_key(url)` equals the key of the backend `backend_from_url(url)` builds."""

from __future__ import annotations

import pytest

from langgraph_batch.backends import backend_from_url, backend_key
from langgraph_batch.chat_model import BatchedChatModel


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000",
        "http://127.0.0.1:8000/v1/",
        "openai://api.example.com",
        "vllm://127.0.0.1:8000",
        "sglang+https://gpu:30000",
        "vllm://h2:8000,h1:8000",
        "sglang://a:1, b:2",
    ],
)
async def test_key_matches_the_built_backend(url: str) -> None:
    backend = backend_from_url(url, api_key="sk-secret-1")
    try:
        assert backend_key(url, api_key="sk-secret-1") == backend.key
        assert "sk-secret-1" not in backend.key
        assert backend_key(url, api_key="sk-secret-2") != backend.key
    finally:
        await backend.aclose()


async def test_key_covers_headers_and_query() -> None:
    url = "vllm://h:1"
    plain = backend_key(url)
    assert plain == "VLLMBackend:http://h:1"  # no credentials: the endpoint alone
    with_header = backend_key(url, headers={"X-Api-Key": "hdr-secret"})
    assert with_header != plain
    assert "hdr-secret" not in with_header
    # Header names are case-insensitive, values are not.
    assert backend_key(url, headers={"x-api-key": "hdr-secret"}) == with_header
    assert backend_key(url, headers={"X-Api-Key": "other"}) != with_header
    assert backend_key(url, query={"tenant": "a"}) != backend_key(url, query={"tenant": "b"})
    backend = backend_from_url(url, headers={"X-Api-Key": "hdr-secret"}, query={"v": "1"})
    try:
        assert backend.key == backend_key(
            url, headers={"X-Api-Key": "hdr-secret"}, query={"v": "1"}
        )
    finally:
        await backend.aclose()


def test_pool_key_names_its_routing() -> None:
    assert backend_key("vllm://a:1,b:2", routing="round_robin").startswith(
        "EndpointPool(round_robin):"
    )


def test_chat_model_accepts_a_host_list() -> None:
    llm = BatchedChatModel(model="m", base_url="vllm://h1:8000,h2:8000")
    assert llm.scheduler_key == backend_key("vllm://h1:8000,h2:8000")


@pytest.mark.parametrize("url", ["ftp://x", "vllm://", "vllm://a:1,,b:2", "localhost:8000"])
def test_bad_urls_name_the_value(url: str) -> None:
    with pytest.raises(ValueError, match="URL"):
        backend_key(url)
