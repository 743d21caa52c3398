"""The engine's forwarders spell out their part's signature (no ``**kw``), so a reader and
mypy can follow a call from the façade to the part, and the two cannot drift apart."""

from __future__ import annotations

import inspect

from rlreplay.app.engine.admission import Admission
from rlreplay.app.engine.claims import Claims
from rlreplay.app.engine.engine import Engine
from rlreplay.app.engine.reads import Reads

FORWARDED = {
    Admission: ("push", "delete", "update_priorities", "flush"),
    Reads: ("get", "get_many", "get_batch", "sample", "sample_batch"),
    Claims: (
        "patch",
        "claim",
        "ack",
        "release",
        "set_version",
        "expire_leases",
        "tasks",
        "task_stats",
    ),
}


def test_no_engine_method_takes_arbitrary_keywords() -> None:
    loose = [
        name
        for name, member in vars(Engine).items()
        if inspect.isfunction(member)
        and any(
            p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
            for p in inspect.signature(member).parameters.values()
        )
    ]
    assert loose == []


def test_each_forwarder_has_its_parts_signature() -> None:
    for part, names in FORWARDED.items():
        for name in names:
            mine = inspect.signature(getattr(Engine, name))
            theirs = inspect.signature(getattr(part, name))
            assert mine == theirs, (part.__name__, name, str(mine), str(theirs))
