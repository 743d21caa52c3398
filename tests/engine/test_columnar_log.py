"""A columnar push is logged as its columns (a ``push_columns`` record), not as every value:
replay after a crash builds the very values that were accepted, and remembers the push's
request id."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from rlreplay.app.api.column_bodies import parse_any_push
from rlreplay.app.api.encoding import BodyFormat
from rlreplay.app.engine.engine import Engine
from rlreplay.app.log import records
from rlreplay.app.tables.config import TableConfig
from rlreplay.clients.bodies import columns_request, encode_body
from tests.engine.conftest import crash, make_settings


def _body(keys: list[str], seed: int, request_id: str | None = None) -> bytes:
    rng = np.random.default_rng(seed)
    n = len(keys)
    columns = {
        "obs": rng.integers(0, 255, (n, 3000), dtype=np.uint8),  # wide: joined from slices
        "act": rng.standard_normal((n, 4)).astype(">f4"),  # narrow, big-endian
        "reward": rng.random(n),
        "done": rng.random(n) < 0.5,
    }
    request = columns_request(keys, columns, rng.random(n) * 3, False)
    if request_id is not None:
        request = msgspec.structs.replace(request, request_id=request_id)
    return bytes(encode_body(request))  # a body of pieces, joined as the server reads it


@pytest.mark.parametrize("mode", ["memory", "disk", "hybrid"])
async def test_a_columnar_push_replays_into_the_values_it_was_accepted_with(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    logged: list[str] = []
    push_columns = records.push_columns

    def recording(*args: object, **kwargs: object) -> list[object]:
        logged.append(records.PUSH_COLUMNS)
        return push_columns(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(records, "push_columns", recording)
    settings = make_settings(tmp_path / "d", storage_mode=mode, cache_memory_limit_mb=0.05)
    eng = Engine(settings)
    await eng.start()
    await eng.create_table("t", TableConfig())
    accepted = {}
    for p in range(3):
        keys = [f"p{p}/{i}" for i in range(6)]
        push = parse_any_push(_body(keys, p, request_id=f"rid-{p}"), BodyFormat.MSGPACK)
        assert push.columns is not None
        answer = await eng.push(
            "t",
            push.items,
            validated=True,
            body=push.raw,
            request_id=push.request_id,
            columns=push.columns,
        )
        assert answer == 6
        accepted.update({it.key: (it.value, it.priority) for it in push.items})
        if p == 0:  # a checkpoint between the pushes: the later ones only in the log
            await eng.flush()
            await eng._writer().checkpoint(full=False)
    assert logged == [records.PUSH_COLUMNS] * 3
    await crash(eng)

    again = Engine(settings)
    await again.start()
    try:
        got = await again.get_many("t", list(accepted))
        assert {g.key: (g.value, g.priority) for g in got if g is not None} == accepted
        # the same request id after the restart: the first answer, nothing pushed again
        keys = [f"p2/{i}" for i in range(6)]
        push = parse_any_push(_body(keys, 99, request_id="rid-2"), BodyFormat.MSGPACK)
        assert await again.push("t", push.items, validated=True, request_id="rid-2") == 6
        (item,) = await again.get_many("t", ["p2/0"])
        assert item is not None and item.value == accepted["p2/0"][0]
    finally:
        await again.stop()


def test_the_record_reads_back_with_its_fields() -> None:
    record = records.push_columns("t", ["a", "b"], [1.0, 2.0], 2.5, {"request": ["r", 202]})
    got = records.read_record([7, *record, b"columns"])
    assert (got.kind, got.table) == (records.PUSH_COLUMNS, "t")
    assert got.fields == (["a", "b"], [1.0, 2.0], 2.5, {"request": ["r", 202]}, b"columns")
