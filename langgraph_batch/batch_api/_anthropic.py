"""Anthropic's Message Batches through the official SDK: create, poll, read the results.

The flow of https://docs.claude.com/en/docs/build-with-claude/batch-processing:
`messages.batches.create(requests=[{custom_id, params}])`, polled until
`processing_status == "ended"`, then `messages.batches.results(id)` (JSONL of
`succeeded` / `errored` / `canceled` / `expired` results, in any order:
matched by `custom_id`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage

from langgraph_batch._extras import missing_extra
from langgraph_batch.batch_api._outcome import unran
from langgraph_batch.errors import (
    BatchItemFailedError,
)

__all__ = ("AnthropicBatches",)


class AnthropicBatches:
    """One client's Message Batches: `submit`, `ended`, `cancel`, `results`."""

    name = "anthropic"

    def __init__(
        self,
        *,
        client: Any,
        base_url: str | None,
        api_key: str | None,
        model: str,
        params: Mapping[str, Any],
    ) -> None:
        if client is None:
            try:
                import anthropic
            except ImportError:
                raise missing_extra("batch-api", "ProviderBatch(provider='anthropic')") from None
            client = anthropic.AsyncAnthropic(base_url=base_url, api_key=api_key)
        self.client = client
        self.model = model
        self.params = {"max_tokens": 1024, **params}

    def request(self, custom_id: str, messages: Sequence[BaseMessage]) -> dict[str, Any]:
        """One `requests` entry: system messages become `system`, the rest `messages`."""
        system = "\n\n".join(m.text for m in messages if isinstance(m, SystemMessage))
        turns = [
            {"role": "assistant" if m.type == "ai" else "user", "content": m.text}
            for m in messages
            if not isinstance(m, SystemMessage)
        ]
        params: dict[str, Any] = {"model": self.model, "messages": turns, **self.params}
        if system:
            params["system"] = system
        return {"custom_id": custom_id, "params": params}

    async def submit(self, items: Sequence[tuple[str, Sequence[BaseMessage]]]) -> str:
        """Create the batch; its id."""
        batch = await self.client.messages.batches.create(
            requests=[self.request(cid, msgs) for cid, msgs in items]
        )
        return str(batch.id)

    async def ended(self, batch_id: str) -> bool:
        """Whether the batch's processing ended."""
        batch = await self.client.messages.batches.retrieve(batch_id)
        return bool(batch.processing_status == "ended")

    async def cancel(self, batch_id: str) -> None:
        """Ask the provider to cancel (items already done stay done)."""
        await self.client.messages.batches.cancel(batch_id)

    async def results(self, batch_id: str, *, cut_off: bool) -> dict[str, AIMessage | Exception]:
        """Every item's answer or error, by `custom_id` (`cut_off`: the deadline cancelled it)."""
        out: dict[str, AIMessage | Exception] = {}
        async for entry in await self.client.messages.batches.results(batch_id):
            data = entry.model_dump()
            cid = str(data["custom_id"])
            out[cid] = _item(batch_id, cid, data["result"], cut_off=cut_off)
        return out


def _item(
    batch_id: str, cid: str, result: Mapping[str, Any], *, cut_off: bool
) -> AIMessage | Exception:
    kind = result.get("type")
    if kind == "succeeded":
        return to_message(result["message"], batch_id=batch_id, custom_id=cid)
    missed = unran(
        "Anthropic",
        batch_id,
        cid,
        expired=kind == "expired",
        cancelled=kind == "canceled",
        cut_off=cut_off,
        window="the batch's 24-hour window",
    )
    if missed is not None:
        return missed
    error = ((result.get("error") or {}).get("error")) or {}
    return BatchItemFailedError(
        f"Anthropic batch {batch_id}: item {cid} errored: {error.get('type')}: "
        f"{error.get('message')}",
        batch_id=batch_id,
        custom_id=cid,
        code=error.get("type"),
    )


def to_message(message: Mapping[str, Any], *, batch_id: str, custom_id: str) -> AIMessage:
    """A Messages API answer as LangChain's `AIMessage`, cache traffic in `usage_metadata`."""
    usage = message.get("usage") or {}
    read = int(usage.get("cache_read_input_tokens") or 0)
    written = int(usage.get("cache_creation_input_tokens") or 0)
    prompt = int(usage.get("input_tokens") or 0) + read + written
    output = int(usage.get("output_tokens") or 0)
    details: dict[str, int] = {"cache_read": read, "cache_creation": written}
    split = usage.get("cache_creation") or {}
    for key in ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens"):
        if split.get(key) is not None:
            details[key] = int(split[key])
    text = "".join(
        str(block.get("text", ""))
        for block in message.get("content") or []
        if block.get("type") == "text"
    )
    return AIMessage(
        content=text,
        id=message.get("id"),
        usage_metadata={
            "input_tokens": prompt,
            "output_tokens": output,
            "total_tokens": prompt + output,
            "input_token_details": details,
        },
        response_metadata={
            "model_name": message.get("model"),
            "stop_reason": message.get("stop_reason"),
            "model_provider": "anthropic",
            "batch_id": batch_id,
            "custom_id": custom_id,
        },
    )
