"""A diagnostic: what the event loop was running when it went long without a turn.

A callback on the loop marks each turn; a thread of its own looks every few milliseconds,
and while the loop is past ``--log-loop-stalls-ms`` behind, it samples the loop thread's
stack (``sys._current_frames()``). When the loop turns again, one warning gives the stall's
length and the stacks sampled (each distinct one once, with how often it was seen), and
what the process's other threads were running at the first sample: a C call that holds the
GIL (a RocksDB write in an I/O thread) stalls the loop from another thread, and the watchdog
itself only runs once that call lets go, so the other threads' stacks name it. Where Linux
counts it (``/proc/self/task/<id>/schedstat``), the warning also splits the stall into the
loop thread's time on a CPU, runnable but waiting for a CPU (a busy machine), and neither
(waiting for the GIL, a lock or I/O), and names the garbage collections that ran meanwhile
(one holds the GIL throughout, whichever thread set it off).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import traceback
from collections import Counter, deque
from types import FrameType

log = logging.getLogger(__name__)

TICK_S = 0.005  # how often the loop marks a turn
_LOOK_S = 0.005  # how often the watchdog looks
_STACK_LIMIT = 12  # frames of each stack kept (the innermost)


class LoopWatchdog:
    """Logs a warning with the loop thread's stack for each stall past ``threshold_s``.

    Args:
        threshold_s: The stall (the time past a turn's tick the loop did not turn) that
            is logged.

    ``start()`` on the loop, ``stop()`` (idempotent) before it closes; :attr:`stalls` counts
    the stalls logged and :attr:`longest_s` is the longest.
    """

    def __init__(self, threshold_s: float) -> None:
        if threshold_s <= 0:
            raise ValueError(f"threshold_s ({threshold_s}) must be > 0")
        self.threshold_s = threshold_s
        self.stalls = 0
        self.longest_s = 0.0
        self._beat = time.perf_counter()
        #: stalls the loop saw end, for the watchdog: (when, seconds)
        self._ended: deque[tuple[float, float]] = deque()
        self._gc_started = 0.0
        #: long garbage collections: (when it ended, seconds, generation)
        self._collections: deque[tuple[float, float, int]] = deque(maxlen=64)
        self._loop_thread = 0
        self._loop_native_id = 0
        self._handle: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start marking the running loop's turns, and the thread that watches them."""
        if self._thread is not None:
            return
        loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._loop_native_id = threading.get_native_id()
        self._beat = time.perf_counter()
        self._handle = loop.call_later(TICK_S, self._tick, loop)
        self._stop.clear()
        gc.callbacks.append(self._on_gc)
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop both; idempotent."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        """Times each garbage collection (it holds the GIL throughout, in whichever
        thread set it off): the long ones are named in the stall they fall in."""
        now = time.perf_counter()
        if phase == "start":
            self._gc_started = now
        elif now - self._gc_started > self.threshold_s / 4:
            self._collections.append((now, now - self._gc_started, info["generation"]))

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        now = time.perf_counter()
        late = now - self._beat - TICK_S
        self._beat = now
        if late > self.threshold_s:  # the loop turned after a stall: the watchdog logs it
            self._ended.append((now, late))
        self._handle = loop.call_later(TICK_S, self._tick, loop)

    def _watch(self) -> None:
        seen: Counter[str] = Counter()
        others = ""
        schedstat = f"/proc/self/task/{self._loop_native_id}/schedstat"
        calm = _cpu_times(schedstat)  # the loop thread's, at the last look before a stall
        while not self._stop.wait(_LOOK_S):
            while self._ended:
                now = _cpu_times(schedstat)
                spent = None
                if now is not None and calm is not None:
                    spent = (now[0] - calm[0], now[1] - calm[1])
                self._report(*self._ended.popleft(), seen, others, spent)
                seen, others, calm = Counter(), "", now
            if time.perf_counter() - self._beat - TICK_S <= self.threshold_s:
                calm = _cpu_times(schedstat)
            else:
                frames = sys._current_frames()
                loop_frame = frames.get(self._loop_thread)
                if loop_frame is not None:
                    seen[_stack(loop_frame)] += 1
                if not others:
                    others = _others(frames, self._loop_thread)

    def _report(
        self,
        ended: float,
        stall_s: float,
        seen: Counter[str],
        others: str,
        spent: tuple[float, float] | None,
    ) -> None:
        self.stalls += 1
        self.longest_s = max(self.longest_s, stall_s)
        where = ""
        if spent is not None:  # from the kernel's count (within a look or two)
            where = (
                f" (its thread: {spent[0] * 1e3:.0f} ms on a CPU, {spent[1] * 1e3:.0f} ms "
                "runnable but waiting for a CPU, the rest waiting for the GIL, a lock or I/O)"
            )
        gcs = [
            (s, g)
            for end, s, g in list(self._collections)
            if ended - stall_s - TICK_S <= end <= ended
        ]
        if gcs:
            where += "; garbage collections meanwhile: " + ", ".join(
                f"{s * 1e3:.0f} ms (generation {g})" for s, g in gcs
            )
        if not seen:
            log.warning(
                "the event loop went %.0f ms without a turn%s, and this watchdog did not run "
                "meanwhile either: the process had no CPU, or a call held the GIL throughout",
                stall_s * 1e3,
                where,
            )
            return
        samples = sum(seen.values())
        stacks = "\n".join(
            f"-- seen in {n} of {samples} samples:\n{stack}" for stack, n in seen.most_common()
        )
        log.warning(
            "the event loop went %.0f ms without a turn%s; its thread's stack meanwhile:\n%s\n"
            "-- the other threads, at the first sample:\n%s",
            stall_s * 1e3,
            where,
            stacks,
            others,
        )


def _cpu_times(schedstat: str) -> tuple[float, float] | None:
    """A thread's seconds on a CPU and runnable waiting for one, from Linux's schedstat
    (None where there is none)."""
    try:
        with open(schedstat, "rb") as f:
            on_cpu, waiting, _slices = f.read().split()
    except (OSError, ValueError):
        return None
    return int(on_cpu) / 1e9, int(waiting) / 1e9


def _stack(frame: FrameType) -> str:
    return "".join(traceback.format_stack(frame, limit=_STACK_LIMIT))


def _others(frames: dict[int, FrameType], loop_thread: int) -> str:
    """The innermost frames of each thread but the loop's and the watchdog's own."""
    names = {t.ident: t.name for t in threading.enumerate()}
    own = threading.get_ident()
    lines = []
    for ident, frame in frames.items():
        if ident in (loop_thread, own):
            continue
        where = traceback.format_stack(frame, limit=3)
        lines.append(f"{names.get(ident, ident)}:\n{''.join(where)}")
    return "".join(lines) or "(none)"
