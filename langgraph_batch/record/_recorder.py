"""`Recorder`: a LangChain callback handler that writes the shape of a run as JSON Lines.

It sees every chat model call and tool run of the graph it is passed to
(`config={"callbacks": [recorder]}`; LangGraph hands callbacks down to every
node, subgraph, `Send` branch and `fan_out` sibling). A model call's
sibling is the `fan_out` sibling it runs in, else the conversation it
continues: a call whose messages start with an earlier call's messages is
that conversation's next turn. Nothing of the messages' text is written
unless `content=True`: only keyed digests and lengths (the format:
`langgraph_batch.record._format`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, LLMResult

from langgraph_batch._context import current_sibling
from langgraph_batch._version import __version__
from langgraph_batch.record._format import (
    CLOCK,
    FORMAT,
    FORMAT_VERSION,
    HASH_NAME,
    LLMCall,
    digest,
    shared_prefix,
)

__all__ = ("Recorder",)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return json.dumps(content, sort_keys=True, default=str)


def _role(message: BaseMessage) -> str:
    return {"human": "user", "ai": "assistant"}.get(message.type, message.type)


def _canonical(message: BaseMessage) -> dict[str, Any]:
    """What identifies a message's content: role, text, tool calls (not their run-specific ids)."""
    out: dict[str, Any] = {"role": _role(message), "text": _text(message.content)}
    if isinstance(message, AIMessage) and message.tool_calls:
        out["calls"] = [[c["name"], c["args"]] for c in message.tool_calls]
    return out


class _Open:
    """A model call between its start and its end."""

    __slots__ = ("first", "hashes", "model", "new", "prefix", "sibling", "start", "tools", "turn")

    def __init__(self) -> None:
        self.sibling = 0
        self.turn = 0
        self.start = 0.0
        self.hashes: tuple[str, ...] = ()
        self.prefix = 0
        self.first = 0
        self.new: list[list[Any]] = []
        self.tools: tuple[str | None, int] = (None, 0)
        self.model: str | None = None


