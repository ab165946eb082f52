"""The providers' batch APIs served by the emulator: OpenAI Batch, Anthropic Message Batches.

What the routes follow (the providers' pages):

- OpenAI, https://platform.openai.com/docs/guides/batch and the API reference
  (https://platform.openai.com/docs/api-reference/batch,
  https://platform.openai.com/docs/api-reference/files): `POST /v1/files`
  (multipart, `purpose=batch`, a JSONL file of `{"custom_id", "method":
  "POST", "url", "body"}` lines), `POST /v1/batches` (`input_file_id`,
  `endpoint`, `completion_window`), `GET /v1/batches/{id}` (status
  `validating` -> `in_progress` -> `finalizing` -> `completed`, or `failed`,
  `expired`, `cancelling` -> `cancelled`), `POST /v1/batches/{id}/cancel`,
  `GET /v1/files/{id}/content`. Successful items go to `output_file_id`,
  the others to `error_file_id`: an item the server answered with an error
  keeps its `response` (`status_code`, `body`), an item not run before the
  window ran out has `"error": {"code": "batch_expired"}` and the batch
  ends `expired`. Output lines are in completion order, not input order
  (match them by `custom_id`).
- Anthropic, https://docs.claude.com/en/docs/build-with-claude/batch-processing
  and https://docs.claude.com/en/api/creating-message-batches:
  `POST /v1/messages/batches` (`requests: [{custom_id, params}]`),
  `GET /v1/messages/batches/{id}` (`processing_status` `in_progress` ->
  `ended`, `request_counts`, `results_url` once ended),
  `POST /v1/messages/batches/{id}/cancel`, `GET
  /v1/messages/batches/{id}/results` (JSONL of `{"custom_id", "result":
  {"type": "succeeded" | "errored" | "canceled" | "expired", ...}}`, in any
  order). Each item runs through the emulator's chat route and is answered
  in the Messages API's shape (the `/v1/messages` endpoint itself is not
  served here); prompt-cache hits of a request that marks `cache_control`
  count as `cache_read_input_tokens`, and no cache write is reported.

Every item runs on the emulated engine through `/v1/chat/completions`
(the same generation, costs and usage as a synchronous call), after the
batch has waited `EmulatorConfig.batch_delay_s`.

Tests steer a batch with an `X-Emulator-Batch` JSON header on the create
call: `delay_s` (instead of the config's), `window_s` (items still running
after it expire, as when the completion window runs out), `expire` and
`fail` (lists of `custom_id`s that expire without running, or fail with an
HTTP 500).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.parser
import email.policy
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from langgraph_batch.emulator._batch_formats import (
    Outcome,
    anthropic_error,
    anthropic_items,
    anthropic_result,
    jsonl,
    openai_items,
    openai_line,
)
from langgraph_batch.emulator._http import RequestError
from langgraph_batch.emulator._serving import Serving

__all__ = ("BatchAPI",)

logger = logging.getLogger(__name__)

_ENDPOINTS = ("/v1/chat/completions",)
_WINDOWS = ("24h",)


@dataclass(slots=True, kw_only=True)
class _Steer:
    """What the `X-Emulator-Batch` header asks of one batch."""

    delay_s: float
    window_s: float | None = None
    expire: frozenset[str] = frozenset()
    fail: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, request: HTTPRequest, default_delay: float) -> _Steer:
        raw = request.headers.get("x-emulator-batch")
        if not raw:
            return cls(delay_s=default_delay)
        try:
            data = json.loads(raw)
            window = data.get("window_s")
            return cls(
                delay_s=float(data.get("delay_s", default_delay)),
                window_s=None if window is None else float(window),
                expire=frozenset(str(x) for x in data.get("expire", ())),
                fail=frozenset(str(x) for x in data.get("fail", ())),
            )
        except (AttributeError, TypeError, ValueError):
            raise RequestError("X-Emulator-Batch must be a JSON object of batch options") from None


@dataclass(slots=True, kw_only=True)
class _Job:
    """A batch of either flavour while it runs and after."""

    id: str
    flavor: str  # "openai" or "anthropic"
    items: list[tuple[str, dict[str, Any]]]
    steer: _Steer
    obj: dict[str, Any]
    outcomes: list[Outcome] = field(default_factory=list)
    meta: dict[str, tuple[Any, bool]] = field(default_factory=dict)
    """Anthropic: each item's requested model and whether it marks `cache_control`."""
    task: asyncio.Task[None] | None = None
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)


