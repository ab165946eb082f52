"""The server the demo (`langgraph_batch.bench.demo`) talks to: found from a URL, probed, labelled.

Any URL `backend_from_url` accepts works: the batched run uses it as given,
the plain-LangGraph baseline (ChatOpenAI) and the probes use the first
endpoint's `http(s)://host:port`. A server that is really langgraph-batch's
emulator says so in its `/version` answer (a field and a header), so it is
labelled EMULATED however it was reached.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import SecretStr

from langgraph_batch.bench.workloads import WORKLOADS, emulator_settings

__all__ = (
    "EMULATOR_HEADER",
    "EMULATOR_ID",
    "DemoError",
    "Server",
    "demo_backend_url",
    "probe",
    "reset_server",
    "server_stats",
)

EMULATOR_HEADER = "x-langgraph-batch-emulator"
"""The emulator's `/version` header (`langgraph_batch.emulator.server.EMULATOR_HEADER`;
not imported from there: the emulator needs the optional starlette)."""
EMULATOR_ID = "langgraph-batch"
"""Its value, and the `emulator` field of the emulator's `/version` answer."""


W1 = WORKLOADS["W1"]
"""The workload the demo runs (scaled to its `--n`)."""


class DemoError(Exception):
    """A failure the demo explains in one line (no traceback), with its exit code."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True, kw_only=True)
class Server:
    """The inference server the demo talks to, as probed."""

    url: str
    """What `BatchedChatModel` gets: any URL `backend_from_url` accepts."""
    http_base: str
    """The first endpoint's `http(s)://host:port` (the baseline and the probes use it)."""
    model: str
    api_key: str | None = field(default=None, repr=False)
    emulated: bool = False
    flavor: str = "vllm"
    profile: str | None = None
    time_scale: float = 1.0

    @property
    def secret(self) -> SecretStr | None:
        """The API key as `BatchedChatModel` takes it."""
        return SecretStr(self.api_key) if self.api_key else None

    def headers(self) -> dict[str, str]:
        """HTTP headers for the probes (the API key, when there is one)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


async def probe(url: str, *, api_key: str | None, model: str | None) -> Server:
    """Reach the server the URL names: its models, and whether it is the emulator.

    Raises:
        DemoError: the URL is not one `backend_from_url` accepts, or the server
            cannot be reached or lists no model (exit code 2).
    """
    from langgraph_batch.backends import backend_from_url

    try:
        backend = backend_from_url(url, api_key=api_key, timeout=10.0)
    except ValueError as exc:
        raise DemoError(str(exc), code=2) from None
    try:
        members = getattr(backend, "backends", None) or (backend,)
        http_base = str(getattr(members[0], "base_url", "")).rstrip("/")
        try:
            models = [m.id for m in await backend.models()]
        except Exception as exc:
            raise DemoError(
                f"cannot use the server at {url}: {type(exc).__name__}: {exc}", code=2
            ) from None
    finally:
        await backend.aclose()
    if not models and not model:
        raise DemoError(f"{url} lists no model in /v1/models; pass --model", code=2)
    server = Server(url=url, http_base=http_base, model=model or models[0], api_key=api_key)
    await _identify(server)
    return server


async def _identify(server: Server) -> None:
    """Mark `server` EMULATED when its `/version` says it is langgraph-batch's emulator."""
    async with httpx.AsyncClient(timeout=10.0, headers=server.headers()) as client:
        try:
            resp = await client.get(f"{server.http_base}/version")
            body = resp.json() if resp.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return  # a server without /version (or not JSON): not the emulator
        header = resp.headers.get(EMULATOR_HEADER)
        if header != EMULATOR_ID and not (isinstance(body, dict) and body.get("emulator")):
            return
        server.emulated = True
        try:
            stats = (await client.get(f"{server.http_base}/emulator/stats")).json()
        except (httpx.HTTPError, ValueError):
            stats = {}
    server.flavor = str(stats.get("flavor") or "vllm")
    server.profile = stats.get("profile")
    scale = stats.get("time_scale")
    if isinstance(scale, int | float) and scale > 0:
        server.time_scale = float(scale)


async def server_stats(server: Server) -> dict[str, Any]:
    """The emulator's counters (`/emulator/stats`); empty for a server that is not one."""
    if not server.emulated:
        return {}
    try:
        async with httpx.AsyncClient(timeout=10.0, headers=server.headers()) as client:
            data: dict[str, Any] = (await client.get(f"{server.http_base}/emulator/stats")).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return data


async def reset_server(server: Server) -> None:
    """Reset the emulator's counters and caches between runs (nothing for a real server)."""
    if server.emulated:
        with contextlib.suppress(httpx.HTTPError):
            async with httpx.AsyncClient(timeout=10.0, headers=server.headers()) as client:
                await client.post(f"{server.http_base}/emulator/reset")


@contextlib.contextmanager
def demo_backend_url(backend_url: str | None, *, time_scale: float) -> Iterator[str]:
    """Yields the backend URL: `backend_url`, or that of an emulator started for the demo."""
    if backend_url:
        yield backend_url.strip()
        return
    try:
        from langgraph_batch.emulator.config import EmulatorConfig
        from langgraph_batch.emulator.process import EmulatorProcess
    except ImportError:  # the optional `emulator` extra (part of `demo`)
        from langgraph_batch._extras import missing_extra

        raise missing_extra(
            "demo",
            "the demo's built-in emulator needs starlette and uvicorn "
            "(or pass --backend-url to use your own server)",
        ) from None

    # The benchmark's W1 server: its profile, and the scenario every contender meets.
    cfg = EmulatorConfig(
        port=0,
        profile=W1.profile,
        time_scale=time_scale,
        model="emulated-llama-3-8b",
        **emulator_settings(W1),
    )
    with EmulatorProcess(cfg) as emu:
        # The vLLM backend: KV capacity from /metrics, priorities, request ids.
        yield emu.url.replace("http://", "vllm://", 1)
