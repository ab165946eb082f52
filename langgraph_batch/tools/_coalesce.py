"""What a coalesced tool shares, and with whom: `coalesce`, `CoalescePolicy`, run scopes.

`coalesce(tool)` returns a copy of the tool that carries a `CoalescePolicy`
(a frozen value: the options) and, behind it, a `ToolCoalescing` (the state
at run time: the coalescer's in-flight executions, kept results and limits).
The policy decides:

- **which calls are identical**: the tool name, the arguments (canonical
  JSON, or `key(args)`) and, for a tool whose result depends on its caller,
  what it reads of the caller (`caller_key(request)`);
- **with whom they are shared** (`scope`): by default only within one run,
  one fan_out run (`SiblingInfo.run_id`) or, outside fan_out, one LangGraph
  root run (the run's `Runtime.control`, one object per root invocation,
  inherited by its subgraphs and Send tasks, never shared by two
  invocations). Nothing crosses runs, threads or users unless the tool's
  author asks for it with `scope="global"`.

The runtime lives as long as the tool object (or a copy of it) does: the
registry holds it weakly, so building tools per request does not grow it.
"""

from __future__ import annotations

import inspect
import json
import logging
import typing
import uuid
import weakref
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolCallId
from langchain_core.tools import tool as as_tool
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import get_runtime
from langgraph.types import Command

from langgraph_batch._context import current_sibling
from langgraph_batch.tools._singleflight import Coalescer, check_limits

__all__ = (
    "METADATA_KEY",
    "CoalescePolicy",
    "Scope",
    "ToolCoalescing",
    "coalesce",
    "coalesce_policy",
    "coalescing",
    "forget_run",
    "run_scope",
)

logger = logging.getLogger(__name__)

METADATA_KEY = "langgraph_batch_coalesce"
"""Key of a coalesced tool's policy summary in its `metadata` (a JSON-safe dict
with the policy's `id`; metadata reaches tracers, so it holds no live objects)."""

ToolResult = ToolMessage | Command[Any]
Scope = Literal["run", "inflight", "global"]
CallerKey = Callable[[ToolCallRequest], Hashable]

_SCOPES: tuple[str, ...] = ("run", "inflight", "global")

_GLOBAL: Hashable = ("langgraph_batch.global",)
"""The one scope of `scope="global"` policies (a tuple: never equal to a run's scope)."""

_LIVE: weakref.WeakValueDictionary[str, ToolCoalescing] = weakref.WeakValueDictionary()
"""The runtime of each `coalesce()` call, by its policy's id (in the tool's metadata).
One lives while a tool object carrying it does."""

_MISSING_WARNED: set[str] = set()


