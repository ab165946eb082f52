"""The issues' goals for each workload, evaluated from a run's JSON numbers only.

Issue 18's for W1, W2, W3, W8 and W9; issue 25's for W10, W11 and W8o; issue 9's
other ones for W1 and W6, on the recalibrated emulator; the earlier ones for W5
and W7; issue 24's for the scaled W8s on a real engine (W1s and W3s carry W1's
and W3's). Every goal is reported with its measured ratio, met or not, beside
what the `ideal` bound itself achieves where that caps what any client can
reach. The research harness adds them to each result (`benchmarks.extension`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from benchmarks.routers.process import split_router
from langgraph_batch.bench.report import _num, _ratio

__all__ = ("LGB", "PUBLIC_SHAPES", "SCALED_GOALS", "best_bounded", "goals")

LGB = "langgraph-batch"


def _prefill_goal(lgb: Mapping[str, Any] | None, ideal: Mapping[str, Any] | None) -> dict[str, Any]:
    """The prefill the server computed for langgraph-batch, against the minimum (<= 1.2x)."""
    computed = _num(lgb, "prefill_tokens_computed")
    minimum = _num(ideal, "min_prefill_tokens")
    ratio = _ratio(computed, minimum)
    return {
        "goal": "prefill computed <= 1.2x the minimum (every context token once)",
        "measured": ratio,
        "limit": 1.2,
        "met": None if ratio is None else ratio <= 1.2,
        "detail": {"computed": computed, "minimum": minimum},
    }


def _goal(
    text: str,
    lgb: Mapping[str, Any] | None,
    other: Mapping[str, Any] | None,
    key: str,
    limit: float,
    ideal: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    measured = _ratio(_num(lgb, key), _num(other, key))
    out = {
        "goal": text,
        "measured": measured,
        "limit": limit,
        "met": None if measured is None else measured <= limit,
    }
    if ideal is not None and key == "makespan_s":
        # What the lower bound itself achieves against the same contender: a
        # limit below it cannot be met by any client on this cost model.
        out["ideal_ratio"] = _ratio(_num(ideal, key), _num(other, key))
    return out


def _best_bounded_goal(
    contenders: Mapping[str, Mapping[str, Any]],
    limit: float,
    *,
    claim: str | None = None,
    metric: str = "makespan_s",
) -> dict[str, Any]:
    """langgraph-batch's `metric` against the best of the naive-bounded sweep (<= `limit`x).

    `claim` words the goal, `{best}` standing for the sweep's best contender (default:
    "makespan <= Kx the best naive-bounded ({best})"); the bound stands beside makespan
    goals only.
    """
    best = best_bounded(contenders)
    claim = claim or f"makespan <= {limit:g}x the best naive-bounded ({{best}})"
    return _goal(
        claim.format(best=best),
        contenders.get(LGB),
        contenders.get(best) if best else None,
        metric,
        limit,
        contenders.get("ideal") if metric == "makespan_s" else None,
    )


def _tail_goal(lgb: Mapping[str, Any] | None) -> dict[str, Any]:
    """No straggler tail: the last 5% of siblings finish within 5% of the makespan.

    On the real vLLM the 4 siblings admitted last decoded alone for the last
    2 s of 18 (issue 9): makespan - p95 was 11% of the makespan.
    """
    makespan, p95 = _num(lgb, "makespan_s"), _num(lgb, "latency_p95_s")
    measured = None if makespan is None or p95 is None or makespan <= 0 else 1 - p95 / makespan
    return {
        "goal": "no straggler tail: makespan - p95 sibling latency <= 5% of makespan",
        "measured": measured,
        "limit": 0.05,
        "met": None if measured is None else measured <= 0.05,
    }


def best_bounded(contenders: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The `naive-bounded*` contender with the shortest makespan (a sweep's best), if any."""
    runs = [
        (m, name)
        for name, entry in contenders.items()
        if name.startswith("naive-bounded")
        and split_router(name)[1] is None
        and (m := _num(entry, "makespan_s")) is not None
    ]
    return min(runs)[1] if runs else None


