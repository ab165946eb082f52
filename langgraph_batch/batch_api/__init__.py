"""Provider batch APIs for fan_outs that can wait: half price, results in hours not seconds.

`fan_out(model, ..., executor=ProviderBatch(provider="openai", model="..."))`
sends every sibling as one item of OpenAI's Batch API (`/v1/files` +
`/v1/batches`) or Anthropic's Message Batches (`/v1/messages/batches`),
polls until the batch ends, and returns the answers in input order. It fits
siblings that are ONE model call with no tools (WORKLOADS.md's W7:
extractions, classifications, summaries); a sibling that needs a tool or a
second turn needs the synchronous path.

Items the provider failed, that expired or that the `deadline` cut off end as
typed errors at the sibling (`BatchItemFailedError`, `BatchItemExpiredError`,
`BatchItemCanceledError`; `fan_out`'s `SiblingError` names them). Calls go
through the official `openai` / `anthropic` SDKs
(`pip install 'langgraph-batch[batch-api]'`).
"""

from __future__ import annotations

from langgraph_batch.batch_api._executor import ProviderBatch

__all__ = ("ProviderBatch",)
