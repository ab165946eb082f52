"""Bedrock's Converse API through the official clients: boto3 and `ChatBedrockConverse`.

The emulator (`hosted="anthropic"`) serves `/model/{id}/converse` and
`/converse-stream` with Anthropic's cache rules behind Bedrock's wire format;
botocore signs, sends and parses (event stream included) unmodified, with
`endpoint_url` pointed at it. Checked: `cachePoint` writes and reads in
`usage`, the streamed tool use and its usage, the rules' ValidationException,
a ThrottlingException, and LangChainBackend's checkpoints and prefix warming
across siblings.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from langgraph_batch.backends import LangChainBackend
from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess
from tests.integration._hosted import assert_siblings_warm_then_read

boto3 = pytest.importorskip("boto3")
langchain_aws = pytest.importorskip("langchain_aws")

MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"
SYSTEM = "You are a careful agent. Follow the policy. " * 200  # ~1.8k emulator tokens
CREDENTIALS = {"aws_access_key_id": "emulated", "aws_secret_access_key": "emulated"}
TOOLS = {
    "tools": [
        {
            "toolSpec": {
                "name": "lookup",
                "description": "Look a key up.",
                "inputSchema": {
                    "json": {
                        "type": "object",
                        "properties": {"q": {"type": "string"}},
                        "required": ["q"],
                    }
                },
            }
        }
    ]
}


@pytest.fixture(scope="module")
def hosted_url() -> Iterator[str]:
    with EmulatorProcess(EmulatorConfig(port=0, hosted="anthropic", time_scale=50.0)) as emu:
        yield emu.url


@pytest.fixture
def client(hosted_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    # botocore must not look for credentials or a region on the network.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    httpx.post(f"{hosted_url}/emulator/reset").raise_for_status()
    return boto3.client(
        "bedrock-runtime", endpoint_url=hosted_url, region_name="us-east-1", **CREDENTIALS
    )


def _system() -> list[dict[str, Any]]:
    return [{"text": SYSTEM}, {"cachePoint": {"type": "default"}}]


def _ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"text": text}]}]


def test_boto3_writes_then_reads_the_checkpointed_prefix(client: Any) -> None:
    first = client.converse(modelId=MODEL, system=_system(), messages=_ask("a"))["usage"]
    assert first["cacheWriteInputTokens"] > 1024
    assert first["cacheReadInputTokens"] == 0
    second = client.converse(modelId=MODEL, system=_system(), messages=_ask("b"))["usage"]
    assert second["cacheReadInputTokens"] == first["cacheWriteInputTokens"]
    assert second["cacheWriteInputTokens"] == 0
    assert second["inputTokens"] == first["inputTokens"]  # the user turn only
    assert second["totalTokens"] == (
        second["inputTokens"] + second["cacheReadInputTokens"] + second["outputTokens"]
    )
    # No checkpoint: nothing cached, nothing read.
    plain = client.converse(modelId=MODEL, system=[{"text": SYSTEM}], messages=_ask("c"))
    assert plain["usage"]["cacheReadInputTokens"] == 0
    assert plain["usage"]["cacheWriteInputTokens"] == 0


def test_boto3_streams_a_tool_use_with_its_usage(client: Any) -> None:
    reply = client.converse_stream(
        modelId=MODEL, system=_system(), toolConfig=TOOLS, messages=_ask("find key=k1")
    )
    events = list(reply["stream"])
    kinds = [next(iter(e)) for e in events]
    assert kinds[0] == "messageStart"
    assert kinds[-2:] == ["messageStop", "metadata"]
    start = next(
        e["contentBlockStart"]["start"]["toolUse"] for e in events if "contentBlockStart" in e
    )
    assert start["name"] == "lookup"
    assert events[-2]["messageStop"]["stopReason"] == "tool_use"
    usage = events[-1]["metadata"]["usage"]
    assert usage["cacheWriteInputTokens"] > 1024
    assert usage["outputTokens"] > 0


def test_boto3_gets_the_rules_validation_exception(client: Any) -> None:
    point = {"cachePoint": {"type": "default"}}
    blocks = [b for i in range(5) for b in ({"text": f"part {i}"}, point)]
    with pytest.raises(client.exceptions.ValidationException, match="maximum of 4"):
        client.converse(modelId=MODEL, system=blocks, messages=_ask("x"))
    with pytest.raises(client.exceptions.ValidationException, match="cachePoint"):
        client.converse(modelId=MODEL, system=[point], messages=_ask("x"))


def test_an_injected_429_is_a_throttling_exception(hosted_url: str) -> None:
    from botocore.config import Config

    once = boto3.client(
        "bedrock-runtime",
        endpoint_url=hosted_url,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
        **CREDENTIALS,
    )

    def fault(params: Any, **_: Any) -> None:
        params["headers"]["X-Emulator-Options"] = '{"fault": "429", "retry_after_s": 1}'

    once.meta.events.register("before-call.bedrock-runtime.Converse", fault)
    with pytest.raises(once.exceptions.ThrottlingException):
        once.converse(modelId=MODEL, messages=_ask("x"))


@pytest.fixture
def bedrock(hosted_url: str, client: Any) -> Any:
    """The model, built outside the event loop (boto3 reads its files as it starts)."""
    return langchain_aws.ChatBedrockConverse(
        model=MODEL, region_name="us-east-1", endpoint_url=hosted_url, **CREDENTIALS
    )


async def test_chat_bedrock_converse_through_langchain_backend_warms_then_reads(
    hosted_url: str, bedrock: Any
) -> None:
    backend = LangChainBackend(bedrock, key="bedrock-it")
    assert backend.capabilities.hosted_prompt_cache
    await assert_siblings_warm_then_read(backend, model=MODEL, system=SYSTEM, hosted_url=hosted_url)