def _preemption_goal(
    lgb: Mapping[str, Any] | None, naive: Mapping[str, Any] | None
) -> dict[str, Any]:
    mine, theirs = _num(lgb, "preemptions"), _num(naive, "preemptions")
    return {
        "goal": "0 preemptions",
        "measured": mine,
        "limit": 0.0,
        "met": None if mine is None else mine == 0,
        "detail": {
            "langgraph-batch": mine,
            "naive": theirs,
            "evictions": {
                "langgraph-batch": _num(lgb, "evictions"),
                "naive": _num(naive, "evictions"),
            },
        },
    }


def _long_horizon_goals(
    workload: str, contenders: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Issue 18's goals for W8 (long-horizon agents) and W9 (a simulation loop)."""
    lgb = contenders.get(LGB)
    c = contenders.get
    ideal = c("ideal")
    out = [_goal("makespan <= 1.15x the KV-valid bound", lgb, ideal, "makespan_s", 1.15)]
    if workload == "W8":
        out.append(_goal("makespan <= 0.5x naive", lgb, c("naive"), "makespan_s", 0.5, ideal))
        out.append(_best_bounded_goal(contenders, 0.65))
    else:
        # Issue 25 asks W9 for 1.2x (issue 18's 1.15x above stays on record).
        out.append(_goal("makespan <= 1.2x the KV-valid bound", lgb, ideal, "makespan_s", 1.2))
        out.append(_goal("makespan < naive", lgb, c("naive"), "makespan_s", 0.9999, ideal))
        out.append(
            _best_bounded_goal(
                contenders, 0.9999, claim="makespan < the best naive-bounded ({best})"
            )
        )
    out.append(_prefill_goal(lgb, ideal))
    out.append(_preemption_goal(lgb, c("naive")))
    if workload == "W8":
        out.append(_goal("p95 sibling latency <= naive's", lgb, c("naive"), "latency_p95_s", 1.0))
    return out


PUBLIC_SHAPES = ("W10", "W11")
"""Issue 25's public long-horizon shapes beside W8: a heavy tool tail, long agents with
fast tools."""


def _public_shape_goals(contenders: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Issue 25's goals for W10 and W11 (item 5), each beside what the bound itself reaches."""
    lgb = contenders.get(LGB)
    c = contenders.get
    ideal = c("ideal")
    return [
        _best_bounded_goal(contenders, 0.85),
        _goal("makespan <= 1.25x the KV-valid bound", lgb, ideal, "makespan_s", 1.25),
        _prefill_goal(lgb, ideal),
        _preemption_goal(lgb, c("naive")),
        _best_bounded_goal(
            contenders,
            1.0,
            claim="p95 sibling latency <= the best naive-bounded's ({best})",
            metric="latency_p95_s",
        ),
    ]


def _offload_goals(contenders: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Issue 25's goal for W8 on a server with a second KV tier (W8o), and the sweep's.

    The bound is the KV-valid one computed with the tier (`kv_bound.agents_bound`'s
    `offload_tokens`): a paused context parked in host memory comes back free.
    """
    lgb = contenders.get(LGB)
    c = contenders.get
    return [
        _goal(
            "makespan <= 1.15x the KV-valid bound with the tier",
            lgb,
            c("ideal"),
            "makespan_s",
            1.15,
        ),
        _best_bounded_goal(contenders, 0.85),
        _preemption_goal(lgb, c("naive")),
    ]


SCALED_GOALS = {"W1s": "W1", "W3s": "W3"}
"""Scaled workloads (the `cpu-tiny` engine's sizes) carry their original's goals; W8s has
issue 24's own (`_scaled_w8_goals`)."""


def _scaled_w8_goals(contenders: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Issue 24's goals for scaled W8 on a real engine."""
    lgb = contenders.get(LGB)
    c = contenders.get
    ideal = c("ideal")
    out = [
        _preemption_goal(lgb, c("naive")),
        _goal("makespan <= 0.6x naive", lgb, c("naive"), "makespan_s", 0.6, ideal),
        _best_bounded_goal(contenders, 0.9),
    ]
    out.append(_prefill_goal(lgb, ideal))
    return out


def goals(
    workload: str, contenders: Mapping[str, Mapping[str, Any]], n: int
) -> list[dict[str, Any]]:
    """The issue's goals for `workload`, each with its measured ratio and whether it is met.

    `met` is None when a contender needed for the goal is missing or failed.
    """
    lgb = contenders.get(LGB)
    c = contenders.get
    ideal = c("ideal")
    out: list[dict[str, Any]] = []
    if workload == "W8s":
        return _scaled_w8_goals(contenders)
    workload = SCALED_GOALS.get(workload, workload)
    if workload == "W1":
        out.append(_goal("makespan <= 0.75x naive", lgb, c("naive"), "makespan_s", 0.75, ideal))
        out.append(
            _goal(
                "makespan <= 0.70x naive-bounded", lgb, c("naive-bounded"), "makespan_s", 0.7, ideal
            )
        )
        out.append(
            _goal("makespan <= 0.75x batchagent", lgb, c("batchagent"), "makespan_s", 0.75, ideal)
        )
        out.append(_goal("makespan <= 1.05x ideal", lgb, c("ideal"), "makespan_s", 1.05))
        out.append(
            _goal("p50 sibling latency <= 0.7x naive's", lgb, c("naive"), "latency_p50_s", 0.7)
        )
        out.append(_tail_goal(lgb))
        executed = _num(lgb, "tool_calls_executed")
        distinct = _num(lgb, "tool_distinct_keys")
        out.append(
            {
                "goal": "tool executions = distinct keys",
                "measured": _ratio(executed, distinct),
                "limit": 1.0,
                "met": None if executed is None or distinct is None else executed == distinct,
                "detail": {"executed": executed, "distinct_keys": distinct},
            }
        )
    elif workload == "W2":
        out.append(_goal("makespan <= 1.10x ideal", lgb, c("ideal"), "makespan_s", 1.1))
        out.append(
            _goal("makespan < batchagent", lgb, c("batchagent"), "makespan_s", 0.9999, ideal)
        )
    elif workload == "W3":
        out.append(_goal("makespan <= 1.10x ideal", lgb, c("ideal"), "makespan_s", 1.1))
        out.append(
            _goal(
                "prefill tokens computed <= 0.5x naive's",
                lgb,
                c("naive"),
                "prefill_tokens_computed",
                0.5,
            )
        )
        out.append(_preemption_goal(lgb, c("naive")))
    elif workload in ("W8", "W9"):
        out += _long_horizon_goals(workload, contenders)
    elif workload in PUBLIC_SHAPES:
        out += _public_shape_goals(contenders)
    elif workload == "W8o":
        out += _offload_goals(contenders)
    elif workload == "W6":
        out.append(_goal("makespan <= 0.70x naive", lgb, c("naive"), "makespan_s", 0.7, ideal))
    elif workload == "W7":
        for name in (LGB, "langgraph-batch-fan-out"):
            entry = c(name)
            measured = _ratio(_num(ideal, "makespan_s"), _num(entry, "makespan_s"))
            out.append(
                {
                    "goal": f"{name}: throughput >= 90% of the ideal bound",
                    "measured": measured,
                    "limit": 0.9,
                    "met": None if measured is None else measured >= 0.9,
                    "note": "measured = ideal makespan / contender makespan (higher is better)",
                }
            )
    elif workload == "W5":
        out.append(
            _goal(
                "client CPU per sibling <= 1.2x plain Send + ChatOpenAI",
                lgb,
                c("naive"),
                "client_cpu_s",
                1.2,
            )
        )
    return out
