"""What crosses Redis: strict msgpack payloads with size caps, and input validation.

Payloads (job inputs, sibling outcomes, shared tool results) are encoded with
LangGraph's `JsonPlusSerializer` in strict msgpack mode: only LangGraph's
built-in safe types (messages, documents, datetimes, ...) and the types an
allowlist names are rebuilt. The allowlist is built from the sibling graph's
state, input and output schemas, plus `allowed_types`. A payload that names
any other type is refused with `PayloadRejectedError` (nothing it names is
imported or called); pickle and JSON-constructor payloads are never read.

On the wire a payload is the type name, a NUL byte, then the bytes, at most
`max_payload_bytes` long, checked before encoding returns and before
decoding starts.

`validate_input` checks a job's input against the sibling graph's input
schema the way LangGraph itself would accept it: a mapping whose keys the
schema declares, with values of the declared simple types (`int`, `str`,
`list`, ...). Keys whose channel has a reducer (`messages`) accept anything
their reducer does.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import enum
import logging
import types
import typing
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, Literal, Union, get_args, get_origin

import typing_extensions
from langgraph.checkpoint.serde.event_hooks import register_serde_event_listener
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_batch.errors import PayloadRejectedError, PayloadTooLargeError

__all__ = ("DEFAULT_MAX_PAYLOAD_BYTES", "Serde", "graph_types", "validate_input")

logger = logging.getLogger(__name__)

DEFAULT_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
"""Default cap on one encoded payload (a job input, a result, a shared tool result)."""

_ACCEPTED = frozenset({b"msgpack", b"null"})

# Types the strict serializer refused while decoding in this context (None: not decoding).
_BLOCKED: ContextVar[list[str] | None] = ContextVar("lgb_serde_blocked", default=None)


def _on_serde_event(event: Any) -> None:
    blocked = _BLOCKED.get()
    if blocked is None or not isinstance(event, Mapping):
        return
    if str(event.get("kind", "")).endswith("blocked"):
        name = f"{event.get('module')}.{event.get('name')}"
        if event.get("method"):
            name += f".{event['method']}"
        blocked.append(name)


register_serde_event_listener(_on_serde_event)


@contextlib.contextmanager
def _collect_blocked() -> Iterator[list[str]]:
    found: list[str] = []
    token = _BLOCKED.set(found)
    try:
        yield found
    finally:
        _BLOCKED.reset(token)


class Serde:
    """Encode and decode payloads strictly, within a size cap.

    Example:
        ```python
        serde = Serde.for_graph(agent, max_bytes=1 << 20)
        data = serde.dumps({"messages": [HumanMessage("hi")]}, what="input")
        assert serde.loads(data, what="input")["messages"][0].content == "hi"
        ```
    """

    def __init__(
        self,
        *,
        allowed: Iterable[type | tuple[str, str]] = (),
        max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        """Create a serializer.

        Args:
            allowed: Types (or `(module, name)` pairs) rebuilt besides LangGraph's safe set.
            max_bytes: The cap on one encoded payload, `>= 1`.

        Raises:
            ValueError: If `max_bytes < 1`.
        """
        if max_bytes < 1:
            raise ValueError(f"max_payload_bytes must be >= 1, got {max_bytes!r}")
        self.max_bytes = max_bytes
        names = {(t.__module__, t.__name__) if isinstance(t, type) else t for t in allowed}
        self.allowed = frozenset(names)
        base = JsonPlusSerializer(allowed_msgpack_modules=None, pickle_fallback=False)
        self._serde = base.with_msgpack_allowlist(sorted(self.allowed)) if self.allowed else base

    @classmethod
    def for_graph(
        cls,
        graph: Any,
        *,
        extra: Iterable[type | tuple[str, str]] = (),
        max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> Serde:
        """A serializer whose allowlist covers `graph`'s state types plus `extra`."""
        return cls(allowed=[*graph_types(graph), *extra], max_bytes=max_bytes)

    def dumps(self, obj: Any, *, what: str) -> bytes:
        """Encode `obj`.

        Raises:
            PayloadTooLargeError: The encoding is over `max_bytes`.
            TypeError: `obj` holds something msgpack cannot encode.
        """
        try:
            kind, data = self._serde.dumps_typed(obj)
        except Exception as exc:
            raise TypeError(f"cannot serialise the {what}: {type(exc).__name__}: {exc}") from exc
        if kind not in ("msgpack", "null"):
            raise TypeError(f"cannot serialise the {what} as msgpack (got {kind!r})")
        payload = kind.encode() + b"\0" + bytes(data)
        if len(payload) > self.max_bytes:
            raise PayloadTooLargeError(
                f"the {what} is {len(payload)} bytes encoded, over max_payload_bytes="
                f"{self.max_bytes}; make it smaller or raise the limit on both sides",
                size=len(payload),
                limit=self.max_bytes,
                what=what,
            )
        return payload

    def loads(self, payload: bytes, *, what: str) -> Any:
        """Decode a payload made by `dumps` (by any process with the same allowlist).

        Raises:
            PayloadTooLargeError: It is over `max_bytes` (not decoded).
            PayloadRejectedError: Not a strict msgpack payload, or it names
                types outside the allowlist.
        """
        if len(payload) > self.max_bytes:
            raise PayloadTooLargeError(
                f"the {what} is {len(payload)} bytes, over max_payload_bytes={self.max_bytes}",
                size=len(payload),
                limit=self.max_bytes,
                what=what,
            )
        kind, sep, data = bytes(payload).partition(b"\0")
        if not sep or kind not in _ACCEPTED:
            shown = kind[:16].decode("ascii", "replace") if sep else "(no type)"
            raise PayloadRejectedError(
                f"the {what} is not a strict msgpack payload (type {shown!r}); "
                "only msgpack is accepted, never pickle or JSON constructors"
            )
        with _collect_blocked() as blocked:
            try:
                value = self._serde.loads_typed((kind.decode(), data))
            except Exception as exc:
                raise PayloadRejectedError(
                    f"the {what} could not be decoded: {type(exc).__name__}: {exc}"
                ) from None
        if blocked:
            names = sorted(set(blocked))
            raise PayloadRejectedError(
                f"the {what} names types that are not allowed: {', '.join(names)}. "
                "If they are yours, pass allowed_types=[...] to RedisExecutor and "
                "--allowed-type to the workers",
                blocked=names,
            )
        return value


