"""What the emulator tells a benchmark about requests: `/metrics` phases, `/emulator/requests`."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

import httpx

MODEL = "emulated-llama-3-8b"


def _sample(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m:
            total += float(m.group(2))
    return total


async def test_phase_histograms_and_per_request_phases(start_emulator: Callable[..., str]) -> None:
    url = await asyncio.to_thread(start_emulator, time_scale=20.0)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        stats0 = (await client.get("/emulator/stats")).json()
        bodies = [
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"task {i}"}],
                "max_tokens": 30,
                "ignore_eos": True,
            }
            for i in range(6)
        ]
        rs = await asyncio.gather(*(client.post("/v1/chat/completions", json=b) for b in bodies))
        assert all(r.status_code == 200 for r in rs)
        text = (await client.get("/metrics")).text
        phases = (await client.get("/emulator/requests", params={"since": 0})).json()
        later = (await client.get("/emulator/requests", params={"since": 1e9})).json()
        bad = await client.get("/emulator/requests", params={"since": "x"})
    for name in ("queue", "prefill", "decode", "inference"):
        assert _sample(text, f"vllm:request_{name}_time_seconds_count") == 6, name
    assert _sample(text, "vllm:request_decode_time_seconds_sum") > 0
    success = 'vllm:request_success_total{model_name="%s",engine="0",finished_reason="length"} 6'
    assert success % MODEL in text
    rows = [dict(zip(phases["fields"], r, strict=True)) for r in phases["requests"]]
    assert len(rows) == 6
    for row in rows:
        assert row["arrival"] >= stats0["engine_time_s"]
        assert row["arrival"] <= row["first_scheduled"] <= row["first_token"] <= row["finish"]
        assert row["output_tokens"] == 30
        assert row["preemptions"] == 0
    assert later["requests"] == []
    assert bad.status_code == 400
