"""OpenAI's Batch API through the official SDK: upload, create, poll, download.

The flow of https://platform.openai.com/docs/guides/batch: a JSONL input file
(`{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}` per
line) uploaded with `purpose="batch"`, a batch created on it with
`completion_window="24h"`, polled until `completed`, `expired`, `failed` or
`cancelled`; the answers are in `output_file_id`, the rest in
`error_file_id` (an `error.code` of `batch_expired` / `batch_cancelled`, or
a `response` with an error status), in any order: matched by `custom_id`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, convert_to_openai_messages

from langgraph_batch._extras import missing_extra
from langgraph_batch.batch_api._outcome import unran
from langgraph_batch.errors import (
    BatchItemFailedError,
    ProviderBatchError,
)

__all__ = ("OpenAIBatches",)

ENDPOINT = "/v1/chat/completions"
_ENDED = ("completed", "expired", "failed", "cancelled")


class OpenAIBatches:
    """One client's batches: `submit`, `ended`, `cancel`, `results`."""

    name = "openai"

    def __init__(
        self,
        *,
        client: Any,
        base_url: str | None,
        api_key: str | None,
        model: str,
        params: Mapping[str, Any],
        completion_window: str,
    ) -> None:
        if client is None:
            try:
                import openai
            except ImportError:
                raise missing_extra("batch-api", "ProviderBatch(provider='openai')") from None
            client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key)
        self.client = client
        self.model = model
        self.params = dict(params)
        self.completion_window = completion_window

    def line(self, custom_id: str, messages: Sequence[BaseMessage]) -> dict[str, Any]:
        """One input file line."""
        body = {"model": self.model, "messages": convert_to_openai_messages(list(messages))}
        return {
            "custom_id": custom_id,
            "method": "POST",
            "url": ENDPOINT,
            "body": {**body, **self.params},
        }

    async def submit(self, items: Sequence[tuple[str, Sequence[BaseMessage]]]) -> str:
        """Upload the input file and create the batch; its id."""
        data = "".join(json.dumps(self.line(cid, msgs)) + "\n" for cid, msgs in items)
        upload = await self.client.files.create(
            file=("batch.jsonl", data.encode(), "application/jsonl"), purpose="batch"
        )
        batch = await self.client.batches.create(
            input_file_id=upload.id, endpoint=ENDPOINT, completion_window=self.completion_window
        )
        return str(batch.id)

    async def ended(self, batch_id: str) -> bool:
        """Whether the batch reached a final status."""
        batch = await self.client.batches.retrieve(batch_id)
        return batch.status in _ENDED

    async def cancel(self, batch_id: str) -> None:
        """Ask the provider to cancel (items already done stay done)."""
        await self.client.batches.cancel(batch_id)

    async def results(self, batch_id: str, *, cut_off: bool) -> dict[str, AIMessage | Exception]:
        """Every item's answer or error, by `custom_id` (`cut_off`: the deadline cancelled it)."""
        batch = await self.client.batches.retrieve(batch_id)
        out: dict[str, AIMessage | Exception] = {}
        if batch.status == "failed":
            errors = batch.errors.model_dump() if batch.errors is not None else {}
            reason = "; ".join(str(e.get("message")) for e in errors.get("data") or [])
            out[""] = ProviderBatchError(
                f"OpenAI batch {batch_id} failed validation: {reason or 'no reason given'}",
                batch_id=batch_id,
                custom_id="",
            )
            return out
        for file_id in (batch.output_file_id, batch.error_file_id):
            if not file_id:
                continue
            content = await self.client.files.content(file_id)
            for raw in content.text.splitlines():
                if raw.strip():
                    line = json.loads(raw)
                    out[str(line["custom_id"])] = self._item(batch_id, line, cut_off=cut_off)
        return out

    def _item(
        self, batch_id: str, line: Mapping[str, Any], *, cut_off: bool
    ) -> AIMessage | Exception:
        cid = str(line["custom_id"])
        response = line.get("response") or {}
        error = line.get("error") or {}
        status = response.get("status_code")
        if status == 200:
            return to_message(response["body"], batch_id=batch_id, custom_id=cid)
        code = error.get("code")
        missed = unran(
            "OpenAI",
            batch_id,
            cid,
            expired=code == "batch_expired",
            cancelled=code == "batch_cancelled",
            cut_off=cut_off,
            window="the batch's completion window",
        )
        if missed is not None:
            return missed
        body_error = ((response.get("body") or {}).get("error")) or error
        return BatchItemFailedError(
            f"OpenAI batch {batch_id}: item {cid} failed with HTTP {status}: "
            f"{body_error.get('message')}",
            batch_id=batch_id,
            custom_id=cid,
            status=int(status) if status is not None else None,
            code=body_error.get("type") or body_error.get("code"),
        )


def to_message(body: Mapping[str, Any], *, batch_id: str, custom_id: str) -> AIMessage:
    """A chat completion (one batch output body) as LangChain's `AIMessage`, usage included."""
    choice = body["choices"][0]
    usage = body.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    prompt, completion = (
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
    )
    metadata: dict[str, Any] = {
        "input_tokens": prompt,
        "output_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        metadata["input_token_details"] = {"cache_read": int(cached)}
    return AIMessage(
        content=choice["message"].get("content") or "",
        id=body.get("id"),
        usage_metadata=metadata,
        response_metadata={
            "model_name": body.get("model"),
            "finish_reason": choice.get("finish_reason"),
            "model_provider": "openai",
            "batch_id": batch_id,
            "custom_id": custom_id,
        },
    )
