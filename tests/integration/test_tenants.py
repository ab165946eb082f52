"""Two tenants in one process: each request carries its own model's credentials.

The emulator sits behind a recording proxy (`tests/faultproxy.py`), so the
test asserts on what the server received. Before, schedulers were keyed by
URL only: the second model sent the first model's key.
"""

from __future__ import annotations

import asyncio
import json

from langgraph_batch.chat_model import BatchedChatModel
from tests.faultproxy import FaultProxy

MODEL = "emulated-llama-3-8b"


async def test_two_keys_one_server_one_loop_each_sends_its_own(emulator_url: str) -> None:
    async with FaultProxy(emulator_url) as proxy:
        url = proxy.url.replace("http://", "vllm://")
        tenants = {
            "a": BatchedChatModel(model=MODEL, base_url=url, api_key="sk-tenant-a", max_tokens=8),
            "b": BatchedChatModel(
                model=MODEL,
                base_url=url,
                api_key="sk-tenant-b",
                max_tokens=8,
                default_headers={"X-Tenant": "b"},
                default_query={"tenant": "b"},
            ),
        }
        streaming_b = tenants["b"].model_copy(update={"streaming": True})
        await asyncio.gather(
            *(tenants[t].ainvoke(f"tenant={t} call={i}") for i in range(10) for t in "ab"),
            *(streaming_b.ainvoke(f"tenant=b call=s{i}") for i in range(5)),
        )
        chats = [s for s in proxy.seen if s.path.startswith("/v1/chat/completions")]
        prompts = []
        for seen in chats:
            messages = json.loads(seen.body)["messages"]
            # A batch call carries several conversations: they must all be one tenant's.
            convs = messages if seen.path.startswith("/v1/chat/completions/batch") else [messages]
            tenants_in_call = {c[-1]["content"].split()[0].removeprefix("tenant=") for c in convs}
            assert len(tenants_in_call) == 1, convs
            tenant = tenants_in_call.pop()
            prompts += [c[-1]["content"] for c in convs]
            assert seen.headers["authorization"] == f"Bearer sk-tenant-{tenant}", convs
            if tenant == "b":
                assert seen.headers["x-tenant"] == "b"
                assert seen.path.endswith("?tenant=b")
            else:
                assert "x-tenant" not in seen.headers
                assert "?" not in seen.path
        assert len(prompts) == 25
        # Metrics polls carry the credentials of the scheduler that makes them.
        polls = [s for s in proxy.seen if s.path.startswith("/metrics")]
        assert {s.headers.get("authorization") for s in polls} <= {
            "Bearer sk-tenant-a",
            "Bearer sk-tenant-b",
        }
        schedulers = {t: m.get_scheduler() for t, m in tenants.items()}
        assert schedulers["a"] is not schedulers["b"]
        assert streaming_b.get_scheduler() is schedulers["b"]
        for s in schedulers.values():
            await s.aclose()
