"""Sample traces in the formats `bench --replay --format` imports, and their replays.

`python -m benchmarks.replay_formats` writes, deterministically (no
randomness), one small agent job in each format to
`benchmarks/results/replay_formats/` (`mooncake.jsonl`, `kvtrace.json`,
`tracelab.csv`) and replays each on the emulator with
`langgraph-batch bench --replay FILE --format F` into `<dir>/<format>/`
(`replay.json`, `replay.md`). `--no-run` only writes the files.

The job: 4 sessions of 3 turns; every session's first prompt is a shared
4096-token system prompt plus a 1024- or 2048-token task; each later turn
appends 1024 or 2048 tokens (the reply and the tool result) to the previous
prompt (append-only; resets and start offsets are covered by
`tests/integration/test_replay_formats.py`); outputs of 60-100 tokens; waits of 0.4-1.0 s between
turns. Prompt lengths are whole 512-token blocks, so the hash ids carry them
exactly. In kvtrace the sessions are one trace's main agent and three
sub-agents (64-token blocks).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from langgraph_batch.record._trace_formats import TRACELAB_COLUMNS, estimated_duration

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "replay_formats"
SESSIONS, TURNS, SHARED = 4, 3, 4096
FILES = {"mooncake": "mooncake.jsonl", "kvtrace": "kvtrace.json", "tracelab": "tracelab.csv"}


def job() -> list[list[dict[str, Any]]]:
    """Per session and turn: `input`, `output`, `wait` (s, after the turn), `start` (s)."""
    out = []
    for i in range(SESSIONS):
        turns, prompt, t = [], SHARED + 1024 * (1 + i % 2), 0.0
        for k in range(TURNS):
            output = 60 + 20 * ((i + k) % 3)
            wait = 0.4 + 0.2 * ((i * TURNS + k) % 4) if k + 1 < TURNS else 0.0
            turns.append({"input": prompt, "output": output, "wait": wait, "start": t})
            t += estimated_duration(prompt, output) + wait
            prompt += 1024 * (1 + (i + k) % 2)
        out.append(turns)
    return out


def _hash_ids(sessions: list[list[dict[str, Any]]], block: int) -> list[list[list[int]]]:
    """Hash ids per session and turn: the shared blocks, then each session's own, appended."""
    shared = list(range(SHARED // block))
    nxt = len(shared)
    out = []
    for turns in sessions:
        ids = list(shared)
        per = []
        for turn in turns:
            while len(ids) * block < turn["input"]:
                ids.append(nxt)
                nxt += 1
            per.append(list(ids))
        out.append(per)
    return out


def mooncake() -> str:
    """The job as Mooncake JSONL (timestamps in ms, by time)."""
    sessions = job()
    ids = _hash_ids(sessions, 512)
    rows = [
        (round(turn["start"] * 1000), i, k, turn)
        for i, turns in enumerate(sessions)
        for k, turn in enumerate(turns)
    ]
    lines = []
    for stamp, i, k, turn in sorted(rows, key=lambda r: r[:3]):
        row = {"timestamp": stamp, "input_length": turn["input"],
               "output_length": turn["output"], "hash_ids": ids[i][k]}  # fmt: skip
        lines.append(json.dumps(row))
    return "\n".join(lines) + "\n"


def kvtrace() -> str:
    """The job as one kvtrace trace: session 0 the main agent, the others its sub-agents."""
    sessions = job()
    ids = _hash_ids(sessions, 64)

    def requests(i: int) -> list[dict[str, Any]]:
        return [
            {
                "t": round(turn["start"], 4),
                "in": turn["input"],
                "out": turn["output"],
                "hash_ids": ids[i][k],
                "think_time": turn["wait"],
                "stop": "tool_use" if k + 1 < TURNS else "end_turn",
            }
            for k, turn in enumerate(sessions[i])
        ]

    trace = {
        "id": "sample-0001",
        "block_size": 64,
        "hash_id_scope": "local",
        "requests": requests(0),
        "subagents": [{"start": 0.0, "requests": requests(i)} for i in range(1, SESSIONS)],
    }
    return json.dumps([trace], indent=1) + "\n"


def tracelab() -> str:
    """The job as TraceLab's replay CSV (`prefix_len`: the shared prompt, then the previous
    round's input and output)."""
    lines = [",".join(TRACELAB_COLUMNS)]
    for i, turns in enumerate(job()):
        for k, turn in enumerate(turns):
            prev = turns[k - 1] if k else None
            prefix = prev["input"] + prev["output"] if prev else SHARED
            wait_ms = round(turn["wait"] * 1000)
            lines.append(f"s{i},{k},{prefix},{turn['input']},{turn['output']},{wait_ms}")
    return "\n".join(lines) + "\n"


def write(out: Path = OUT) -> dict[str, Path]:
    """Write the three sample files; returns their paths by format."""
    out.mkdir(parents=True, exist_ok=True)
    makers = {"mooncake": mooncake, "kvtrace": kvtrace, "tracelab": tracelab}
    paths = {}
    for fmt, name in FILES.items():
        paths[fmt] = out / name
        paths[fmt].write_text(makers[fmt]())
    return paths


def main(argv: list[str] | None = None) -> int:
    """Write the samples and (unless `--no-run`) replay each on the emulator."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--no-run", action="store_true", help="only write the sample files")
    args = parser.parse_args(argv)
    paths = write(args.out)
    if args.no_run:
        return 0
    for fmt, path in paths.items():
        shown = path.resolve()
        if shown.is_relative_to(ROOT):  # the results name the file as a checkout has it
            shown = shown.relative_to(ROOT)
        cmd = [
            sys.executable, "-m", "benchmarks.bench", "--replay", str(shown),
            "--format", fmt, "--contenders", "naive,langgraph-batch,ideal",
            "--out", str(args.out.resolve() / fmt),
        ]  # fmt: skip
        proc = subprocess.run(cmd, check=False, cwd=ROOT)
        if proc.returncode:
            return proc.returncode
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
