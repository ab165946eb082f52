"""Process-wide registry: find the scheduler for a backend or a name, per event loop.

Schedulers are bound to the event loop they run in, so the registry keeps
one map per loop, held in a `WeakKeyDictionary`: when a loop goes away its
schedulers go with it (a scheduler drops its own reference to the loop when
it stops). Closed and dead schedulers are replaced on the next call.

Studio and the LangGraph SDK pass JSON-only configuration, so a chat model
may name its scheduler (`scheduler="main"`); `register_scheduler` makes a
name known, either for one `Scheduler` instance or as a recipe
(`backend_factory` + `policy`) that builds one per event loop.

`set_backend_wrapper(fn)` wraps every backend the registry's schedulers are
built on (the distributed worker puts its cluster-wide in-flight cap there,
without the scheduler knowing).
"""

from __future__ import annotations

import asyncio
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from langgraph_batch.backends.base import Backend
from langgraph_batch.scheduler._config import BatchPolicy
from langgraph_batch.scheduler._runner import Scheduler
from langgraph_batch.scheduler._state import SchedulerState

__all__ = (
    "BackendWrapper",
    "find_scheduler",
    "get_scheduler",
    "known_schedulers",
    "loop_schedulers",
    "register_scheduler",
    "scheduler_created",
    "scheduler_for",
    "set_backend_wrapper",
    "unregister_scheduler",
)

BackendFactory = Callable[[], Backend]
BackendWrapper = Callable[[Backend], Backend]


@dataclass(frozen=True, slots=True)
class _Recipe:
    backend_factory: BackendFactory
    policy: BatchPolicy | None


_lock = threading.Lock()
# loop -> key -> scheduler (schedulers made by scheduler_for or from recipes).
_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Scheduler]] = (
    weakref.WeakKeyDictionary()
)
# loop -> name -> key in _by_loop (names given to scheduler_for).
_names_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, str]] = (
    weakref.WeakKeyDictionary()
)
# loop -> futures waiting for the next scheduler scheduler_for creates there.
_created_waiters: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, list[asyncio.Future[Scheduler]]
] = weakref.WeakKeyDictionary()
# Process-wide names: explicit instances and recipes.
_instances: dict[str, Scheduler] = {}
_recipes: dict[str, _Recipe] = {}
_backend_wrapper: BackendWrapper | None = None


def set_backend_wrapper(wrapper: BackendWrapper | None) -> BackendWrapper | None:
    """Wrap the backend of every scheduler the registry creates from now on (None: stop).

    Schedulers created before keep their backend; explicit `Scheduler`
    instances are not affected.

    Returns:
        The wrapper installed before.

    Example:
        ```python
        previous = set_backend_wrapper(lambda backend: MyLimitedBackend(backend))
        ```
    """
    global _backend_wrapper
    with _lock:
        previous, _backend_wrapper = _backend_wrapper, wrapper
    return previous


def _usable(s: Scheduler, loop: asyncio.AbstractEventLoop) -> bool:
    if s.state is SchedulerState.UNOPENED:
        return True
    return s.state is SchedulerState.OPENED and s.loop is loop


def _purge_closed_loops() -> None:
    for loop in [lp for lp in _by_loop if lp.is_closed()]:
        _by_loop.pop(loop, None)
        _names_by_loop.pop(loop, None)


