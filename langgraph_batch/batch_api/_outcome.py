"""What an item that never ran becomes, for either provider's batch API.

One rule for both: an item the provider expired, or cancelled because our
`deadline` ran out, is a `BatchItemExpiredError` (retryable: send it again);
one cancelled for another reason is a `BatchItemCanceledError`.
"""

from __future__ import annotations

from langgraph_batch.errors import BatchItemCanceledError, BatchItemExpiredError

__all__ = ("unran",)


def unran(
    provider: str,
    batch_id: str,
    custom_id: str,
    *,
    expired: bool,
    cancelled: bool,
    cut_off: bool,
    window: str,
) -> Exception | None:
    """The error of an item that did not run (None: it ran, or failed otherwise).

    Args:
        provider: "OpenAI" or "Anthropic", for the message.
        batch_id: the provider's batch id.
        custom_id: the item's id in the batch.
        expired: the provider says the item expired.
        cancelled: the provider says the batch was cancelled before the item ran.
        cut_off: we cancelled the batch because its `deadline` passed.
        window: the provider's name for its own time limit, for the message.
    """
    if expired or (cancelled and cut_off):
        why = "its deadline" if cut_off else window
        return BatchItemExpiredError(
            f"{provider} batch {batch_id}: item {custom_id} did not run before {why} ran out; "
            f"send it again (a new batch, or synchronously)",
            batch_id=batch_id,
            custom_id=custom_id,
        )
    if cancelled:
        return BatchItemCanceledError(
            f"{provider} batch {batch_id} was cancelled before item {custom_id} ran",
            batch_id=batch_id,
            custom_id=custom_id,
        )
    return None
