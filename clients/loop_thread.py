"""An event loop running on a thread of its own: where the synchronous clients' async clients
live, so that plain code, several threads at once, a notebook (whose main thread runs a loop)
and code inside a running loop can all call them and block on the answer.

The thread is not a daemon: it is stopped by :meth:`LoopThread.close`, which the owner calls
from its ``close()``, from a ``weakref.finalize`` when it is dropped unclosed, and at
interpreter exit, before Python waits for its threads (``threading``'s own exit hook, the one
``concurrent.futures`` uses), so an unclosed client never keeps a program from exiting.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, TypeVar

from rlreplay.wire.errors import ReplayError

__all__ = ["LoopThread"]

T = TypeVar("T")

#: How long closing waits for the owners' cleanup (closing connections) on the loop.
_CLOSE_TIMEOUT_S: Final = 10.0

_live: weakref.WeakSet[LoopThread] = weakref.WeakSet()
_exit_hook_lock = threading.Lock()
_exit_hook_registered = False


def _close_all() -> None:
    """Close every loop thread still running (at interpreter exit)."""
    for loop_thread in list(_live):
        loop_thread.close()


def _register_exit_hook() -> None:
    """Close the loop threads when the main thread ends, before Python joins the other
    threads (``atexit`` runs only after that join, which a running loop would block)."""
    global _exit_hook_registered
    with _exit_hook_lock:
        if _exit_hook_registered:
            return
        register: Callable[[Callable[[], None]], None] | None = getattr(
            threading, "_register_atexit", None
        )
        if register is None:  # pragma: no cover - every CPython since 3.9 has it
            import atexit

            atexit.register(_close_all)
        else:
            register(_close_all)
        _exit_hook_registered = True


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


class LoopThread:
    """An event loop on a (non-daemon) thread this object starts and stops.

    Args:
        name: The thread's name.
    """

    def __init__(self, name: str = "rlreplay-client") -> None:
        _register_exit_hook()
        self._loop = asyncio.new_event_loop()
        self._closers: list[Callable[[], Awaitable[object]]] = []
        self._lock = threading.Lock()
        self._closed = False
        self._closing: asyncio.Task[None] | None = None
        self._pid = os.getpid()
        self._thread = threading.Thread(target=_serve, args=(self._loop,), name=name)
        self._thread.start()
        _live.add(self)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def thread(self) -> threading.Thread:
        """The thread the loop runs on."""
        return self._thread

    def on_close(self, closer: Callable[[], Awaitable[object]]) -> None:
        """Await ``closer()`` on the loop when closing, before the loop stops."""
        self._closers.append(closer)

    def run(self, call: Coroutine[Any, Any, T]) -> T:
        """Run ``call`` on the loop and block until it ends: its answer, or its error.

        Interrupting the wait (``KeyboardInterrupt``) cancels ``call`` on the loop too.

        Raises:
            ReplayError: The loop thread is closed, or this process is a fork of the one
                that started it (the thread did not follow).
            RuntimeError: Called from the loop's own thread, which would wait for itself.
        """
        with self._lock:
            problem = self._unusable()
            if problem is None:
                future = asyncio.run_coroutine_threadsafe(call, self._loop)
        if problem is not None:
            call.close()
            raise problem
        try:
            return future.result()
        except BaseException:
            future.cancel()  # done already unless the wait itself was interrupted
            raise

    def _unusable(self) -> Exception | None:
        if self._closed:
            return ReplayError("the client is closed")
        if os.getpid() != self._pid:
            return ReplayError(
                "this client was created in the parent of this forked process, and its "
                "event-loop thread did not follow the fork: create a client in each process"
            )
        if threading.current_thread() is self._thread:
            return RuntimeError(
                "a synchronous client was called from its own event loop's thread, where "
                "it would wait for itself: await its async client there instead"
            )
        return None

    def close(self) -> None:
        """Cancel the calls still running, await the closers, stop the loop and join its
        thread. Calling it again does nothing; called on the loop's own thread (a finaliser
        run there), it stops the loop without waiting for it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _live.discard(self)
        if os.getpid() != self._pid:
            return  # a fork's copy: the thread and its loop are the parent's
        shutdown = self._shutdown()
        if threading.current_thread() is self._thread:
            self._closing = self._loop.create_task(shutdown)
            self._closing.add_done_callback(lambda _: self._loop.stop())
            return
        future = asyncio.run_coroutine_threadsafe(shutdown, self._loop)
        try:
            future.result(_CLOSE_TIMEOUT_S + 5)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()

    async def _shutdown(self) -> None:
        """On the loop: cancel the other tasks, await the closers (the loop is stopped
        once this has ended, so that its answer reaches the caller first)."""
        current = asyncio.current_task()
        # Streams first, while the connections are open and before their tasks are
        # cancelled, so that a consume() releases its leases: those still open, and those
        # dropped unclosed, whose aclose() the finaliser hook scheduled as a task.
        await asyncio.sleep(0)
        closing = [
            task
            for task in asyncio.all_tasks()
            if task is not current and type(task.get_coro()).__name__ == "async_generator_athrow"
        ]
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                await asyncio.gather(
                    self._loop.shutdown_asyncgens(), *closing, return_exceptions=True
                )
        except TimeoutError:
            pass  # what is left is cancelled below
        others = [task for task in asyncio.all_tasks() if task is not current]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                for closer in reversed(self._closers):
                    await closer()
        finally:
            self._closers.clear()
