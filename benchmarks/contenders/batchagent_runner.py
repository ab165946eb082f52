"""Contender `batchagent`: the BatchAgent SDK (batch-agent==0.2.0), the prior art.

Runs inside its own virtual environment (`benchmarks/.venv-batchagent` in a
checkout, else under the user's cache directory: `_paths.batchagent_venv`), so this
module imports only the standard library, batch_agent and httpx. It calls
`BatchAgent.run(runtime=OpenAIBackend(api_key="x", base_url=...), ...,
max_turns=<turns>, max_inflight=32)` as WORKLOADS.md prescribes; its tools
call the same tool service as every other contender.

The only addition to the SDK is the `X-Emulator-Options` header, the
per-request emulator options every contender sends (the others send them as
`extra_body`), and a counter of the tool calls the model requested.
"""

from __future__ import annotations

import json
from typing import Any

from langgraph_batch.bench.contenders._common import RECORDER, emit, read_job, run_measured


def main() -> None:
    job = read_job()

    import httpx
    from batch_agent import BatchAgent
    from batch_agent.backends.openai import OpenAIBackend
    from batch_agent.tools import Tool

    options = job.get("emulator_options") or {}

    class EmulatedOpenAIBackend(OpenAIBackend):  # type: ignore[misc]
        def _headers(self) -> dict[str, str]:
            headers: dict[str, str] = super()._headers()
            if options:
                headers["X-Emulator-Options"] = json.dumps(options)
            return headers

        async def generate_streaming(self, **kwargs: Any) -> Any:
            response = await super().generate_streaming(**kwargs)
            RECORDER.llm_calls += 1
            RECORDER.tool_calls_requested += sum(1 for tc in response.tool_calls if not tc.error)
            return response

    client = httpx.AsyncClient(
        timeout=httpx.Timeout(300.0),
        limits=httpx.Limits(max_connections=4096, max_keepalive_connections=512),
    )
    tools = []
    for spec in job["tools"]:
        url = f"{job['tool_url']}/tools/{spec['name']}"
        arg = spec["arg"]

        def _factory(url: str = url, arg: str = arg) -> Any:
            async def call(**kwargs: Any) -> str:
                resp = await client.post(url, json={"args": kwargs})
                resp.raise_for_status()
                result: str = resp.json()["result"]
                return result

            return call

        fn = _factory()
        # BatchAgent builds the tool schema from the signature: give it one argument.
        fn.__signature__ = _signature(arg)
        fn.__annotations__ = {arg: str, "return": str}
        fn.__doc__ = spec["description"]
        tools.append(Tool.define(fn, name=spec["name"]))

    def on_result(result: Any) -> None:
        if result.ok:
            RECORDER.done(result.index, json.dumps(result.output, default=str))
        else:
            RECORDER.failed(result.index, f"{result.error.type}: {result.error.message}")

    backend = EmulatedOpenAIBackend(api_key="x", base_url=job["llm_url"])

    async def run(job: dict[str, Any]) -> None:
        await BatchAgent.run(
            runtime=backend,
            task="{task}",
            inputs=[{"task": t} for t in job["tasks"]],
            system_prompt=job["system_prompt"],
            tools=tools,
            # The emulated model produces schema-valid JSON only for a
            # `response_format`; BatchAgent asks for JSON in the prompt
            # instead, which the emulator cannot follow. So BatchAgent runs
            # without output validation (its answers are the same length).
            output_schema=None,
            model=job["model"],
            backend="openai://emulator",
            max_turns=job["turns"],
            max_inflight=job.get("max_inflight") or 32,
            on_result=on_result,
        )

    emit(run_measured(job, run, teardown=client.aclose))


def _signature(arg: str) -> Any:
    import inspect

    return inspect.Signature(
        [inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, annotation=str)],
        return_annotation=str,
    )


if __name__ == "__main__":
    main()