@dataclass(frozen=True, slots=True, kw_only=True)
class CoalescePolicy:
    """How calls of one coalesced tool are shared and limited (see `coalesce`).

    A frozen value: the options only. What runs (in-flight executions, stored
    results, the concurrency and rate limits) is the `ToolCoalescing` each
    `coalesce()` call makes, so two tools never share limits, even with equal
    policies.

    Example:
        ```python
        policy = coalesce_policy(coalesce(search, ttl=300.0))
        assert policy is not None and policy.ttl == 300.0
        ```
    """

    scope: Scope = "run"
    """`"run"`: share in-flight and completed results within one run (a fan_out
    run, or outside fan_out one LangGraph root run); `"inflight"`: share only
    calls that overlap in time, within one run; `"global"`: share across runs,
    threads and users (completed results only with a `ttl`)."""
    ttl: float | None = None
    """Reuse a completed result for at most this many seconds (within its scope)."""
    key: Callable[[dict[str, Any]], Hashable] | None = None
    """Maps the call's arguments to what makes two calls identical; default:
    canonical JSON (sorted keys, no whitespace)."""
    caller_key: CallerKey | None = None
    """Maps the `ToolCallRequest` to what the tool reads of its caller (a user
    id from the config or context, ...); calls share only when it is equal."""
    max_concurrency: int | None = None
    """At most this many executions of the tool at once, across all siblings."""
    rate_limit: float | None = None
    """At most this many executions of the tool start per second."""
    share_errors: bool = True
    """Give a failed shared execution's error to every caller waiting on it
    (False: each of them runs the tool itself)."""

    def __post_init__(self) -> None:
        if self.scope not in _SCOPES:
            raise ValueError(f'scope must be "run", "inflight" or "global", got {self.scope!r}')
        if self.key is not None and not callable(self.key):
            raise ValueError(f"key must be a callable(args) -> hashable, got {self.key!r}")
        if self.caller_key is not None and not callable(self.caller_key):
            raise ValueError(
                f"caller_key must be a callable(request) -> hashable, got {self.caller_key!r}"
            )
        if self.scope == "inflight" and self.ttl is not None:
            raise ValueError(
                f'scope="inflight" keeps no results, so ttl={self.ttl!r} has no effect; '
                'use scope="run" (or "global") to reuse completed results'
            )
        check_limits(ttl=self.ttl, max_concurrency=self.max_concurrency, rate_limit=self.rate_limit)

    @property
    def keeps_results(self) -> bool:
        """Whether completed results are reused by later calls (not only concurrent ones)."""
        return self.scope == "run" or (self.scope == "global" and self.ttl is not None)

    def call_key(self, tool_name: str, args: Mapping[str, Any]) -> Hashable:
        """What makes a call's arguments identical to another's: `(tool name, key(args))`.

        Args:
            tool_name: The tool's name.
            args: The arguments the model gave.

        Returns:
            A hashable key.

        Raises:
            TypeError: If the arguments are not JSON-serialisable and no `key` is set.
        """
        if self.key is not None:
            return (tool_name, self.key(dict(args)))
        return (
            tool_name,
            json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False),
        )

    def request_key(self, request: ToolCallRequest) -> Hashable:
        """The full key of a call: `call_key(...)`, plus `caller_key(request)` when set.

        Args:
            request: The tool call.

        Returns:
            A hashable key.

        Raises:
            TypeError: If the arguments are not JSON-serialisable and no `key` is set.
            Exception: Whatever `caller_key` raises.
        """
        base = self.call_key(request.tool_call["name"], request.tool_call["args"])
        if self.caller_key is None:
            return base
        return (base, self.caller_key(request))

    def scope_of_call(self) -> Hashable | None:
        """The partition the calling code shares in, or None when it has none (no sharing)."""
        if self.scope == "global":
            return _GLOBAL
        return run_scope()


@dataclass(slots=True, eq=False, weakref_slot=True)
class ToolCoalescing:
    """The runtime of one `coalesce()` call: its policy, its coalescer, who keeps it alive.

    Made by `coalesce`, found from any copy of its tool with `coalescing(tool)`;
    the hooks run calls through its `coalescer`.
    """

    policy: CoalescePolicy
    """The options (frozen)."""
    coalescer: Coalescer[ToolResult]
    """In-flight executions, kept results, the concurrency and rate limits."""
    holders: dict[int, weakref.ref[BaseTool]] = field(default_factory=dict)
    """The tool objects keeping this runtime alive, by `id()`."""

    @classmethod
    def start(cls, policy: CoalescePolicy) -> ToolCoalescing:
        """A fresh runtime for `policy`: nothing in flight, nothing kept."""
        coalescer: Coalescer[ToolResult] = Coalescer(
            ttl=policy.ttl,
            max_concurrency=policy.max_concurrency,
            rate_limit=policy.rate_limit,
            share_errors=policy.share_errors,
        )
        return cls(policy=policy, coalescer=coalescer)


