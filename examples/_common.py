"""Shared plumbing of the examples: which server the graphs talk to.

Resolution order for the backend:

1. `configure(url)` (the scripts' `--backend-url`),
2. the `LGB_BACKEND_URL` environment variable (`vllm://host:8000`,
   `sglang://host:30000`, `http://host:port` for any OpenAI-compatible server),
3. otherwise the built-in emulator (labelled EMULATED), started lazily by
   `ensure_backend()` the first time a graph runs, once per process, on a
   loopback port reserved when the settings are first read; it is stopped at
   interpreter exit. This is what `langgraph dev` uses when no URL is set.

The model name comes from `LGB_MODEL`, else the emulator's model, else the
server's `/v1/models` (asked once, when the settings are first read; that
happens at import, in LangGraph's import thread, never inside the event loop).

Nothing here creates asyncio objects at import: `langgraph dev` imports graph
modules in a thread with no running loop.

The example graphs declare their state with `typing_extensions.TypedDict`, not
`typing.TypedDict`: on Python < 3.12 pydantic refuses to build a model from
`typing.TypedDict` ("Please use `typing_extensions.TypedDict`"), LangGraph's
`get_input_jsonschema()` raises, and the LangGraph server (Studio) then shows
the graph with no input or output schema.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import functools
import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from langgraph_batch import render_progress
from langgraph_batch._observe.progress import extract_fan_out_event
from langgraph_batch.backends import backend_from_url
from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.scheduler import BatchPolicy, register_scheduler

logger = logging.getLogger(__name__)

BACKEND_ENV = "LGB_BACKEND_URL"
MODEL_ENV = "LGB_MODEL"
EMULATED_MODEL = "emulated-llama-3-8b"
TIME_SCALE_ENV = "LGB_EMULATOR_TIME_SCALE"
SCHEDULER = "examples"
"""Registry name of the scheduler every example model and fan_out shares (one per loop)."""
MAX_INFLIGHT = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Where the example graphs send their LLM calls."""

    url: str
    """Backend URL as `BatchedChatModel(base_url=...)` takes it."""
    model: str
    """Served model name."""
    local_emulator: bool
    """True when `ensure_backend()` must start the built-in emulator at `url`."""


_lock = threading.Lock()
_settings: Settings | None = None
_override: str | None = None
_emulator: Any = None  # the EmulatorProcess this process started