def scheduler_for(
    *,
    key: str,
    backend_factory: BackendFactory,
    policy: BatchPolicy | None = None,
    name: str | None = None,
    backend_key: str | None = None,
) -> Scheduler:
    """The shared scheduler for `key` in the running event loop, created on first use.

    Every caller passing the same key (usually `backend.key`) in the same
    loop gets the same open scheduler, whatever its own sampling options,
    so their requests share one set of slots. A closed or dead scheduler is
    replaced. The first caller's `policy` wins; later ones are ignored.
    The scheduler owns the backend the factory built and closes it.

    When `name` was registered with `register_scheduler`, the registration
    wins: a registered instance usable in this loop is returned as is, and a
    registered recipe's `backend_factory`/`policy` replace the arguments.

    Args:
        key: what identifies the endpoint (set), e.g. `backend.key`.
        backend_factory: builds the backend when a scheduler must be created.
        policy: the policy of a newly created scheduler.
        name: also make the scheduler findable by `find_scheduler(name)` in this loop.
        backend_key: with a `name` that is not registered: the key of the backend
            the caller means to use. A scheduler an earlier caller created under
            that name for another backend key (other credentials) is refused.

    Returns:
        The scheduler (its runner starts on the first submit).

    Raises:
        RuntimeError: no event loop is running.
        ValueError: `backend_key` differs from the named scheduler's backend.

    Example:
        ```python
        s = scheduler_for(key=backend.key, backend_factory=lambda: backend)
        assert s is scheduler_for(key=backend.key, backend_factory=lambda: backend)
        ```
    """
    loop = asyncio.get_running_loop()
    recipe = None
    with _lock:
        if name is not None:
            inst = _instances.get(name)
            if inst is not None and _usable(inst, loop):
                return inst
            recipe = _recipes.get(name)
            if recipe is not None:
                backend_factory, policy = recipe.backend_factory, recipe.policy
        per_loop = _by_loop.get(loop)
        if per_loop is None:
            _purge_closed_loops()
            per_loop = _by_loop[loop] = {}
        existing = per_loop.get(key)
        waiters: list[asyncio.Future[Scheduler]] | None = None
        if existing is not None and _usable(existing, loop):
            s = existing
        else:
            backend = backend_factory()
            if _backend_wrapper is not None:
                backend = _backend_wrapper(backend)
            s = Scheduler(backend, policy=policy, name=name or key, owns_backend=True)
            per_loop[key] = s
            waiters = _created_waiters.pop(loop, None)
        if name is not None:
            _names_by_loop.setdefault(loop, {})[name] = key
            if backend_key is not None and recipe is None and s.backend.key != backend_key:
                _wake(waiters, s)
                raise ValueError(
                    f"scheduler {name!r} was created for {s.backend.key}, but this caller "
                    f"uses {backend_key}: callers that share a scheduler share its endpoint "
                    "and credentials. Use another scheduler name, or register_scheduler(...)."
                )
        _wake(waiters, s)
    return s


def _wake(waiters: list[asyncio.Future[Scheduler]] | None, scheduler: Scheduler) -> None:
    for waiter in waiters or ():
        if not waiter.done():
            waiter.set_result(scheduler)