def run_scope() -> Hashable | None:
    """The run the calling code belongs to, as a coalescing scope.

    Inside a fan_out sibling: its fan_out run (`SiblingInfo.run_id`, unique to
    one invocation). Elsewhere in a LangGraph run: the root run, identified by
    its `Runtime.control` object (LangGraph creates one per root invocation;
    subgraphs, Send tasks and nested graphs inherit it; checked on langgraph
    1.2). None outside any run, or on a LangGraph without run control:
    nothing is then shared. (A `control=` object passed by hand to two
    invocations makes them one scope: LangGraph asks for one per run.)

    Returns:
        A hashable scope, or None.
    """
    sibling = current_sibling()
    if sibling is not None:
        return sibling.run_id or sibling.group
    try:
        control = get_runtime().control
    except Exception:  # outside a LangGraph run
        return None
    if control is None:
        return None
    # The object itself (identity equality), never its id(): a stored scope
    # holds it alive, so a later run can never reuse its identity.
    return ("langgraph.run", control)


# ---------------------------------------------------------------------------------------
# What a tool reads of its caller
# ---------------------------------------------------------------------------------------


def _caller_inputs(tool: BaseTool) -> list[str]:
    """The tool's inputs that depend on the caller.

    Injected state, store, runtime, other injected arguments and a
    `RunnableConfig` parameter.

    `InjectedToolCallId` is allowed: a shared `ToolMessage` gets each caller's
    id anyway, and a `Command` (what such tools usually return) is never shared.
    """
    found: set[str] = set(_config_params(tool))
    try:
        schema = tool.get_input_schema()
        shown = tool.tool_call_schema
    except Exception:  # a tool with a JSON-schema dict: nothing can be injected
        return sorted(found)
    if isinstance(shown, dict):
        return sorted(found)
    fields = _fields(schema)
    hidden = set(fields) - set(_fields(shown))
    found |= {name for name in hidden if not _is_tool_call_id(fields[name])}
    return sorted(found)


def _config_params(tool: BaseTool) -> list[str]:
    """Parameters LangChain fills with the caller's `RunnableConfig` (not in any schema)."""
    functions = [getattr(tool, "func", None), getattr(tool, "coroutine", None)]
    for method in ("_run", "_arun"):
        impl = getattr(type(tool), method, None)
        # StructuredTool/Tool take `config` to pass it on to `func`: only a
        # tool class of the user's own reads it itself.
        if impl is not None and not impl.__module__.startswith("langchain_core."):
            functions.append(impl)
    names: list[str] = []
    for fn in functions:
        if fn is None:
            continue
        try:
            hints = typing.get_type_hints(fn)
        except Exception:
            hints = {}
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        for name in params:
            hint = hints.get(name, params[name].annotation)
            if hint is RunnableConfig or hint == "RunnableConfig":
                names.append(name)
    return names


def _fields(schema: Any) -> dict[str, Any]:
    # pydantic v2 models have `model_fields`, v1 models `__fields__`.
    fields = getattr(schema, "model_fields", None)
    if fields is None:
        fields = getattr(schema, "__fields__", {})
    return dict(fields)


def _is_tool_call_id(field_info: Any) -> bool:
    for marker in getattr(field_info, "metadata", ()):
        if marker is InjectedToolCallId or isinstance(marker, InjectedToolCallId):
            return True
    return False


# ---------------------------------------------------------------------------------------
# coalesce() and the registry
# ---------------------------------------------------------------------------------------


