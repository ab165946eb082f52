"""What a request tells NVIDIA Dynamo's frontend: session headers, `nvext.agent_hints`, TTL.

Pure functions and one small learner; `DynamoBackend` (`backends/dynamo.py`)
puts their output on the wire. Checked against `ai-dynamo` 1.6.1's frontend
(`tests/integration/test_dynamo.py`):

- **Headers.** `X-Dynamo-Session-ID`: the caller's opaque session key (one
  per fan_out sibling, as for the other routers: `backends/_session.py`);
  the frontend's KV router keeps a session on one worker when it runs with
  `--router-session-affinity-ttl-secs`. `X-Dynamo-Parent-Session-ID`: an
  opaque key of the fan_out run (`ChatRequest.program`); the router binds
  child sessions to their parent's worker, so a whole fan_out would share one
  worker (`DynamoBackend` sends it only with `parent_session=True`).
  `X-Dynamo-Session-Final: true` on a call known to be the caller's last
  (`ChatRequest.final`).
- **`nvext.agent_hints`** (1.6.1 accepts exactly `priority`, `strict_priority`,
  `osl`, `speculative_prefill`, `latency_sensitivity`, and answers HTTP 400 to
  any other key, to a float `priority` (an i32) or a float `osl` (a u32)):
  `priority` is our progress priority in the engine's convention,
  `osl` the output length learned from the run (`OutputLengths`), and
  `latency_sensitivity` seconds of head start in the router's queue, growing
  with the caller's completed turns (it only matters with the frontend's
  `--router-queue-threshold`).
- **`nvext.cache_control`** `{"type": "ephemeral", "ttl": "<seconds>"}`: the
  learned tool wait (`ChatRequest.retention_s`) clamped to 300-3600 s, the
  range Dynamo clamps to. 1.6.1 rejects the field (HTTP 400, "unknown field
  `cache_control`"): it needs a build with cache pinning (Dynamo PR 6213,
  `--enable-cache-control`), so it is sent only when asked for.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Any

from langgraph_batch.backends._session import session_key
from langgraph_batch.backends.base import ChatRequest

__all__ = (
    "CACHE_TTL_MAX_S",
    "CACHE_TTL_MIN_S",
    "OutputLengths",
    "agent_hints",
    "cache_control",
    "dynamo_headers",
    "program_key",
)

SESSION_HEADER = "X-Dynamo-Session-ID"
PARENT_HEADER = "X-Dynamo-Parent-Session-ID"
FINAL_HEADER = "X-Dynamo-Session-Final"

CACHE_TTL_MIN_S = 300
"""Dynamo clamps `cache_control.ttl` to [300, 3600] seconds."""
CACHE_TTL_MAX_S = 3600

_I32 = 2**31 - 1
_MIN_SAMPLES = 3
_WINDOW = 256


def program_key(request: ChatRequest, scope: str | None = None) -> str | None:
    """The opaque key of the request's program (its fan_out run); None outside a fan_out.

    The same HMAC as `session_key`, of `"program:<run>"`: it names the run
    without revealing it, and differs between callers with other credentials.
    """
    if not request.program:
        return None
    return session_key(replace(request, route_key=f"program:{request.program}"), scope)


def dynamo_headers(request: ChatRequest, session: str, parent: str | None) -> dict[str, str]:
    """The `X-Dynamo-*` session headers of one request.

    Args:
        request: the call.
        session: its session key (`SessionRouting.key`).
        parent: its program's key (`program_key`; None: no parent header).

    Example:
        ```python
        dynamo_headers(ChatRequest(model="m", messages=[], final=True), "s1", "p1")
        # {"X-Dynamo-Session-ID": "s1", "X-Dynamo-Parent-Session-ID": "p1",
        #  "X-Dynamo-Session-Final": "true"}
        ```
    """
    headers = {SESSION_HEADER: session}
    if parent:
        headers[PARENT_HEADER] = parent
    if request.final:
        headers[FINAL_HEADER] = "true"
    return headers


def agent_hints(
    request: ChatRequest,
    *,
    osl: int | None,
    low_priority_values_first: bool = True,
    latency_per_turn_s: float = 1.0,
) -> dict[str, Any]:
    """`nvext.agent_hints` for one request (empty: nothing to say).

    Args:
        request: the call; its `priority` (ours: lower sooner, set from the
            caller's progress by the scheduler) and `turn`.
        osl: the expected output tokens (`OutputLengths.expect`; None: unknown).
        low_priority_values_first: the engine behind Dynamo runs lower values
            first (vLLM, SGLang with `--schedule-low-priority-values-first`);
            otherwise our priority is negated.
        latency_per_turn_s: `latency_sensitivity` seconds per completed turn
            (0: never sent).
    """
    hints: dict[str, Any] = {}
    if request.priority:
        value = request.priority if low_priority_values_first else -request.priority
        hints["priority"] = max(-_I32, min(_I32, int(value)))
    if osl is not None and osl > 0:
        hints["osl"] = int(osl)
    turn = request.turn or 0
    if latency_per_turn_s > 0 and turn > 0:
        hints["latency_sensitivity"] = round(latency_per_turn_s * turn, 3)
    return hints


def cache_control(retention_s: float | None) -> dict[str, str] | None:
    """`nvext.cache_control` for a learned tool wait (None: unknown, send nothing).

    Example:
        ```python
        cache_control(12.0)    # {"type": "ephemeral", "ttl": "300"}
        cache_control(900.4)   # {"type": "ephemeral", "ttl": "900"}
        cache_control(7200.0)  # {"type": "ephemeral", "ttl": "3600"}
        ```
    """
    if retention_s is None or not retention_s > 0:
        return None
    ttl = max(CACHE_TTL_MIN_S, min(CACHE_TTL_MAX_S, round(retention_s)))
    return {"type": "ephemeral", "ttl": str(ttl)}


class OutputLengths:
    """Completion tokens learned from a backend's answers, by the caller's turn.

    `expect(request)` is the median of the last answers at the request's turn
    once there are 3 of them, else the median over every turn, else None;
    never more than the request's `max_tokens`.
    """

    __slots__ = ("_all", "_by_turn")

    def __init__(self) -> None:
        self._by_turn: dict[int, deque[int]] = {}
        self._all: deque[int] = deque(maxlen=_WINDOW)

    def observe(self, turn: int | None, completion_tokens: int) -> None:
        """Learn one answer's length (0 or less: nothing learned)."""
        if completion_tokens <= 0:
            return
        self._all.append(completion_tokens)
        if turn is not None:
            window = self._by_turn.get(turn)
            if window is None:
                if len(self._by_turn) >= _WINDOW:  # bounded: deep turns share the overall median
                    return
                window = self._by_turn[turn] = deque(maxlen=_WINDOW)
            window.append(completion_tokens)

    def expect(self, request: ChatRequest) -> int | None:
        """The expected completion tokens of `request` (None: not learned yet)."""
        window = self._by_turn.get(request.turn) if request.turn is not None else None
        if window is None or len(window) < _MIN_SAMPLES:
            window = self._all
        if len(window) < _MIN_SAMPLES:
            return None
        value = sorted(window)[len(window) // 2]
        params = request.params
        cap = params.get("max_tokens") or params.get("max_completion_tokens")
        if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
            value = min(value, cap)
        return value
