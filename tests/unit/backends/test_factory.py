"""backend_from_url: schemes, normalisation, options and bad values."""

from __future__ import annotations

import pytest

from langgraph_batch.backends import (
    OpenAICompatibleBackend,
    SGLangBackend,
    VLLMBackend,
    backend_from_url,
)


@pytest.mark.parametrize(
    ("url", "cls", "base"),
    [
        ("http://127.0.0.1:8000", OpenAICompatibleBackend, "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/v1", OpenAICompatibleBackend, "http://127.0.0.1:8000"),
        ("https://api.example.com/v1/", OpenAICompatibleBackend, "https://api.example.com"),
        ("openai://api.openai.com", OpenAICompatibleBackend, "https://api.openai.com"),
        ("vllm://gpu1:8000", VLLMBackend, "http://gpu1:8000"),
        ("vllm://gpu1:8000/v1", VLLMBackend, "http://gpu1:8000"),
        ("vllm+https://gpu1", VLLMBackend, "https://gpu1"),
        ("sglang://gpu2:30000", SGLangBackend, "http://gpu2:30000"),
        ("SGLANG://gpu2:30000", SGLangBackend, "http://gpu2:30000"),
    ],
)
async def test_schemes(url: str, cls: type, base: str) -> None:
    b = backend_from_url(url, api_key="k")
    try:
        assert type(b) is cls
        assert b.base_url == base
    finally:
        await b.aclose()


async def test_options_pass_through() -> None:
    b = backend_from_url("vllm://h:1", api_key="k", timeout=5.0, priority_scheduling=True)
    assert isinstance(b, VLLMBackend)
    assert b.capabilities.priority
    assert b.timeout == 5.0
    assert b._client.headers["authorization"] == "Bearer k"
    await b.aclose()


@pytest.mark.parametrize("url", ["ftp://h:1", "localhost:8000", "vllm://", "redis://h"])
def test_bad_urls(url: str) -> None:
    with pytest.raises(ValueError, match="vllm://host:port") as info:
        backend_from_url(url)
    assert repr(url) in str(info.value)


def test_openai_scheme_needs_a_key() -> None:
    with pytest.raises(ValueError, match="needs an API key"):
        backend_from_url("openai://api.openai.com")


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("vllm://h:99999", "99999"),
        ("http://h:0/v1", "port 0"),
        ("vllm://h:abc", "not a valid URL"),
    ],
)
def test_bad_ports_name_the_value(url: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        backend_from_url(url)


def test_bad_option() -> None:
    with pytest.raises(TypeError):
        backend_from_url("http://h:1", nonsense=True)
