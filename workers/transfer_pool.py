"""Blocking transfers run a bounded number at a time, their results taken as each finishes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import TypeVar

__all__ = ["completed"]

_A = TypeVar("_A")
_R = TypeVar("_R")


def completed(
    fn: Callable[[_A], _R], items: Iterable[_A], *, workers: int, name: str = "rlreplay-backup"
) -> Iterator[tuple[_A, _R]]:
    """Run ``fn`` on each item in at most ``workers`` threads; yield ``(item, result)`` pairs
    in the order they finish.

    The caller's loop runs in the caller's thread, so a progress callback in it needs no lock.
    If ``fn`` raises, or the caller stops iterating (its own callback raised), the items not
    yet started are cancelled and the call returns only once the running ones have stopped:
    a caller cleaning up afterwards (removing a staging folder) never races a thread still
    writing into it.

    Raises:
        Exception: The first exception ``fn`` raised, as is.
    """
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name) as executor:
        futures: dict[Future[_R], _A] = {executor.submit(fn, item): item for item in items}
        try:
            for future in as_completed(futures):
                yield futures[future], future.result()
        finally:
            for future in futures:
                future.cancel()