class Recorder(BaseCallbackHandler):
    """Record the shape of a run (per sibling and turn: tokens, prefix structure, tools).

    Pass it as a callback to any graph or model; close it when the run is
    over (or use it as a context manager), which writes the summary line.
    Lines are written by a thread of the recorder's, never inside the event
    loop; `close()` waits until they are on disk.

    ```python
    from langgraph_batch.record import Recorder

    async with Recorder("job.jsonl") as rec:
        result = await graph.ainvoke(inputs, config={"callbacks": [rec]})
    ```

    Then `langgraph-batch bench --replay job.jsonl` replays the job's shape
    against the emulator (or `--server URL`) with every contender.

    Args:
        path: A file path, or an open text file (not closed by `close()`).
        key: The key of the message digests (default: random, per recording).
            Pass the same key to compare digests across recordings.
        content: Also write the messages' texts (off by default: a recording
            then holds no prompt or output text).
        clock: Monotonic seconds (tests pass a fake one).

    !!! version-added "0.1.0"
    """

    run_inline = True  # in the caller's context: `fan_out`'s sibling is visible
    raise_error = False

    def __init__(
        self,
        path: str | Path | IO[str],
        *,
        key: bytes | str | None = None,
        content: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # A path is opened by the writer thread (not in the caller's event loop).
        self._path = Path(path) if isinstance(path, str | Path) else None
        self._fh: IO[str] | None = None if isinstance(path, str | Path) else path
        self._error: Exception | None = None
        self._key = key.encode() if isinstance(key, str) else (key or os.urandom(32))
        self._content = content
        self._clock = clock
        self._lock = threading.Lock()
        self._t0: float | None = None
        self._open: dict[UUID, _Open] = {}
        self._tools_open: dict[UUID, tuple[int, int, str, str, float]] = {}
        self._siblings: dict[Any, int] = {}
        self._turns: dict[int, int] = {}
        self._ends: dict[tuple[str, ...], list[int]] = {}
        self._last: dict[int, tuple[str, ...]] = {}
        """A fan_out sibling's last call's messages (a reset keeps only some of them)."""
        self._first: tuple[str, ...] | None = None
        self._call_ids: dict[str, tuple[int, int]] = {}
        self._firsts: list[LLMCall] = []
        self._totals = {"llm_calls": 0, "tool_calls": 0, "prompt_tokens": 0, "output_tokens": 0}
        self._cached = 0
        self._cached_known = False
        self._last_end = 0.0
        self._closed = False
        # Lines go to the file from a thread of their own: callbacks run inside
        # the event loop (run_inline), where a file write would block it.
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._drain, name="lgb-recorder", daemon=True)
        self._writer.start()
        self._write(
            {
                "type": "header",
                "format": FORMAT,
                "version": FORMAT_VERSION,
                "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "hash": HASH_NAME,
                "clock": CLOCK,
                "content": content,
                "langgraph_batch": __version__,
            }
        )

    # Only model and tool runs matter: skip graph and chain events early (not
    # `ignore_agent`: LangChain routes tool events through that flag).
    @property
    def ignore_chain(self) -> bool:
        return True

    @property
    def ignore_retriever(self) -> bool:
        return True

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Recorder:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _now(self) -> float:
        now = self._clock()
        if self._t0 is None:
            self._t0 = now
        return round(now - self._t0, 6)

    def _write(self, row: Mapping[str, Any]) -> None:
        self._queue.put(json.dumps(row, separators=(",", ":")) + "\n")

    def _drain(self) -> None:
        # Takes every line up to the end marker whatever fails (close() waits for it),
        # and closes a file it opened even when a write failed.
        fh = self._fh
        try:
            if fh is None and self._path is not None:
                fh = self._fh = self._path.open("w", encoding="utf-8")
        except OSError as exc:
            self._error = exc
        while (line := self._queue.get()) is not None:
            if self._error is not None or fh is None:
                continue  # keep the callbacks from piling up lines
            try:
                fh.write(line)
                if self._queue.empty():
                    fh.flush()
            except Exception as exc:  # kept for close() to raise
                self._error = exc
        if fh is None:
            return
        try:
            if self._error is None:
                fh.flush()
        except Exception as exc:  # kept for close() to raise
            self._error = exc
        finally:
            if self._path is not None:
                with contextlib.suppress(OSError):  # closed even when its flush fails
                    fh.close()

    def _sibling_of(self, hashes: tuple[str, ...]) -> tuple[int, int]:
        """(sibling, messages shared with its previous call) for a call with these messages."""
        info = current_sibling()
        if info is not None:
            ident = (info.run_id or info.group, info.index)
            if ident not in self._siblings:
                self._siblings[ident] = len(self._siblings)
            sibling = self._siblings[ident]
            for n in range(len(hashes) - 1, 0, -1):  # its own previous call, if a prefix
                waiting = self._ends.get(hashes[:n])
                if waiting and sibling in waiting:
                    waiting.remove(sibling)
                    return sibling, n
            # No continuation: a reset or compaction keeps a prefix of its previous call.
            last = self._last.get(sibling, ())
            kept = next(
                (i for i, (a, b) in enumerate(zip(hashes, last, strict=False)) if a != b),
                min(len(hashes), len(last)),
            )
            return sibling, kept
        for n in range(len(hashes) - 1, 0, -1):  # the longest conversation this one continues
            waiting = self._ends.get(hashes[:n])
            if waiting:
                return waiting.pop(0), n
        sibling = len(self._siblings)
        self._siblings[("conversation", sibling)] = sibling
        return sibling, 0

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        **kwargs: Any,
    ) -> None:
        """Note a model call's start, its sibling and its messages' digests."""
        msgs = messages[0] if messages else []
        canon = [_canonical(m) for m in msgs]
        hashes = tuple(digest(self._key, c) for c in canon)
        params = kwargs.get("invocation_params") or {}
        tools = params.get("tools")
        with self._lock:
            if self._closed:
                return
            call = _Open()
            call.start = self._now()
            call.hashes = hashes
            call.sibling, call.prefix = self._sibling_of(hashes)
            self._last[call.sibling] = hashes
            call.turn = self._turns.get(call.sibling, 0)
            self._turns[call.sibling] = call.turn + 1
            if self._first is None:
                self._first = hashes
            call.first = next(
                (i for i, (a, b) in enumerate(zip(hashes, self._first, strict=False)) if a != b),
                min(len(hashes), len(self._first)),
            )
            for c, h in list(zip(canon, hashes, strict=True))[call.prefix :]:
                row: list[Any] = [c["role"], h, len(c["text"])]
                if self._content:
                    row.append(c["text"])
                call.new.append(row)
            if tools:
                text = json.dumps(tools, sort_keys=True, default=str)
                call.tools = (digest(self._key, tools), len(text))
            model = params.get("model") or params.get("model_name")
            call.model = None if model is None else str(model)
            self._open[run_id] = call

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        """Write the call's line: usage, finish reason, the tool calls it made."""
        message: BaseMessage | None = None
        gens = response.generations[0] if response.generations else []
        if gens and isinstance(gens[0], ChatGeneration):
            message = gens[0].message
        self._finish(run_id, message, None)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Write the failed call's line."""
        self._finish(run_id, None, type(error).__name__)

    def _finish(self, run_id: UUID, message: BaseMessage | None, error: str | None) -> None:
        with self._lock:
            call = self._open.pop(run_id, None)
            if call is None:
                return
            end = self._now()
            usage = getattr(message, "usage_metadata", None) or {}
            details = usage.get("input_token_details") or {}
            cached = details.get("cache_read")
            calls: list[list[Any]] = []
            reply: list[str] = []
            if isinstance(message, AIMessage):
                for tc in message.tool_calls:
                    calls.append([tc["name"], digest(self._key, [tc["name"], tc["args"]])])
                    if tc.get("id"):
                        self._call_ids[str(tc["id"])] = (call.sibling, call.turn)
                if message.tool_calls or error is None:
                    # The conversation's next call starts with these messages and this reply.
                    nxt = (*call.hashes, digest(self._key, _canonical(message)))
                    self._ends.setdefault(nxt, []).append(call.sibling)
                if self._content:
                    reply.append(_text(message.content))
            meta = getattr(message, "response_metadata", None) or {}
            row: dict[str, Any] = {
                "type": "llm",
                "sibling": call.sibling,
                "turn": call.turn,
                "start_s": call.start,
                "end_s": end,
                "model": call.model,
                "prompt_tokens": usage.get("input_tokens"),
                "cached_tokens": cached,
                "output_tokens": usage.get("output_tokens"),
                "messages": len(call.hashes),
                "prefix_messages": call.prefix,
                "first_messages": call.first,
                "new": [r[:3] for r in call.new],
                "tools": call.tools[0],
                "tools_chars": call.tools[1],
                "tool_calls": calls,
                "finish_reason": meta.get("finish_reason"),
                "error": error,
            }
            if self._content:
                row["content"] = [r[3] for r in call.new]
                row["output"] = reply[0] if reply else None
            self._write(row)
            self._account(row)

    def _account(self, row: Mapping[str, Any]) -> None:
        t = self._totals
        t["llm_calls"] += 1
        t["prompt_tokens"] += int(row["prompt_tokens"] or 0)
        t["output_tokens"] += int(row["output_tokens"] or 0)
        if row["cached_tokens"] is not None:
            self._cached += int(row["cached_tokens"])
            self._cached_known = True
        self._last_end = max(self._last_end, float(row["end_s"]))
        if row["turn"] == 0:
            self._firsts.append(
                LLMCall(
                    sibling=row["sibling"],
                    turn=0,
                    start_s=row["start_s"],
                    end_s=row["end_s"],
                    prompt_tokens=row["prompt_tokens"],
                    cached_tokens=row["cached_tokens"],
                    output_tokens=row["output_tokens"],
                    messages=row["messages"],
                    prefix_messages=0,
                    first_messages=row["first_messages"],
                    new=tuple((str(r), str(h), int(c)) for r, h, c in row["new"]),
                    tool_calls=(),
                    tools_chars=row["tools_chars"],
                )
            )

    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Note a tool run's start and the model call that asked for it."""
        name = str(kwargs.get("name") or (serialized or {}).get("name") or "")
        args: Any = inputs if inputs is not None else input_str
        with self._lock:
            if self._closed:
                return
            start = self._now()
            where = self._call_ids.get(str(kwargs.get("tool_call_id") or ""))
            if where is None:
                info = current_sibling()
                ident = None if info is None else (info.run_id or info.group, info.index)
                sibling = self._siblings.get(ident, -1) if ident else -1
                where = (sibling, self._turns.get(sibling, 0) - 1 if sibling >= 0 else -1)
            self._tools_open[run_id] = (*where, name, digest(self._key, [name, args]), start)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Write the tool run's line: latency and result size."""
        content = output.content if isinstance(output, ToolMessage) else output
        self._tool_done(run_id, len(_text(content)), None)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Write the failed tool run's line."""
        self._tool_done(run_id, 0, type(error).__name__)

    def _tool_done(self, run_id: UUID, chars: int, error: str | None) -> None:
        with self._lock:
            opened = self._tools_open.pop(run_id, None)
            if opened is None:
                return
            sibling, turn, name, args_hash, start = opened
            end = self._now()
            self._write(
                {
                    "type": "tool",
                    "sibling": sibling,
                    "turn": turn,
                    "name": name,
                    "args_hash": args_hash,
                    "start_s": start,
                    "end_s": end,
                    "latency_s": round(end - start, 6),
                    "result_chars": chars,
                    "error": error,
                }
            )
            self._totals["tool_calls"] += 1
            self._last_end = max(self._last_end, end)

    def summary(self) -> dict[str, Any]:
        """The totals so far (what `close()` writes as the last line)."""
        with self._lock:
            return self._summary()

    def _summary(self) -> dict[str, Any]:
        firsts: Sequence[LLMCall] = sorted(self._firsts, key=lambda c: c.sibling)
        return {
            "type": "summary",
            "siblings": len(self._turns),
            **self._totals,
            "cached_tokens": self._cached if self._cached_known else None,
            "makespan_s": self._last_end,
            "shared_prefix": shared_prefix(firsts),
        }

    def close(self) -> None:
        """Write the summary line, wait until every line is written, close the file.

        A file object passed in is flushed, not closed.

        Calls that end after it are not recorded (nor kept).

        Raises:
            OSError: the file could not be opened or written (or what writing to
                a file object passed in raised).
        """
        with self._lock:  # the summary is the last line: no callback writes after it
            if not self._closed:
                self._write(self._summary())
                self._closed = True
                self._open.clear()
                self._tools_open.clear()
                self._queue.put(None)
        self._writer.join()
        if self._error is not None:
            raise self._error

    async def aclose(self) -> None:
        """`close()` without blocking the event loop (`async with Recorder(...)` calls it)."""
        import asyncio

        await asyncio.to_thread(self.close)