def coalesce(
    tool: BaseTool | Callable[..., Any],
    *,
    scope: Scope = "run",
    ttl: float | None = None,
    key: Callable[[dict[str, Any]], Hashable] | None = None,
    caller_key: CallerKey | None = None,
    max_concurrency: int | None = None,
    rate_limit: float | None = None,
    share_errors: bool = True,
) -> BaseTool:
    """Mark a tool whose identical calls may be shared among the siblings of one run.

    Returns a copy of the tool carrying a `CoalescePolicy` in its `metadata`;
    it is still an ordinary tool everywhere. Under `BatchToolNode` or
    `BatchMiddleware`, calls with the same tool name and the same arguments
    (canonical JSON, or `key(args)`) run once; every caller gets the result
    with its own `tool_call_id`.

    Who shares (`scope`): by default the calls of ONE run: one fan_out run
    or, outside fan_out, one LangGraph root run (one `graph.invoke`, its
    subgraphs and Send tasks included). Two concurrent runs, two threads or
    two users never share a call or a result unless you choose
    `scope="global"`: do that only for a tool whose answer is the same for
    every caller (a public API), usually with a `ttl`.

    A tool whose result depends on its caller (it takes an injected
    `RunnableConfig`, `InjectedState`, `InjectedStore`, `ToolRuntime` or another
    injected argument) is refused unless `caller_key` says what it reads:
    calls then share only when `caller_key(request)` is equal. A tool that
    reads its caller some other way (`get_config()`, a context variable) must
    declare `caller_key` too; `coalesce()` cannot see that.

    What is never shared: a tool returning a `Command` (the result goes to the
    caller that ran it; the others run the tool themselves), an interrupt
    raised inside the tool, and errors when `share_errors=False`. Errors and
    error `ToolMessage`s are shared only among callers waiting at the same
    time, never stored. `InjectedToolCallId` is allowed (a shared
    `ToolMessage` gets each caller's id).

    !!! version-changed "Changed after 0.1.0"
        Sharing no longer crosses runs: `scope="run"` outside fan_out and
        `scope="inflight"` used to share among every concurrent call of the
        process, and `ttl` kept results process-wide. Use `scope="global"`
        for that.

    Args:
        tool: A `BaseTool` (e.g. from `@tool`) or a plain function (converted with `@tool`).
        scope: `"run"` (default): in-flight and completed results, within one
            run; `"inflight"`: only concurrent calls, within one run;
            `"global"`: across runs, threads and users (completed results for
            `ttl` seconds when a `ttl` is given, else only concurrent calls).
        ttl: Reuse a completed result for at most this many seconds (within
            its scope; monotonic clock). Not with `scope="inflight"`.
        key: `callable(args) -> hashable` deciding which arguments are identical.
        caller_key: `callable(request) -> hashable`: what the tool reads of its
            caller, from the `ToolCallRequest` (`request.runtime.config`,
            `.context`, `.state`, `.store`). Required for a tool with
            injected arguments.
        max_concurrency: At most this many executions at once, across all siblings.
        rate_limit: At most this many executions start per second (async token
            bucket, never blocks the event loop).
        share_errors: Give a failed execution's error to every caller waiting
            on it (default: a retry by each caller would multiply the load).

    Returns:
        The coalesced tool.

    Raises:
        ValueError: If an option is out of range, or the tool takes injected
            arguments and no `caller_key` is given.

    Example:
        ```python
        from langchain_core.tools import tool
        from langgraph_batch.tools import BatchToolNode, coalesce

        @tool
        async def search(query: str) -> str:
            \"\"\"Search the web.\"\"\"
            return await my_search(query)

        @tool
        def orders(status: str, config: RunnableConfig) -> str:
            \"\"\"The caller's orders.\"\"\"
            return db.orders(config["configurable"]["user_id"], status)

        node = BatchToolNode([
            coalesce(search, max_concurrency=8),
            coalesce(orders, caller_key=lambda req: req.runtime.config["configurable"]["user_id"]),
        ])
        ```
    """
    base = tool if isinstance(tool, BaseTool) else as_tool(tool)
    if not isinstance(base, BaseTool):  # pragma: no cover - @tool always returns a BaseTool
        raise ValueError(f"cannot make a tool of {tool!r}")
    policy = CoalescePolicy(
        scope=scope,
        ttl=ttl,
        key=key,
        caller_key=caller_key,
        max_concurrency=max_concurrency,
        rate_limit=rate_limit,
        share_errors=share_errors,
    )
    injected = _caller_inputs(base)
    if injected and caller_key is None:
        raise ValueError(
            f"tool {base.name!r} takes caller-dependent arguments {injected}: its result "
            "depends on the caller, so calls of two callers cannot be assumed identical. "
            "Declare what it reads with caller_key=lambda request: ... (for example "
            "request.runtime.config['configurable']['user_id'], "
            "request.runtime.context.user_id or request.state['doc_id']), "
            "or do not coalesce this tool."
        )
    policy_id = uuid.uuid4().hex
    summary = {
        "id": policy_id,
        "scope": scope,
        "ttl": ttl,
        "key": _name_of(key),
        "caller_key": _name_of(caller_key),
        "max_concurrency": max_concurrency,
        "rate_limit": rate_limit,
        "share_errors": share_errors,
    }
    metadata = {**(base.metadata or {}), METADATA_KEY: summary}
    marked = base.model_copy(update={"metadata": metadata})
    live = ToolCoalescing.start(policy)
    _LIVE[policy_id] = live
    _hold(marked, live)
    return marked


