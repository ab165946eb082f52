"""Check a workload's bound against a linear program over engine step shapes.

`ideal`/`kv_bound` price the whole job's work as if it were spread evenly over
the cheapest number of identical steps. A real schedule may mix steps: some
prefill-heavy, some decoding at one batch size, others at another. This LP
finds the cheapest mix, so it tells whether the even spread is a lower bound
(the LP can only be cheaper or equal; when it is cheaper, the even spread is
too high by that much and the LP figure is the bound to trust).

Variables, for every step shape of the grid (prefill tokens p in a step,
decoding sequences B): how many such steps run (y), and how many KV tokens
those steps read (z). Each step costs the profile's own `step_time` for
(p, B) with no KV read, plus the KV read at the profile's cost per token for
B decodes. Constraints: the steps prefill every prefill token and decode
every output token; they read every KV token the decodes must read; a step
reads at most what is resident (the KV capacity, with the shared prefix read
by every sequence but held once) and, per decoding sequence, at least the
shortest context any turn of the job decodes with; no step decodes more
sequences than there are siblings; there are at least as many steps as the longest sibling's output
(its tokens come one per step). Prefill attention has no batching effect
(FLOPs): its total time is added as a constant. KV-valid by construction:
every real schedule's steps are a feasible point, whatever it recomputes
(recomputed tokens only add prefill), so the LP value plus nothing is a lower
bound on the work; the makespan bound is max(LP, the critical path).

    python -m benchmarks.bound_lp W8          # prints the LP beside kv_bound's figures
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from benchmarks.contenders import kv_bound
from langgraph_batch.bench.workloads import WORKLOADS, Workload, system_prompt
from langgraph_batch.emulator.costs import StepShape, get_profile

PREFILL_GRID = (
    0,
    16,
    32,
    64,
    128,
    192,
    256,
    384,
    512,
    768,
    1024,
    1536,
    2048,
    3072,
    4096,
    6144,
    8192,
)
"""Prefill tokens per step, up to vLLM's 8,192-token budget: every knot of the profiles'
linear part, between which a step's cost is linear in its tokens (so mixes of grid
shapes price every shape in between: the grid loses nothing)."""
DECODE_GRID = (0, 1, 2, 4, 8, 12, 16, 20, 24, 32, 48, 64, 96, 128, 192, 256)
"""Decoding sequences per step (the decode cost's knots: 16, 32, 64, 96, 256)."""


def totals(wl: Workload, *, n: int, seed: int) -> dict[str, float]:
    """The work of a tool-agent workload: tokens and reads, as `kv_bound` counts them."""
    system = system_prompt(wl, seed)
    work = kv_bound._Work()
    shared = 0
    least = None
    for i in range(n):
        shared, turns = kv_bound.agent_turns(wl, i, seed, system)
        work.chain = max(work.chain, sum(t.out for t in turns))
        for t in turns:
            work.add_turn(t, shared)
            least = t.prompt if least is None else min(least, t.prompt)
    return {
        "least_context": float(least or 0),
        "prefill": work.prefill + shared,
        "attn": work.attn + shared * shared / 2,
        "decode": work.decode,
        "decode_kv": work.decode_kv,
        "chain": work.chain,
        "shared": shared,
    }


def _kv_ns(profile: Any, decodes: int) -> float:
    """Seconds per KV token read in a step of `decodes` decoding sequences."""
    base = StepShape(num_tokens=decodes, num_seqs=decodes, num_sampled=decodes, num_decodes=decodes)
    probe = StepShape(
        num_tokens=decodes,
        num_seqs=decodes,
        num_sampled=decodes,
        num_decodes=decodes,
        decode_kv_tokens=1_000_000,
    )
    return (profile.step_time(probe) - profile.step_time(base)) / 1_000_000


def lp_bound(wl: Workload, *, n: int, seed: int) -> dict[str, Any]:
    """The LP's least engine time for the job's work (and its shapes), in seconds."""
    from scipy.optimize import linprog

    profile = get_profile(wl.profile)
    capacity = wl.kv_tokens if wl.kv_tokens is not None else profile.kv_tokens
    t = totals(wl, n=n, seed=seed)
    # No more sequences decode in a step than there are siblings.
    decodes = sorted({b for b in DECODE_GRID if b <= n} | {n})
    shapes = [(p, b) for p in PREFILL_GRID for b in decodes if p or b]
    k = len(shapes)
    # Variables: y_0..y_{k-1} (steps of each shape), z_0..z_{k-1} (KV tokens they read).
    cost = []
    for p, b in shapes:
        seqs = b + (1 if p else 0)  # the cheapest: one prefill chunk per step
        shape = StepShape(num_tokens=p + b, num_seqs=seqs, num_sampled=seqs, num_decodes=b)
        cost.append(profile.step_time(shape))
    cost += [_kv_ns(profile, b) if b else 0.0 for _, b in shapes]
    a_ub: list[list[float]] = []
    b_ub: list[float] = []

    def row(ys: list[float], zs: list[float]) -> list[float]:
        return [*ys, *zs]

    zero = [0.0] * k
    # Cover the prefill and the decode tokens, and every KV read (>= as <= of negatives).
    a_ub.append(row([-float(p) for p, _ in shapes], zero))
    b_ub.append(-t["prefill"])
    a_ub.append(row([-float(b) for _, b in shapes], zero))
    b_ub.append(-t["decode"])
    a_ub.append(row(zero, [-1.0] * k))
    b_ub.append(-t["decode_kv"])
    a_ub.append(row([-1.0] * k, zero))
    b_ub.append(-t["chain"])
    # Per shape: reads at most what is resident, and at least, per decoding sequence,
    # the shortest context any turn decodes with (the shared prefix and its task).
    for i, (_, b) in enumerate(shapes):
        most = [0.0] * k
        most[i] = -float(max(0, capacity - t["shared"]) + b * t["shared"]) if b else 0.0
        zi = [0.0] * k
        zi[i] = 1.0
        a_ub.append(row(most, zi))
        b_ub.append(0.0)
        if b:
            least = [0.0] * k
            least[i] = float(b * t["least_context"])
            a_ub.append(row(least, [-v for v in zi]))
            b_ub.append(0.0)
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=[(0, None)] * (2 * k), method="highs")
    if res.status != 0:
        raise RuntimeError(f"the LP did not solve: {res.message}")
    attn_s = (
        4.0
        * profile.layers
        * profile.hidden
        * t["attn"]
        / (profile.peak_flops * profile.attn_flops_efficiency)
    )
    used = sorted(
        ((shapes[i], round(res.x[i])) for i in range(k) if res.x[i] > 0.5), key=lambda s: -s[1]
    )
    return {
        "lp_work_s": res.fun + attn_s,
        "attention_s": attn_s,
        "shapes": [{"prefill": p, "decodes": b, "steps": y} for (p, b), y in used[:8]],
        "totals": t,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bound_lp", description=__doc__)
    parser.add_argument("workload", choices=[w for w, wl in WORKLOADS.items() if wl.tools])
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    wl = WORKLOADS[args.workload]
    n = args.n or wl.n
    lp = lp_bound(wl, n=n, seed=args.seed)
    bound = kv_bound.agents_bound(wl, n=n, seed=args.seed)
    out = {
        "workload": wl.id,
        "n": n,
        "kv_bound_work_s": bound["work_bound_s"],
        "lp_work_s": lp["lp_work_s"],
        "lp_over_even_spread": lp["lp_work_s"] / bound["work_bound_s"],
        "critical_path_s": bound["critical_path_s"],
        "bound_s": bound["makespan_s"],
        "lp_bound_s": max(lp["lp_work_s"], bound["critical_path_s"]),
        "lp_shapes": lp["shapes"],
    }
    sys.stdout.write(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
