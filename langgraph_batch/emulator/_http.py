"""Request plumbing shared by the OpenAI and SGLang routes: errors, options, watches."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

from langgraph_batch.emulator.engine import Request
from langgraph_batch.emulator.protocol import error_response
from langgraph_batch.emulator.scenarios import ScenarioOptions

__all__ = (
    "DropConnection",
    "RequestError",
    "RequestOptions",
    "Watch",
    "salt_of",
    "structured_of",
)


class RequestError(Exception):
    """A request the server answers with a vLLM error response."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        err_type: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.param = param
        self.headers: dict[str, str] = {}

    def response(self) -> JSONResponse:
        """The error as vLLM's JSON."""
        return error_response(
            str(self),
            status=self.status,
            err_type=self.err_type,
            param=self.param,
            headers=self.headers or None,
        )


class DropConnection(Exception):
    """Raised inside a response to cut the connection (fault injection)."""


class Watch:
    """The listener the engine calls when a request makes progress."""

    __slots__ = ("fut", "only_finish")

    def __init__(self, *, only_finish: bool = False) -> None:
        self.fut: asyncio.Future[None] | None = None
        self.only_finish = only_finish

    def __call__(self, req: Request) -> None:
        fut = self.fut
        if fut is not None and not fut.done() and (not self.only_finish or req.finished):
            fut.set_result(None)

    def arm(self) -> asyncio.Future[None]:
        self.fut = asyncio.get_running_loop().create_future()
        return self.fut


class RequestOptions:
    """Scenario options plus the fault of one request."""

    __slots__ = ("explicit_output", "fault", "retry_after_s", "scenario", "slow_first_token_s")

    def __init__(
        self,
        scenario: ScenarioOptions,
        *,
        fault: str | None,
        slow_first_token_s: float,
        retry_after_s: float,
        explicit_output: bool,
    ) -> None:
        self.scenario = scenario
        self.fault = fault
        self.slow_first_token_s = slow_first_token_s
        self.retry_after_s = retry_after_s
        self.explicit_output = explicit_output


def salt_of(body: Mapping[str, Any]) -> str | None:
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not 1 <= len(salt) <= 1024:
        raise RequestError("'cache_salt' must be a string of 1-1024 characters.")
    return salt


def structured_of(body: Mapping[str, Any]) -> dict[str, Any] | None:
    so = body.get("structured_outputs")
    if isinstance(so, Mapping) and so.get("json") is not None:
        schema = so["json"]
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError:
                raise RequestError("structured_outputs.json is not valid JSON.") from None
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    return None