def _name_of(fn: Callable[..., Any] | None) -> str | None:
    return None if fn is None else getattr(fn, "__qualname__", repr(fn))


def _release(live: ToolCoalescing) -> None:
    """Finalizer of a tool object: drops its strong reference to `live` (the argument)."""


def _hold(tool: BaseTool, live: ToolCoalescing) -> None:
    """Keep `live` alive exactly as long as `tool` (or another holder) is."""
    tool_id = id(tool)
    ref = live.holders.get(tool_id)
    if ref is not None and ref() is tool:
        return
    # The callback reaches the runtime weakly: no reference cycle through it.
    live_ref = weakref.ref(live)

    def gone(_: weakref.ref[BaseTool]) -> None:
        owner = live_ref()
        if owner is not None:
            owner.holders.pop(tool_id, None)

    live.holders[tool_id] = weakref.ref(tool, gone)
    # The finalizer holds `live` (its argument) until `tool` is collected.
    weakref.finalize(tool, _release, live)


def coalescing(tool: BaseTool | None) -> ToolCoalescing | None:
    """The runtime of a tool made by `coalesce` (None for an ordinary tool).

    A copy of a coalesced tool (`model_copy`, `copy.deepcopy`) shares its
    runtime and keeps it alive too, once it has been looked up here.

    Args:
        tool: Any tool (or None).

    Returns:
        Its `ToolCoalescing`, or None.

    Example:
        ```python
        live = coalescing(coalesce(search))
        assert live is not None and live.coalescer.inflight() == 0
        ```
    """
    if tool is None or not tool.metadata:
        return None
    summary = tool.metadata.get(METADATA_KEY)
    if not isinstance(summary, dict):
        return None
    policy_id = str(summary.get("id"))
    live = _LIVE.get(policy_id)
    if live is None:
        if policy_id not in _MISSING_WARNED and len(_MISSING_WARNED) < 1024:
            _MISSING_WARNED.add(policy_id)
            logger.warning(
                "tool %s is marked by coalesce() but its policy is gone (the tool object "
                "coalesce() returned was garbage-collected and this copy was never used "
                "while it lived); its calls run uncoalesced. Keep the tool coalesce() "
                "returned, or call coalesce() again.",
                tool.name,
            )
        return None
    _hold(tool, live)
    return live


def coalesce_policy(tool: BaseTool | None) -> CoalescePolicy | None:
    """The `CoalescePolicy` of a tool made by `coalesce`, or None for an ordinary tool.

    A copy of a coalesced tool (`model_copy`, `copy.deepcopy`) shares its
    policy and keeps it alive too, once it has been looked up here.

    Args:
        tool: Any tool (or None).

    Returns:
        The policy, or None.

    Example:
        ```python
        assert coalesce_policy(coalesce(search)) is not None
        assert coalesce_policy(search) is None
        ```
    """
    live = coalescing(tool)
    return None if live is None else live.policy


def forget_run(run_id: str) -> None:
    """Drop the results every coalesced tool keeps for the fan_out run `run_id`.

    `fan_out` calls this when a run ends; results are otherwise kept for the
    256 most recently used runs per tool.

    Args:
        run_id: The run's `SiblingInfo.run_id` (or `group` for a `SiblingInfo`
            made without a `run_id`).

    Example:
        ```python
        forget_run(sibling.run_id)
        ```
    """
    for live in list(_LIVE.values()):
        live.coalescer.forget_scope(run_id)