# ---------------------------------------------------------------------------------------
# The allowlist: types reachable from a graph's schemas
# ---------------------------------------------------------------------------------------


def _schemas(graph: Any) -> list[Any]:
    builder = getattr(graph, "builder", None)
    found = [
        getattr(builder, name, None)
        for name in ("state_schema", "input_schema", "output_schema")
        if builder is not None
    ]
    return [s for s in found if s is not None]


def _hints(typ: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(typ, include_extras=True)
    except Exception:
        return dict(getattr(typ, "__annotations__", {}) or {})


def graph_types(graph: Any) -> set[tuple[str, str]]:
    """The `(module, name)` of every class in `graph`'s state, input and output schemas.

    Pydantic models, dataclasses and enums are listed (and their fields
    searched); containers, unions, `Annotated` and TypedDicts are searched.
    """
    found: set[tuple[str, str]] = set()
    seen: set[int] = set()
    for schema in _schemas(graph):
        _collect(schema, found, seen)
    return found


def _collect(typ: Any, found: set[tuple[str, str]], seen: set[int]) -> None:
    if id(typ) in seen or typ is Any or typ is None:
        return
    seen.add(id(typ))
    origin = get_origin(typ)
    if origin is Literal:
        return
    if origin is not None or isinstance(typ, types.UnionType):
        for arg in get_args(typ):
            _collect(arg, found, seen)
        return
    if not isinstance(typ, type):
        return
    if typing_extensions.is_typeddict(typ):
        for hint in _hints(typ).values():
            _collect(hint, found, seen)
        return
    is_model = callable(getattr(typ, "model_dump", None)) and hasattr(typ, "model_fields")
    if is_model or dataclasses.is_dataclass(typ) or issubclass(typ, enum.Enum):
        found.add((typ.__module__, typ.__name__))
        if not issubclass(typ, enum.Enum):
            for hint in _hints(typ).values():
                _collect(hint, found, seen)


# ---------------------------------------------------------------------------------------
# Input validation
# ---------------------------------------------------------------------------------------


def validate_input(graph: Any, value: Any) -> list[str]:
    """Problems with `value` as `graph`'s input (empty when it fits, or nothing is declared).

    Example:
        ```python
        validate_input(agent, {"messages": [("user", "hi")]})  # []
        validate_input(agent, {"mesages": []})  # ["unknown key 'mesages' (...)"]
        ```
    """
    builder = getattr(graph, "builder", None)
    schema = getattr(builder, "input_schema", None)
    if schema is None:
        return []  # not a StateGraph: the Runnable checks its own input
    if (
        isinstance(schema, type)
        and not typing_extensions.is_typeddict(schema)
        and isinstance(value, schema)
    ):
        return []
    if not isinstance(value, Mapping):
        return [f"the input must be a mapping for {_name(schema)}, got {type(value).__name__}"]
    hints = _hints(schema)
    if not hints:
        return []
    known = ", ".join(sorted(hints))
    problems: list[str] = []
    for key, item in value.items():
        if key not in hints:
            problems.append(f"unknown key {key!r} (the input schema has: {known})")
        elif not _fits(item, hints[key]):
            problems.append(
                f"key {key!r}: a {type(item).__name__} does not fit {_name(hints[key])}"
            )
    return problems


def _name(typ: Any) -> str:
    return getattr(typ, "__name__", None) or str(typ)


_WRAPPERS = tuple(
    w for w in (typing.Required, typing.NotRequired, getattr(typing, "ReadOnly", None)) if w
)
_SIMPLE = (str, bytes, int, float, bool, list, dict, tuple, set, frozenset)


def _fits(value: Any, hint: Any) -> bool:
    """A shallow, lenient check: False only when `value` clearly cannot be `hint`."""
    origin = get_origin(hint)
    if origin is typing.Annotated:
        base, *meta = get_args(hint)
        # A reducer (e.g. add_messages) decides what it accepts.
        return True if any(callable(m) for m in meta) else _fits(value, base)
    if origin in _WRAPPERS:
        return _fits(value, get_args(hint)[0])
    if origin is Union or isinstance(hint, types.UnionType):
        return any(_fits(value, arg) for arg in get_args(hint))
    if origin is Literal:
        return value in get_args(hint)
    if hint is None or hint is type(None):
        return value is None
    target = origin if origin is not None else hint
    if target is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if target in _SIMPLE:
        return isinstance(value, target)
    if target in (collections.abc.Sequence, collections.abc.MutableSequence):
        return isinstance(value, Sequence) and not isinstance(value, str | bytes)
    if target in (collections.abc.Mapping, collections.abc.MutableMapping):
        return isinstance(value, Mapping)
    return True  # classes, messages, Any, type variables: the graph validates them
