"""One background event loop that serves every synchronous model call.

A sync LangGraph graph (`graph.invoke`) runs its nodes in threads. If each
sync `llm.invoke` ran its own `asyncio.run`, every call would get a private
scheduler and nothing would batch. Instead, sync calls hand their coroutine
to one daemon thread running one event loop, started lazily and shared by
all callers in the process, so they all meet in that loop's scheduler.

The caller's context variables (`current_sibling()`, LangChain's run
context) travel with the coroutine: it runs in a copy of the calling
thread's context.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextvars
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ("BackgroundLoop", "background_loop")

logger = logging.getLogger(__name__)

T = TypeVar("T")

_DONE = object()


class BackgroundLoop:
    """An asyncio loop in a daemon thread, started on first use.

    Example:
        ```python
        loop = BackgroundLoop(name="demo")
        assert loop.run(asyncio.sleep(0, result=42)) == 42
        loop.close()
        ```
    """

    def __init__(self, *, name: str = "langgraph-batch-loop") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running background loop (started if needed)."""
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def _run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                thread = threading.Thread(target=_run, name=self._name, daemon=True)
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
                logger.debug("background loop %s started", self._name)
            return self._loop

    def in_loop_thread(self) -> bool:
        """True when called from the background loop's own thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coro` on the loop, in a copy of the caller's context.

        Raises:
            RuntimeError: If called from the loop's own thread (waiting on the
                future there would deadlock).
        """
        if self.in_loop_thread():
            coro.close()
            msg = (
                "A synchronous model call was made from inside langgraph-batch's background "
                "event loop; use the async API (ainvoke/astream) in async code."
            )
            raise RuntimeError(msg)
        ctx = contextvars.copy_context()
        result: concurrent.futures.Future[T] = concurrent.futures.Future()
        loop = self.loop

        def _start() -> None:
            task = loop.create_task(coro, context=ctx)

            def _done(t: asyncio.Task[T]) -> None:
                if result.cancelled():
                    return
                if t.cancelled():
                    result.cancel()
                elif (exc := t.exception()) is not None:
                    result.set_exception(exc)
                else:
                    result.set_result(t.result())

            task.add_done_callback(_done)

            def _cancel_from_caller(f: concurrent.futures.Future[T]) -> None:
                if f.cancelled():
                    loop.call_soon_threadsafe(task.cancel)

            result.add_done_callback(_cancel_from_caller)

        loop.call_soon_threadsafe(_start)
        return result

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and block the calling thread until it finishes.

        Interrupting the caller (e.g. KeyboardInterrupt) cancels the coroutine.
        """
        future = self.submit(coro)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run the plain function `fn(*args)` on the loop's thread and wait for it.

        For objects bound to the loop (asyncio futures, events) touched from
        another thread; called from the loop's own thread, it runs `fn` at once.
        """
        if self.in_loop_thread():
            return fn(*args)

        async def _call() -> T:
            return fn(*args)

        return self.run(_call())

    def iterate(self, aiter: AsyncIterator[T]) -> Iterator[T]:
        """Drive an async iterator on the loop and yield its items synchronously.

        Closing the returned generator early cancels the async iteration.
        """
        items: queue.SimpleQueue[Any] = queue.SimpleQueue()

        async def _pump() -> None:
            try:
                async for item in aiter:
                    items.put((True, item))
            except BaseException as exc:
                items.put((False, exc))
                raise
            finally:
                items.put((True, _DONE))

        future = self.submit(_pump())
        try:
            while True:
                ok, item = items.get()
                if item is _DONE:
                    break
                if not ok:
                    if isinstance(item, asyncio.CancelledError):
                        break
                    raise item
                yield item
            future.result()
        finally:
            if not future.done():
                future.cancel()

    def close(self, timeout: float = 5.0) -> None:
        """Cancel what still runs, stop the loop and join the thread. Idempotent."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None or loop.is_closed():
            return

        async def _shutdown() -> None:
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await loop.shutdown_asyncgens()

        if thread is not threading.current_thread():
            try:
                asyncio.run_coroutine_threadsafe(_shutdown(), loop).result(timeout)
            except (concurrent.futures.TimeoutError, RuntimeError):
                logger.warning("background loop %s did not shut down cleanly", self._name)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
        if not thread.is_alive():
            loop.close()


_BACKGROUND = BackgroundLoop()
atexit.register(_BACKGROUND.close)


def background_loop() -> BackgroundLoop:
    """The process-wide loop shared by all synchronous `BatchedChatModel` calls."""
    return _BACKGROUND
