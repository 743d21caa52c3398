"""Which server owns a key: rendezvous (highest-random-weight) hashing.

Every key gets a score on every shard, and the shard with the highest score owns it. The
score is a 64-bit hash of the key (BLAKE2b, so the same on every machine and every run,
unlike Python's ``hash()``) mixed with a 64-bit seed drawn from the shard's name by the
splitmix64 finaliser. Adding a shard moves only the keys that now score highest on it, about
``1/N`` of them, and removing one moves only its own keys; the order the shards are listed
in does not matter.

A key holding a hash tag, ``{tag}`` (the first ``{`` and the first ``}`` after it, with
something between), is hashed by its tag only, as Redis Cluster does: keys sharing a tag
(``{prompt-17}/0``, ``{prompt-17}/1``...) land on one shard, which a claim of whole groups
needs. A key without one is hashed whole.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = ["Rendezvous", "hashed_part", "key_hashes", "normalized_url"]

_M1: Final = np.uint64(0xBF58476D1CE4E5B9)
_M2: Final = np.uint64(0x94D049BB133111EB)


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def hashed_part(key: str) -> str:
    """What of ``key`` is hashed: its hash tag when it has a non-empty one, else all of it."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def key_hashes(keys: Iterable[str]) -> npt.NDArray[np.uint64]:
    """Each key's 64-bit BLAKE2b hash (of the UTF-8 bytes of its ``hashed_part``).

    Raises:
        TypeError: A key is not a string.
    """
    try:
        return np.fromiter((_hash64(hashed_part(key).encode()) for key in keys), dtype=np.uint64)
    except AttributeError:
        bad = next(key for key in keys if not isinstance(key, str))
        raise TypeError(f"key ({bad!r}) must be a string") from None


def normalized_url(url: str) -> str:
    """A server URL as shards are named by: no trailing slash, scheme and host lower-case."""
    url = url.strip().rstrip("/")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"server URL {url!r} has no scheme (http:// or https://)")
    host, slash, path = rest.partition("/")
    return f"{scheme.lower()}://{host.lower()}{slash}{path}"


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finaliser: every input bit flips about half the output bits."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class Rendezvous:
    """The owner of each key among named shards.

    Args:
        names: The shards' names (a sharded client uses their normalized URLs); distinct.

    Raises:
        ValueError: No name, or a name given twice.
    """

    def __init__(self, names: Sequence[str]) -> None:
        if not names:
            raise ValueError("at least one shard is needed")
        if len(set(names)) != len(names):
            raise ValueError(f"shard names must be distinct: {list(names)}")
        self.names = list(names)
        self._seeds = np.array([_hash64(name.encode()) for name in names], dtype=np.uint64)

    def owners(self, keys: Sequence[str]) -> npt.NDArray[np.intp]:
        """The index (in ``names``) of each key's shard."""
        if len(self.names) == 1 or not keys:
            return np.zeros(len(keys), dtype=np.intp)
        hashes = key_hashes(keys)
        with np.errstate(over="ignore"):  # uint64 products wrap, as the mixer wants
            scores = _mix(hashes[:, None] ^ self._seeds[None, :])
        return np.asarray(np.argmax(scores, axis=1), dtype=np.intp)

    def owner(self, key: str) -> int:
        """The index of ``key``'s shard."""
        return int(self.owners([key])[0])

    def split(self, keys: Sequence[str]) -> dict[int, npt.NDArray[np.intp]]:
        """Shard index -> the positions in ``keys`` of the keys it owns (shards owning none
        are left out), each in the order of ``keys``."""
        owners = self.owners(keys)
        if len(self.names) == 1:
            return {0: np.arange(len(keys), dtype=np.intp)} if len(keys) else {}
        order = np.argsort(owners, kind="stable")
        bounds = np.searchsorted(owners[order], np.arange(len(self.names) + 1))
        return {
            shard: order[bounds[shard] : bounds[shard + 1]]
            for shard in range(len(self.names))
            if bounds[shard + 1] > bounds[shard]
        }
