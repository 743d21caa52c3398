"""The idempotency window keeps what happened to a write (its answer body, whose kind the
API turns into a status), never an HTTP status; files written when it kept a status
(``[id, at, 202, body]``, a log request ``[id, 202, body, time]``) still load."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import msgpack

from rlreplay.app.api.write_status import status_of
from rlreplay.app.engine.admission import note_answer, write_answer
from rlreplay.app.engine.recovery import remember_request
from rlreplay.app.log import records
from rlreplay.app.writer.memory_checkpoint import (
    MEMORY_CHECKPOINT,
    read_checkpoint_file,
    write_checkpoint_file,
)
from rlreplay.app.writer.request_ids import AnswerKind, RequestIds, answer_kind
from rlreplay.app.writer.state import EngineState


def test_the_window_keeps_the_answer_and_its_kind_not_a_status() -> None:
    ids = RequestIds()
    assert ids.begin("push:a") is None
    ids.finish("push:a", write_answer(3, applied=False))
    assert ids.begin("push:b") is None
    ids.finish("push:b", write_answer(2, applied=True))
    state = ids.state()
    assert [row[2:] for row in state] == [
        ["accepted", {"accepted": 3}],
        ["committed", {"committed": 2}],
    ]
    again = RequestIds()
    again.load(state)
    assert again.begin("push:a") == {"accepted": 3}
    assert again.begin("push:b") == {"committed": 2}


def test_a_window_saved_with_statuses_still_loads() -> None:
    ids = RequestIds()
    now = time.time()
    ids.load([["push:a", now, 202, {"accepted": 3}], ["patch:b", now, 200, {"committed": 1}]])
    assert ids.begin("push:a") == {"accepted": 3}
    assert ids.begin("patch:b") == {"committed": 1}


def test_the_log_request_record_names_the_kind() -> None:
    request: list[Any] = ["push:a", 0, {}, 1.5]
    note_answer(request, write_answer(4, applied=True))
    assert request == ["push:a", "committed", {"committed": 4}, 1.5]


def test_replay_remembers_request_records_old_and_new() -> None:
    state = SimpleNamespace(request_ids=RequestIds())
    now = time.time()
    new = records.put(
        "t", [], [], [], now, {"request": ["push:a", "accepted", {"accepted": 2}, now]}
    )
    old = records.delete("t", ["k"], ["delete:b", 200, {"committed": 1}, now])
    remember_request(cast(EngineState, state), [1, *new])
    remember_request(cast(EngineState, state), [2, *old])
    assert state.request_ids.begin("push:a") == {"accepted": 2}
    assert state.request_ids.begin("delete:b") == {"committed": 1}


def test_the_api_maps_each_kind_to_its_status() -> None:
    assert answer_kind({"accepted": 1}) is AnswerKind.ACCEPTED
    assert answer_kind({"committed": 1, "missing": 0}) is AnswerKind.COMMITTED
    assert status_of({"accepted": 1}) == 202
    assert status_of({"committed": 1, "missing": 2}) == 200


def test_a_snapshot_packs_what_state_gives_as_of_when_it_was_taken() -> None:
    ids = RequestIds()
    for i in range(5000):  # more than one slice of the packing
        ids.begin(f"push:{i}")
        ids.finish(f"push:{i}", write_answer(i, applied=i % 2 == 0))
    ids.begin("push:in-flight")
    snapshot = ids.snapshot()
    expected = ids.state()
    ids.finish("push:in-flight", write_answer(1, applied=True))  # after the snapshot
    ids.begin("push:later")
    ids.finish("push:later", write_answer(1, applied=True))
    assert msgpack.unpackb(snapshot.packed()) == expected
    assert len(expected) == 5000
    again = RequestIds()
    again.load(msgpack.unpackb(ids.snapshot().packed()))
    assert again.begin("push:in-flight") == {"committed": 1}


def test_answered_ids_leave_the_garbage_collectors_lists() -> None:
    # a window of 100,000 answers walked by every collection would stall the event loop
    ids = RequestIds()
    for i in range(1000):
        ids.begin(f"push:{i}")
        ids.finish(f"push:{i}", write_answer(i, applied=False))
    gc.collect()
    assert not any(map(gc.is_tracked, ids._answer.values()))


def test_the_memory_checkpoint_file_keeps_a_snapshot_of_the_window(tmp_path: Path) -> None:
    ids = RequestIds()
    for i in range(3000):
        ids.begin(f"push:{i}")
        ids.finish(f"push:{i}", write_answer(i, applied=False))
    header = {"lsn": 7, "next_tid": 1, "tables": [], "request_ids": ids.snapshot()}
    write_checkpoint_file(tmp_path / MEMORY_CHECKPOINT, header, [])
    read, rows = read_checkpoint_file(tmp_path / MEMORY_CHECKPOINT)
    assert read is not None and rows == []
    assert read["lsn"] == 7 and read["request_ids"] == ids.state()


def test_ids_past_keep_and_out_of_the_window_are_dropped_oldest_first() -> None:
    ids = RequestIds(window_s=0.0, keep=10)
    ids.begin("push:in-flight")  # never dropped while in flight, nor anything after it
    for i in range(3000):
        ids.begin(f"push:{i}")
        ids.finish(f"push:{i}", write_answer(i, applied=False))
    assert len(ids) == 3001  # held behind the one in flight
    ids.finish("push:in-flight", write_answer(1, applied=False))
    ids.begin("push:new")
    assert 10 <= len(ids) < 10 + 1024 + 2
    assert ids.begin("push:2999") == {"accepted": 2999}
    assert ids.begin("push:0") is None  # dropped: served anew