def _now() -> int:
    return int(time.time())


def _rfc3339(ts: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if ts is None else ts, UTC).isoformat()


class BatchAPI:
    """The batch routes of one emulator: its files, its batches and the tasks running them."""

    def __init__(self, serving: Serving, app: Callable[[], Any]) -> None:
        """Serve batches on `serving`; `app()` is the emulator's ASGI app (items call its chat)."""
        self.serving = serving
        self._app = app
        self.files: dict[str, tuple[dict[str, Any], bytes]] = {}
        self.jobs: dict[str, _Job] = {}

    def routes(self) -> list[Route]:
        """The Starlette routes."""
        return [
            Route("/v1/files", self.upload, methods=["POST"]),
            Route("/v1/files/{file_id}", self.file_info, methods=["GET"]),
            Route("/v1/files/{file_id}/content", self.file_content, methods=["GET"]),
            Route("/v1/batches", self.create_openai, methods=["POST"]),
            Route("/v1/batches/{batch_id}", self.retrieve, methods=["GET"]),
            Route("/v1/batches/{batch_id}/cancel", self.cancel, methods=["POST"]),
            Route("/v1/messages/batches", self.create_anthropic, methods=["POST"]),
            Route("/v1/messages/batches/{batch_id}", self.retrieve, methods=["GET"]),
            Route("/v1/messages/batches/{batch_id}/cancel", self.cancel, methods=["POST"]),
            Route("/v1/messages/batches/{batch_id}/results", self.results, methods=["GET"]),
        ]

    async def aclose(self) -> None:
        """Cancel the batches still running (the server is stopping)."""
        tasks = [j.task for j in self.jobs.values() if j.task is not None and not j.task.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- files ---------------------------------------------------------------

    async def upload(self, request: HTTPRequest) -> Response:
        """`POST /v1/files`: a multipart upload (`file`, `purpose`)."""
        ctype = request.headers.get("content-type", "")
        if not ctype.startswith("multipart/form-data"):
            return RequestError("Expected multipart/form-data.").response()
        raw = await request.body()
        msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            f"Content-Type: {ctype}\r\n\r\n".encode() + raw
        )
        fields: dict[str, tuple[str | None, bytes]] = {}
        for part in msg.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True)
            if isinstance(name, str) and isinstance(payload, bytes):
                fields[name] = (part.get_filename(), payload)
        if "file" not in fields:
            return RequestError("'file' is required.", param="file").response()
        purpose = fields.get("purpose", (None, b""))[1].decode()
        if purpose != "batch":
            return RequestError("The emulator takes files of purpose 'batch' only.").response()
        filename, data = fields["file"]
        return JSONResponse(self._store(data, filename or "upload.jsonl", purpose))

    def _store(self, data: bytes, filename: str, purpose: str) -> dict[str, Any]:
        file_id = f"file-{uuid.uuid4().hex[:24]}"
        info: dict[str, Any] = {
            "id": file_id,
            "object": "file",
            "bytes": len(data),
            "created_at": _now(),
            "expires_at": None,
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "status_details": None,
        }
        self.files[file_id] = (info, data)
        return info

    async def file_info(self, request: HTTPRequest) -> Response:
        """`GET /v1/files/{id}`."""
        found = self.files.get(request.path_params["file_id"])
        if found is None:
            return RequestError("No such file.", status=404, err_type="NotFoundError").response()
        return JSONResponse(found[0])

    async def file_content(self, request: HTTPRequest) -> Response:
        """`GET /v1/files/{id}/content`: the raw bytes."""
        found = self.files.get(request.path_params["file_id"])
        if found is None:
            return RequestError("No such file.", status=404, err_type="NotFoundError").response()
        return Response(found[1], media_type="application/octet-stream")

    # -- create --------------------------------------------------------------

    async def create_openai(self, request: HTTPRequest) -> Response:
        """`POST /v1/batches`: check the input file, start the batch (status `validating`)."""
        try:
            body = await self.serving.body(request)
            steer = _Steer.parse(request, self.serving.config.batch_delay_s)
            endpoint = body.get("endpoint")
            if endpoint not in _ENDPOINTS:
                raise RequestError(f"endpoint must be one of {list(_ENDPOINTS)}", param="endpoint")
            window = body.get("completion_window")
            if window not in _WINDOWS:
                raise RequestError("completion_window must be '24h'", param="completion_window")
            found = self.files.get(str(body.get("input_file_id")))
            if found is None:
                raise RequestError("No such input file.", status=404, param="input_file_id")
        except RequestError as exc:
            return exc.response()
        now = _now()
        obj: dict[str, Any] = {
            "id": f"batch_{uuid.uuid4().hex[:24]}",
            "object": "batch",
            "endpoint": endpoint,
            "errors": None,
            "input_file_id": found[0]["id"],
            "completion_window": window,
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": None,
            "expires_at": now + 24 * 3600,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": body.get("metadata"),
        }
        items, errors = openai_items(found[1], str(endpoint))
        job = _Job(id=obj["id"], flavor="openai", items=items, steer=steer, obj=obj)
        self.jobs[job.id] = job
        if errors:
            obj.update(status="failed", failed_at=now, errors={"object": "list", "data": errors})
        else:
            obj["request_counts"]["total"] = len(items)
            job.task = asyncio.create_task(self._run(job))
        return JSONResponse(obj)

    async def create_anthropic(self, request: HTTPRequest) -> Response:
        """`POST /v1/messages/batches`: `requests: [{custom_id, params}]`."""
        try:
            body = await self.serving.body(request)
            steer = _Steer.parse(request, self.serving.config.batch_delay_s)
            items, meta = anthropic_items(body.get("requests"))
        except RequestError as exc:
            return anthropic_error(str(exc), exc.status)
        now = time.time()
        obj: dict[str, Any] = {
            "id": f"msgbatch_{uuid.uuid4().hex[:24]}",
            "type": "message_batch",
            "processing_status": "in_progress",
            "request_counts": {
                "processing": len(items),
                "succeeded": 0,
                "errored": 0,
                "canceled": 0,
                "expired": 0,
            },
            "ended_at": None,
            "created_at": _rfc3339(now),
            "expires_at": _rfc3339(now + 24 * 3600),
            "archived_at": None,
            "cancel_initiated_at": None,
            "results_url": None,
        }
        job = _Job(id=obj["id"], flavor="anthropic", items=items, steer=steer, obj=obj, meta=meta)
        self.jobs[job.id] = job
        base = str(request.base_url).rstrip("/")
        job.task = asyncio.create_task(self._run(job, results_base=base))
        return JSONResponse(obj)

    # -- poll, cancel, results -----------------------------------------------

    async def retrieve(self, request: HTTPRequest) -> Response:
        """`GET /v1/batches/{id}` or `GET /v1/messages/batches/{id}`."""
        job = self.jobs.get(request.path_params["batch_id"])
        if job is None:
            return _not_found(request)
        return JSONResponse(job.obj)

    async def cancel(self, request: HTTPRequest) -> Response:
        """Cancel: items not finished yet end `canceled` (`batch_cancelled` for OpenAI)."""
        job = self.jobs.get(request.path_params["batch_id"])
        if job is None:
            return _not_found(request)
        if job.task is not None and not job.task.done():
            job.cancelled.set()
            if job.flavor == "openai":
                job.obj.update(status="cancelling", cancelling_at=_now())
            else:
                job.obj.update(processing_status="canceling", cancel_initiated_at=_rfc3339())
        return JSONResponse(job.obj)

    async def results(self, request: HTTPRequest) -> Response:
        """`GET /v1/messages/batches/{id}/results`: JSONL, once the batch has ended."""
        job = self.jobs.get(request.path_params["batch_id"])
        if job is None:
            return _not_found(request)
        if job.obj["processing_status"] != "ended":
            return anthropic_error(f"Batch {job.id} has not ended yet.", 400)
        lines = [json.dumps(anthropic_result(o, job.meta)) for o in job.outcomes]
        return Response("\n".join(lines) + "\n", media_type="application/binary")

    # -- running -------------------------------------------------------------

    async def _run(self, job: _Job, *, results_base: str = "") -> None:
        steer = job.steer
        ids = [cid for cid, _ in job.items]
        try:
            if job.flavor == "openai":
                job.obj.update(status="in_progress", in_progress_at=_now())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(steer.delay_s):
                    await job.cancelled.wait()
            transport = httpx.ASGITransport(app=self._app())
            async with httpx.AsyncClient(
                transport=transport, base_url="http://emulator", timeout=None
            ) as client:
                pending: set[asyncio.Task[Any]] = {
                    asyncio.create_task(self._item(client, job, cid, body))
                    for cid, body in job.items
                    if cid not in steer.expire and not job.cancelled.is_set()
                }
                stop: asyncio.Task[Any] = asyncio.create_task(job.cancelled.wait())
                deadline = None if steer.window_s is None else time.monotonic() + steer.window_s
                while pending and not job.cancelled.is_set():
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    done, pending = await asyncio.wait(
                        pending | {stop}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                    )
                    pending.discard(stop)
                    for task in done - {stop}:
                        outcome: Outcome = task.result()
                        job.outcomes.append(outcome)
                        self._count(job, outcome.kind)
                    if deadline is not None and time.monotonic() >= deadline:
                        break
                stop.cancel()
                for task in pending:
                    task.cancel()
            end = "canceled" if job.cancelled.is_set() else "expired"
            seen = {o.custom_id for o in job.outcomes}
            for cid in ids:
                if cid not in seen:
                    job.outcomes.append(Outcome(custom_id=cid, kind=end))
                    self._count(job, end)
            self._finish(job, results_base)
        except Exception:
            logger.exception("emulator: batch %s failed", job.id)
            if job.flavor == "openai":
                job.obj.update(status="failed", failed_at=_now())
            else:
                job.obj.update(processing_status="ended", ended_at=_rfc3339())

    async def _item(
        self, client: httpx.AsyncClient, job: _Job, cid: str, body: dict[str, Any]
    ) -> Outcome:
        if cid in job.steer.fail:
            err = {"message": "Injected failure (X-Emulator-Batch).", "type": "server_error"}
            return Outcome(custom_id=cid, kind="error", status=500, body={"error": err})
        resp = await client.post("/v1/chat/completions", json=body)
        try:
            payload = resp.json()
        except ValueError:
            payload = {"error": {"message": resp.text, "type": "server_error"}}
        kind = "ok" if resp.status_code == 200 else "error"
        return Outcome(custom_id=cid, kind=kind, status=resp.status_code, body=payload)

    @staticmethod
    def _count(job: _Job, kind: str) -> None:
        counts = job.obj["request_counts"]
        if job.flavor == "openai":
            counts["completed" if kind == "ok" else "failed"] += 1
            return
        counts["processing"] -= 1
        name = {"ok": "succeeded", "error": "errored", "canceled": "canceled"}.get(kind, kind)
        counts[name] += 1

    def _finish(self, job: _Job, results_base: str) -> None:
        if job.flavor == "anthropic":
            job.obj.update(
                processing_status="ended",
                ended_at=_rfc3339(),
                results_url=f"{results_base}/v1/messages/batches/{job.id}/results",
            )
            return
        job.obj.update(status="finalizing", finalizing_at=_now())
        out = [openai_line(o) for o in job.outcomes if o.kind == "ok"]
        err = [openai_line(o) for o in job.outcomes if o.kind != "ok"]
        if out:
            job.obj["output_file_id"] = self._store(
                jsonl(out), f"{job.id}_output.jsonl", "batch_output"
            )["id"]
        if err:
            job.obj["error_file_id"] = self._store(
                jsonl(err), f"{job.id}_error.jsonl", "batch_output"
            )["id"]
        kinds = {o.kind for o in job.outcomes}
        now = _now()
        if job.cancelled.is_set():
            job.obj.update(status="cancelled", cancelled_at=now)
        elif "expired" in kinds:
            job.obj.update(status="expired", expired_at=now)
        else:
            job.obj.update(status="completed", completed_at=now)


def _not_found(request: HTTPRequest) -> JSONResponse:
    if request.url.path.startswith("/v1/messages/"):
        return anthropic_error("Batch not found.", 404)
    return RequestError("No such batch.", status=404, err_type="NotFoundError").response()
