"""The research harness's reports: each workload's chart, and re-rendering saved results.

`chart` draws a workload's PNG (makespan and p95 sibling latency per
contender), which `benchmarks.extension.Research.written` adds beside the
JSON and Markdown `langgraph_batch.bench.report` writes; `rerender` recomputes
the ratios and goals of saved results (`python -m benchmarks.report DIR`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.extension import research
from benchmarks.goals import goals
from langgraph_batch.bench.report import LGB, _num, markdown, ratios, write

__all__ = ("chart", "rerender")


def chart(result: Mapping[str, Any], path: Path) -> None:
    """A PNG with makespan and p95 sibling latency per contender."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contenders: Mapping[str, Mapping[str, Any]] = result["contenders"]
    names = list(contenders)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    palette = {
        LGB: "#2a9d8f",
        "langgraph-batch-rr": "#76c7bd",
        "ideal": "#adb5bd",
        "naive": "#e76f51",
        "naive-bounded": "#f4a261",
        "batchagent": "#8d99ae",
        "langgraph-batch-fan-out": "#3fb8a9",
        "langgraph-batch-nobatch": "#9bd3cb",
        "abatch": "#e76f51",
        "abatch-bounded": "#f4a261",
    }
    for ax, key, title in (
        (axes[0], "makespan_s", "makespan (s, lower is better)"),
        (axes[1], "latency_p95_s", "p95 sibling latency (s, lower is better)"),
    ):
        values = [_num(contenders[n], key) for n in names]
        heights = [v if v is not None else 0.0 for v in values]
        colors = [palette.get(n, "#6c757d") for n in names]
        bars = ax.bar(range(len(names)), heights, color=colors)
        for bar, v, n in zip(bars, values, names, strict=True):
            label = "failed" if contenders[n].get("error") else ("n/a" if v is None else f"{v:.2f}")
            ax.annotate(
                label,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
    params = result["params"]
    server = params.get("server") or {}
    where = (
        f"{server.get('url')}, model {server.get('model')}"
        if server.get("live")
        else f"emulated {params.get('profile')}, time scale {params.get('time_scale')}"
    )
    fig.suptitle(f"{result['workload']} (N={params.get('n')}, {where})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rerender(out_dir: Path) -> None:
    """Recompute ratios and goals of every `<out>/W<n>.json` and rewrite its .md/.png.

    (`python -m benchmarks.report benchmarks/results` after a change to the goals.)

    Other runs kept beside them (`W8_router.json`) are left alone.
    """
    with research():  # the router sections and the charts
        _rerender(out_dir)


def _rerender(out_dir: Path) -> None:
    results = []
    for path in sorted(out_dir.glob("W*.json")):
        if not path.stem[1:].isdigit():
            continue
        result = json.loads(path.read_text())
        result["ratios"] = ratios(result["contenders"])
        result["goals"] = goals(result["workload"], result["contenders"], result["params"]["n"])
        write(result, out_dir)
        results.append(result)
    summary = out_dir / "SUMMARY.md"
    if summary.exists() and results:
        head = summary.read_text().splitlines()[0]
        summary.write_text(head + "\n\n" + "\n".join(markdown(r) for r in results))


if __name__ == "__main__":
    import sys

    rerender(Path(sys.argv[1]))
