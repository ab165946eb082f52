"""`ProviderBatch`: a fan_out executor that sends single-call siblings as one provider batch.

It follows `SiblingExecutor` (`langgraph_batch.nodes.fan_out`), so fan_out
keeps its semantics: `make_input` runs in the parent, results come back in
input order, a failed item is that sibling's `SiblingError`, progress
events report every sibling. What it adds: each sibling's input (messages,
or a mapping with `"messages"`) becomes one batch item; the batch is
polled every `poll_interval` seconds until it ends or `deadline` passes
(then it is cancelled, and items that did not run end as
`BatchItemExpiredError`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, convert_to_messages
from langchain_core.runnables import RunnableConfig

from langgraph_batch.batch_api._anthropic import AnthropicBatches
from langgraph_batch.batch_api._openai import OpenAIBatches
from langgraph_batch.errors import ProviderBatchError
from langgraph_batch.nodes import RemoteEvent

__all__ = ("ProviderBatch",)

logger = logging.getLogger(__name__)

_CANCEL_GRACE_S = 30.0
"""After a deadline cancels a batch: how long to wait for the provider to end it."""


class ProviderBatch:
    """Run a fan_out's siblings as one provider batch, at the batch API's discount.

    OpenAI's Batch API or Anthropic's Message Batches: half the price of the
    same calls made synchronously, answers within the provider's window
    (24 h) instead of seconds.

    Each sibling must be ONE model call without tools: `make_input(item, index)`
    returns its messages (anything `convert_to_messages` takes: a string,
    `(role, text)` pairs, messages) or a mapping with `"messages"` (the input
    an agent graph takes). A sibling's value is the answer as an `AIMessage`
    (with `usage_metadata`, and `batch_id` / `custom_id` in its
    `response_metadata`), or, for a mapping input, the mapping with the answer
    appended to its `"messages"`: the same value a chat model or a one-node
    graph returns on the synchronous path, so `result=` works for both.

    Example:
        ```python
        node = fan_out(
            llm,  # what runs the siblings without the executor
            items="documents",
            into="answers",
            make_input=lambda doc, i: [("system", INSTRUCTIONS), ("user", doc)],
            result=lambda message: message.content,
            executor=ProviderBatch(provider="openai", model="gpt-4.1-mini", deadline=6 * 3600),
        )
        ```

    !!! version-added "Added in version 0.2.0"
    """

    batch_api = True
    """Marks an executor whose calls are priced at the provider's batch discount."""

    def __init__(
        self,
        *,
        provider: Literal["openai", "anthropic"],
        model: str,
        client: Any = None,
        base_url: str | None = None,
        api_key: str | None = None,
        params: Mapping[str, Any] | None = None,
        poll_interval: float = 30.0,
        deadline: float | None = None,
        completion_window: str = "24h",
    ) -> None:
        """Configure the batches.

        Args:
            provider: `"openai"` (Batch API, `/v1/chat/completions` items) or
                `"anthropic"` (Message Batches).
            model: the model every item asks for.
            client: an `openai.AsyncOpenAI` / `anthropic.AsyncAnthropic` to use
                (None: one built from `base_url` and `api_key`, else the SDK's
                environment variables).
            base_url: the API's base URL (OpenAI's includes `/v1`).
            api_key: the API key.
            params: more request parameters for every item (`max_tokens`,
                `temperature`, `response_format`, ...; Anthropic's `max_tokens`
                defaults to 1024).
            poll_interval: seconds between two status checks.
            deadline: seconds after submission when the run stops waiting: the
                batch is cancelled, finished items are kept, the others fail
                with `BatchItemExpiredError` (None: the provider's window).
            completion_window: OpenAI's `completion_window` (`"24h"`).

        Raises:
            ValueError: an unknown provider, an empty model, a poll interval
                or deadline that is not > 0.
            ImportError: the provider's SDK is not installed.
        """
        if provider not in ("openai", "anthropic"):
            raise ValueError(f"provider must be 'openai' or 'anthropic', got {provider!r}")
        if not model:
            raise ValueError("model must name the model every item asks for")
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
        if deadline is not None and not deadline > 0:
            raise ValueError(f"deadline must be > 0 seconds or None, got {deadline!r}")
        self.provider = provider
        self.model = model
        self.poll_interval = float(poll_interval)
        self.deadline = deadline
        self._api: OpenAIBatches | AnthropicBatches
        if provider == "openai":
            self._api = OpenAIBatches(
                client=client,
                base_url=base_url,
                api_key=api_key,
                model=model,
                params=params or {},
                completion_window=completion_window,
            )
        else:
            self._api = AnthropicBatches(
                client=client, base_url=base_url, api_key=api_key, model=model, params=params or {}
            )

    def __repr__(self) -> str:
        return f"ProviderBatch(provider={self.provider!r}, model={self.model!r})"

    async def run(
        self,
        subgraph: Any,
        inputs: Sequence[tuple[int, Any]],
        *,
        total: int,
        config: RunnableConfig,
    ) -> AsyncIterator[RemoteEvent]:
        """Submit every input as one batch, wait for it, report each sibling in input order.

        `subgraph` is not called: it is what runs the siblings without this executor.
        """
        items: list[tuple[str, list[BaseMessage]]] = []
        shapes: dict[str, tuple[int, Any]] = {}
        for index, sibling_input in inputs:
            cid = f"s{index}"
            try:
                items.append((cid, _messages(sibling_input)))
                shapes[cid] = (index, sibling_input)
            except (TypeError, ValueError, KeyError, NotImplementedError) as exc:
                yield RemoteEvent(index=index, kind="failed", value=_error_value(exc))
        if not items:
            return
        batch_id = await self._api.submit(items)
        logger.info(
            "ProviderBatch: %s batch %s submitted with %d items",
            self.provider,
            batch_id,
            len(items),
            extra={"lgb_batch_id": batch_id, "lgb_items": len(items)},
        )
        for cid in shapes:
            yield RemoteEvent(index=shapes[cid][0], kind="started")
        cut_off = False
        try:
            cut_off = await self._wait(batch_id)
        except BaseException:
            await self._cancel_quietly(batch_id)
            raise
        answers = await self._api.results(batch_id, cut_off=cut_off)
        whole = answers.pop("", None)  # the batch failed as a whole
        for cid, (index, sibling_input) in shapes.items():
            answer = answers.get(cid, whole)
            if answer is None:
                answer = ProviderBatchError(
                    f"{self.provider} batch {batch_id} returned nothing for item {cid}",
                    batch_id=batch_id,
                    custom_id=cid,
                )
            if isinstance(answer, AIMessage):
                yield RemoteEvent(index=index, kind="finished", value=_value(sibling_input, answer))
            else:
                yield RemoteEvent(index=index, kind="failed", value=_error_value(answer))

    async def _wait(self, batch_id: str) -> bool:
        """Poll until the batch ends; True when the deadline cut it off (it was cancelled)."""
        start = time.monotonic()
        while not await self._api.ended(batch_id):
            left = None if self.deadline is None else self.deadline - (time.monotonic() - start)
            if left is not None and left <= 0:
                logger.info("ProviderBatch: batch %s passed its deadline; cancelling", batch_id)
                await self._api.cancel(batch_id)
                grace = time.monotonic() + _CANCEL_GRACE_S
                # The provider ends a cancelled batch when it gets to it: poll.
                while not await self._api.ended(batch_id):
                    if time.monotonic() >= grace:
                        break
                    await asyncio.sleep(self.poll_interval)
                return True
            await asyncio.sleep(
                self.poll_interval if left is None else min(left, self.poll_interval)
            )
        return False

    async def _cancel_quietly(self, batch_id: str) -> None:
        """The run was cancelled: cancel the batch too (shielded, bounded, never raising)."""
        try:
            async with asyncio.timeout(10.0):
                await asyncio.shield(self._api.cancel(batch_id))
        except BaseException:  # the caller re-raises what stopped it
            logger.warning("ProviderBatch: could not cancel batch %s", batch_id)


def _messages(sibling_input: Any) -> list[BaseMessage]:
    raw = sibling_input["messages"] if isinstance(sibling_input, Mapping) else sibling_input
    if isinstance(raw, str | BaseMessage):
        raw = [raw]
    return list(convert_to_messages(raw))


def _value(sibling_input: Any, answer: AIMessage) -> Any:
    if isinstance(sibling_input, Mapping):
        return {**sibling_input, "messages": [*_messages(sibling_input), answer]}
    return answer


def _error_value(exc: BaseException) -> dict[str, Any]:
    retryable = getattr(exc, "is_retryable", False)
    return {
        "error_type": type(exc).__name__,
        "message": str(exc),
        "retryable": bool(retryable),
        "traceback": None,
    }
