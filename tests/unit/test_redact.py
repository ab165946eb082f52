"""A password in a URL never shows in a repr, an error or a log line."""

from __future__ import annotations

import logging

import pytest
from langchain_core.messages import HumanMessage

from langgraph_batch import BatchedChatModel
from langgraph_batch._redact import safe_url
from langgraph_batch.backends import backend_from_url
from langgraph_batch.errors import BackendConnectionError, BackendServerError

SECRET = "s3cr3t-pw"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:pw@host:8000/v1", "http://user:***@host:8000/v1"),
        ("http://:pw@host/v1", "http://***@host/v1"),
        ("http://host:8000/v1?next=a@b", "http://host:8000/v1?next=a@b"),
        ("http://host:8000/a@b/c", "http://host:8000/a@b/c"),
        ("not a url", "not a url"),
    ],
)
def test_safe_url_masks_the_password_only(url: str, shown: str) -> None:
    assert safe_url(url) == shown


def test_reprs_and_error_fields_mask_the_password() -> None:
    url = f"http://user:{SECRET}@127.0.0.1:9/v1"
    assert SECRET not in repr(backend_from_url(url))
    llm = BatchedChatModel(model="m", base_url=url)
    assert SECRET not in repr(llm)
    assert llm.base_url == url  # the value itself is the caller's
    assert BackendServerError("x", url=url + "/chat/completions").url == (
        "http://user:***@127.0.0.1:9/v1/chat/completions"
    )


async def test_a_failed_call_to_a_url_with_a_password_never_shows_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="langgraph_batch")
    llm = BatchedChatModel(
        model="m", base_url=f"http://user:{SECRET}@127.0.0.1:9/v1", max_retries=0, timeout=2.0
    )
    try:
        with pytest.raises(BackendConnectionError) as info:
            await llm.ainvoke([HumanMessage("hi")])
    finally:
        await llm.get_scheduler().aclose()
    err = info.value
    assert SECRET not in f"{err} {err!r} {err.url}"
    assert SECRET not in caplog.text


def test_urls_that_differ_by_password_only_never_share_a_scheduler() -> None:
    from langgraph_batch.backends import backend_key

    a, b = "vllm://user:pw-a@127.0.0.1:9", "vllm://user:pw-b@127.0.0.1:9"
    ka, kb = backend_from_url(a).key, backend_from_url(b).key
    assert ka != kb
    assert "pw-a" not in ka
    assert "pw-b" not in kb
    assert backend_key(a) == ka  # the factory's key is the backend's
    assert backend_key(b) == kb
    assert backend_key("vllm://127.0.0.1:9") == backend_from_url("vllm://127.0.0.1:9").key