def scheduler_created() -> asyncio.Future[Scheduler]:
    """A future that the next scheduler `scheduler_for` creates in the running loop resolves.

    How `fan_out` without `scheduler=` learns of the scheduler its first
    sibling's model creates (a push: nothing polls). Cancel it to stop waiting.

    Example:
        ```python
        created = scheduler_created()
        scheduler = await asyncio.wait_for(created, timeout=1.0)
        ```
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Scheduler] = loop.create_future()
    with _lock:
        waiters = _created_waiters.setdefault(loop, [])
        waiters[:] = [w for w in waiters if not w.done()]  # cancelled waits leave
        waiters.append(future)
    return future


def register_scheduler(
    target: Scheduler | str,
    *,
    backend_factory: BackendFactory | None = None,
    policy: BatchPolicy | None = None,
    replace: bool = False,
) -> Scheduler | None:
    """Make a scheduler findable by name with `find_scheduler(name)`.

    Two forms: register an instance under its `name`, or register a recipe
    under a name (`backend_factory`, optional `policy`) from which one
    scheduler per event loop is built on demand (the form to use at import
    time, before any loop runs, e.g. for LangGraph Studio).

    Args:
        target: a `Scheduler` (registered as `target.name`), or a name.
        backend_factory: with a name: builds the backend.
        policy: with a name: the policy of the schedulers built.
        replace: allow replacing an existing registration of the same name.

    Returns:
        The instance registered, or None for a recipe.

    Raises:
        ValueError: the name is taken (and `replace` is False), or the
            arguments do not match one of the two forms.

    Example:
        ```python
        register_scheduler("main", backend_factory=lambda: backend_from_url(url),
                           policy=BatchPolicy(inflight_limit=128))
        llm = BatchedChatModel(model="m", base_url=url, scheduler="main")
        ```
    """
    with _lock:
        if isinstance(target, Scheduler):
            if backend_factory is not None or policy is not None:
                raise ValueError(
                    "register_scheduler(scheduler) takes no backend_factory/policy; "
                    "those are for register_scheduler(name, backend_factory=...)"
                )
            name = target.name
        else:
            if backend_factory is None:
                raise ValueError(
                    f"register_scheduler({target!r}) needs backend_factory=... "
                    "(or pass a Scheduler instance)"
                )
            name = target
        if not replace and (name in _instances or name in _recipes):
            raise ValueError(
                f"a scheduler named {name!r} is already registered; pass replace=True "
                "or unregister_scheduler(name) first"
            )
        _instances.pop(name, None)
        _recipes.pop(name, None)
        if isinstance(target, Scheduler):
            _instances[name] = target
            return target
        assert backend_factory is not None
        _recipes[name] = _Recipe(backend_factory, policy)
        return None


def unregister_scheduler(name: str) -> None:
    """Forget a name registered with `register_scheduler` (no error when unknown).

    Example:
        ```python
        unregister_scheduler("main")
        ```
    """
    with _lock:
        _instances.pop(name, None)
        _recipes.pop(name, None)


def known_schedulers() -> list[str]:
    """Every name `find_scheduler` can find now from the running loop (sorted).

    Example:
        ```python
        print(known_schedulers())   # ['main', 'vllm-a']
        ```
    """
    names = set(_instances) | set(_recipes)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        names |= set(_names_by_loop.get(loop, {}))
    return sorted(names)


def loop_schedulers() -> list[Scheduler]:
    """The open schedulers `scheduler_for` created in the running loop (none outside a loop).

    `fan_out` uses this to find the scheduler its siblings' models share when
    it was not given one, so it can read the server's KV capacity.

    Example:
        ```python
        [s.name for s in loop_schedulers()]   # ['VLLMBackend:http://127.0.0.1:8000']
        ```
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return []
    return [s for s in (_by_loop.get(loop) or {}).values() if _usable(s, loop)]


def find_scheduler(name: str) -> Scheduler:
    """The scheduler registered (or created by `scheduler_for`) under `name`.

    (`BatchedChatModel.get_scheduler()` is another thing: the scheduler that
    model's calls use; this finds one by name. `get_scheduler(name)` is the
    deprecated name of this function.)

    Looks up, in order: names given to `scheduler_for(name=...)` in the
    running loop, instances from `register_scheduler(scheduler)`, then
    recipes from `register_scheduler(name, backend_factory=...)` (one
    scheduler per loop, replaced when closed or dead).

    Args:
        name: the scheduler's name.

    Returns:
        The scheduler.

    Raises:
        KeyError: no scheduler has that name (the message lists known names).

    Example:
        ```python
        s = find_scheduler("main")
        resp = await s.submit(request)
        ```
    """
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    with _lock:
        if loop is not None:
            key = _names_by_loop.get(loop, {}).get(name)
            if key is not None:
                s = _by_loop.get(loop, {}).get(key)
                if s is not None and _usable(s, loop):
                    return s
        inst = _instances.get(name)
        if inst is not None:
            return inst
        recipe = _recipes.get(name)
    if recipe is not None:
        if loop is None:
            raise RuntimeError(
                f"find_scheduler({name!r}) builds its scheduler in the running event loop; "
                "call it from async code"
            )
        return scheduler_for(
            key=name,
            backend_factory=recipe.backend_factory,
            policy=recipe.policy,
            name=name,
        )
    raise KeyError(
        f"no scheduler named {name!r}; known: {known_schedulers() or 'none'}. "
        "Register one with register_scheduler(...) or create it with "
        "scheduler_for(key=..., backend_factory=..., name=...)."
    )


def get_scheduler(name: str) -> Scheduler:
    """Deprecated: `find_scheduler(name)` (a DeprecationWarning)."""
    warnings.warn(
        "langgraph_batch.scheduler.get_scheduler(name) is deprecated: use "
        "find_scheduler(name) (BatchedChatModel.get_scheduler() is unchanged)",
        DeprecationWarning,
        stacklevel=2,
    )
    return find_scheduler(name)
