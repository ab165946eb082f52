"""`bench --replay FILE --price prices.json`: what the replayed job costs three ways.

- `naive`: every call synchronous, no prompt cache: every prompt token at the
  input price (the tokens the `naive` contender sent; the recording's when it
  did not run).
- `batched with caching`: langgraph-batch's run, its measured cache hits
  priced as cache reads, and the shared prefix written to the cache once
  (a 5-minute write: an estimate, the emulator does not report writes;
  with OpenAI's rules a write costs the input price, so it changes nothing).
- `provider batch API`: the naive tokens at the batch discount; only for a
  job whose siblings are single-turn without tools (W7's shape), the only
  kind `ProviderBatch` sends.

Prices come from the user's table (`langgraph_batch.pricing.PriceTable`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langgraph_batch.pricing import PriceTable, Pricing, TokenUsage

__all__ = ("cost_markdown", "replay_costs")


def _tokens(entry: Mapping[str, Any]) -> tuple[int, int, int]:
    return (
        int(entry.get("prompt_tokens") or 0),
        int(entry.get("cached_tokens") or 0),
        int(entry.get("generation_tokens") or 0),
    )


def _source(result: Mapping[str, Any], *names: str) -> tuple[str, Mapping[str, Any]]:
    contenders = result.get("contenders") or {}
    for name in names:
        entry = contenders.get(name)
        if entry and "error" not in entry and entry.get("prompt_tokens") is not None:
            return name, entry
    return "recorded", result["recorded"]


def replay_costs(
    result: Mapping[str, Any], table: PriceTable, *, model: str | None = None
) -> dict[str, Any]:
    """The three costs of a replay result (`replay_run.run_replay`'s dict).

    Args:
        result: the replay's results.
        table: the user's prices.
        model: the model to price as (None: the recording's, else the table's only one).

    Raises:
        ValueError: the table has no price for the model.
    """
    header = result.get("params", {}).get("recording_header") or {}
    model = model or header.get("model")
    pricing = table.find(model)
    if pricing is None:
        raise ValueError(
            f"the price table has no model {model!r} ({sorted(table)}); name one with --price-model"
        )
    rec = result["recorded"]
    n = int(rec.get("siblings") or result.get("params", {}).get("n") or 0)
    single_turn = (
        int(rec.get("llm_requests") or 0) == n and int(rec.get("tool_calls_requested") or 0) == 0
    )
    naive_from, naive = _source(result, "naive", "naive-bounded")
    prompt, _, output = _tokens(naive)
    naive_usage = TokenUsage(input_tokens=prompt, output_tokens=output)
    lgb_from, lgb = _source(result, "langgraph-batch")
    l_prompt, l_cached, l_output = _tokens(lgb)
    shared = int(result.get("params", {}).get("shared_prefix_tokens") or 0)
    written = min(shared, max(0, l_prompt - l_cached)) if l_cached else 0
    lgb_usage = TokenUsage(
        input_tokens=l_prompt, output_tokens=l_output, cache_read=l_cached, cache_write_5m=written
    )
    rows: dict[str, Any] = {
        "naive": _row(pricing, naive_usage, naive_from, batch=False),
        "batched with caching": _row(pricing, lgb_usage, lgb_from, batch=False),
    }
    if not single_turn:
        why = "the job's siblings are not single-turn without tools"
        rows["provider batch API"] = {"usd": None, "why_not": why}
    elif not pricing.batch_discount:
        rows["provider batch API"] = {"usd": None, "why_not": "the model has no batch discount"}
    else:
        rows["provider batch API"] = _row(pricing, naive_usage, naive_from, batch=True)
    base = rows["naive"]["usd"]
    for row in rows.values():
        row["vs_naive"] = row["usd"] / base if row["usd"] is not None and base else None
    return {
        "model": model,
        "pricing": {k: getattr(pricing, k) for k in pricing.__slots__},
        "single_turn": single_turn,
        "cache_write_estimate_tokens": written,
        "rows": rows,
    }


def _row(pricing: Pricing, usage: TokenUsage, source: str, *, batch: bool) -> dict[str, Any]:
    cost = pricing.cost(usage, batch=batch)
    return {"usd": cost.total, "parts": cost.to_dict(), "tokens": usage.to_dict(), "from": source}


def cost_markdown(cost: Mapping[str, Any]) -> list[str]:
    """The cost table's Markdown lines."""
    lines = [
        "",
        f"Cost (prices from the user's table, model `{cost['model']}`):",
        "",
        "| path | USD | vs naive | tokens from |",
        "| --- | --- | --- | --- |",
    ]
    for name, row in cost["rows"].items():
        if row["usd"] is None:
            lines.append(f"| {name} | n/a | | {row['why_not']} |")
        else:
            ratio = "" if row["vs_naive"] is None else f"{row['vs_naive']:.3f}x"
            lines.append(f"| {name} | {row['usd']:.6f} | {ratio} | {row['from']} |")
    if cost.get("cache_write_estimate_tokens"):
        lines.append("")
        lines.append(
            f"Batched with caching: {cost['cache_write_estimate_tokens']} shared-prefix tokens "
            "priced as one 5-minute cache write (an estimate; the emulator reports no writes)."
        )
    return lines