def _reserve_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_base(url: str) -> str:
    """`vllm://h:p`, `sglang://h:p`, `openai://h`, `http(s)://h:p[/v1]` -> `http(s)://h:p`."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        base = f"{scheme}://{parts.netloc}{parts.path}"
    elif scheme == "openai" or scheme.endswith("+https"):
        base = f"https://{parts.netloc}{parts.path}"
    else:
        base = f"http://{parts.netloc}{parts.path}"
    base = base.rstrip("/")
    return base.removesuffix("/v1")


def _api_key() -> str | None:
    """The key BatchedChatModel would send (`LGB_API_KEY`, then `OPENAI_API_KEY`)."""
    return os.environ.get("LGB_API_KEY") or os.environ.get("OPENAI_API_KEY") or None


def _served_model(url: str) -> str:
    models_url = f"{http_base(url)}/v1/models"
    key = _api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        response = httpx.get(models_url, headers=headers, timeout=10.0)
        response.raise_for_status()
        data = response.json()["data"]
        return str(data[0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise RuntimeError(
            f"could not ask {models_url} which model it serves ({exc!r}); "
            f"set {MODEL_ENV}=<served model name>"
        ) from exc


def configure(url: str | None = None, *, model: str | None = None) -> Settings:
    """Fix the backend for graphs built from now on (scripts call this before `build_graph`).

    Args:
        url: Backend URL; None keeps `LGB_BACKEND_URL` / the lazily started emulator.
        model: Served model name; None: `LGB_MODEL`, the emulator's, or `/v1/models`.

    Returns:
        The settings now in force.
    """
    global _settings, _override
    with _lock:
        _override = url
        _settings = None
    if model is not None:
        os.environ[MODEL_ENV] = model
    return settings()


def settings() -> Settings:
    """The settings in force (resolved once; may ask the server's `/v1/models`, blocking)."""
    global _settings
    with _lock:
        if _settings is not None:
            return _settings
        url = _override or os.environ.get(BACKEND_ENV) or None
        if url is None:
            url = _emulator.url if _emulator is not None else None
            _settings = Settings(
                url=url or f"http://127.0.0.1:{_reserve_port()}",
                model=os.environ.get(MODEL_ENV) or EMULATED_MODEL,
                local_emulator=True,
            )
        else:
            model = os.environ.get(MODEL_ENV) or _served_model(url)
            _settings = Settings(url=url, model=model, local_emulator=False)
        # A recipe, not a scheduler: one is built per event loop on first use, so this
        # is safe at import time (Studio) and across `asyncio.run` calls (scripts).
        register_scheduler(
            SCHEDULER,
            backend_factory=functools.partial(
                backend_from_url,
                _settings.url,
                api_key=_api_key(),  # the recipe, not the model, builds the backend
            ),
            policy=BatchPolicy(inflight_limit=MAX_INFLIGHT),
            replace=True,
        )
        return _settings


def _start_emulator(port: int) -> Any:
    global _emulator
    from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess

    time_scale = float(os.environ.get(TIME_SCALE_ENV, "1.0"))
    emulator = EmulatorProcess(
        EmulatorConfig(
            host="127.0.0.1",
            port=port,
            scenario="agent",
            scheduling_policy="priority",  # as deploy/vllm/serve.sh runs vLLM
            time_scale=time_scale,
        )
    )
    emulator.start()
    _emulator = emulator
    atexit.register(stop_emulator)
    logger.info("started the built-in emulator (EMULATED) at %s", emulator.url)
    return emulator


def stop_emulator() -> None:
    """Stop the emulator this process started, if any."""
    global _emulator
    with _lock:
        emulator, _emulator = _emulator, None
    if emulator is not None:
        emulator.stop()


def _ensure_backend_sync() -> Settings:
    current = settings()
    if current.local_emulator:
        with _lock:
            if _emulator is None:
                _start_emulator(int(urlsplit(current.url).port or 0))
    return current


async def ensure_backend() -> Settings:
    """Make sure the backend is reachable: start the local emulator if it is the backend.

    Graphs call this in their first node; the (blocking) start runs in a worker thread.
    """
    current = settings()
    if current.local_emulator and _emulator is None:
        return await asyncio.to_thread(_ensure_backend_sync)
    return current


def chat_model(**kwargs: Any) -> BatchedChatModel:
    """A `BatchedChatModel` for the configured backend (construction does no I/O).

    Its calls go through the scheduler registered as `SCHEDULER`; pass the same
    name to `fan_out(scheduler=...)` so progress events carry its stats.
    """
    current = settings()
    return BatchedChatModel(
        model=current.model, base_url=current.url, scheduler=SCHEDULER, **kwargs
    )


async def is_emulated(url: str) -> bool:
    """True when the server at `url` is the built-in emulator (it answers `/emulator/stats`)."""
    try:
        async with httpx.AsyncClient(timeout=5.0) as client:
            response = await client.get(f"{http_base(url)}/emulator/stats")
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def add_backend_args(parser: argparse.ArgumentParser) -> None:
    """The options every example script takes: server, model, progress bar."""
    parser.add_argument("--backend-url", default=None, help="vllm://h:p, sglang://h:p, http://..")
    parser.add_argument("--model", default=None, help="served model name")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


async def start(args: argparse.Namespace) -> Settings:
    """Configure the backend from the script's options, start it if local, say which it is."""
    current = configure(args.backend_url, model=args.model)
    await ensure_backend()
    label = " (EMULATED)" if await is_emulated(current.url) else ""
    print(f"backend: {current.url} model: {current.model}{label}")
    return current


async def run_with_progress(
    app: Any, inputs: Any, *, quiet: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run `app` drawing fan_out progress; return (final state, last fan_out event)."""
    final: dict[str, Any] = {}
    last_event: dict[str, Any] = {}
    stream = app.astream(inputs, stream_mode=["custom", "values"], subgraphs=True)
    if not quiet:
        stream = render_progress(stream)
    async for namespace, mode, data in stream:
        if mode == "values" and not namespace:
            final = data
        elif mode == "custom" and (event := extract_fan_out_event(data)) is not None:
            last_event = event
    return final, last_event


def print_llm_stats(event: dict[str, Any]) -> None:
    """Print the scheduler's counters from a fan_out progress event (its last one)."""
    stats = event.get("stats") or {}
    if not stats:
        return
    prompt, cached = stats.get("prompt_tokens", 0), stats.get("cached_tokens", 0)
    share = f" ({cached / prompt:.0%} cached)" if prompt else ""
    print(
        f"llm calls: {stats.get('completed', 0)} failed {stats.get('failed', 0)} "
        f"retries {stats.get('retries', 0)}; prompt tokens {prompt}{share}, "
        f"completion tokens {stats.get('completion_tokens', 0)}; "
        f"latency p50 {stats.get('latency_p50', 0.0):.3f}s p95 {stats.get('latency_p95', 0.0):.3f}s"
    )
