"""Child process for the SIGKILL test: pushes (items, a push body, a columnar body) and
deletes forever, printing what was answered.

Lines on stdout: ``sent put K`` / ``ack put K`` / ``sent del K`` / ``ack del K``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import msgpack
import numpy as np

from rlreplay.app.api.column_bodies import parse_any_push
from rlreplay.app.api.encoding import BodyFormat
from rlreplay.app.engine.engine import Engine
from rlreplay.app.settings import Settings
from rlreplay.app.tables.config import TableConfig
from rlreplay.app.tables.items import NewItem, push_body_items
from rlreplay.clients.bodies import columns_request, encode_body


def value_of(key: str) -> bytes:
    return msgpack.packb({"key": key, "pad": key.encode() * 50})


async def worker(eng: Engine, wid: int, acked: list[str]) -> None:
    i = 0
    while True:
        i += 1
        keys = [f"w{wid}-{i}-{j}" for j in range(4)]
        for k in keys:
            print("sent put", k)
        sys.stdout.flush()  # "sent" must reach the parent before the op can take effect
        if wid % 2:
            await eng.push("t", [NewItem(k, value_of(k), 1.0) for k in keys])
        elif wid == 2:  # as the API pushes a columnar body: the log keeps its columns
            pads = [k.encode() * 50 for k in keys]
            columns = {"key": np.array(keys), "pad": np.array(pads)}
            body = bytes(encode_body(columns_request(keys, columns, None, False)))
            push = parse_any_push(body, BodyFormat.MSGPACK)
            assert [it.value for it in push.items] == [value_of(k) for k in keys]
            await eng.push("t", push.items, validated=True, columns=push.columns)
        else:  # as the API pushes a msgpack body: the log keeps the body as sent
            pushed = [{"key": k, "value": msgpack.unpackb(value_of(k))} for k in keys]
            body = msgpack.packb({"items": pushed})
            items = push_body_items(body)
            assert [it.value for it in items] == [value_of(k) for k in keys]
            await eng.push("t", items, body=body)
        for k in keys:
            print("ack put", k)
        acked.extend(keys)
        if i % 3 == 0 and acked:
            doomed = acked[-7::3]
            for k in doomed:
                print("sent del", k)
            sys.stdout.flush()
            await eng.delete("t", doomed)
            for k in doomed:
                print("ack del", k)
        sys.stdout.flush()


async def main(data_dir: str, mode: str, wal_writer: str = "auto", cache_mb: str = "0.2") -> None:
    eng = Engine(
        Settings(
            data_dir=Path(data_dir),
            storage_mode=mode,  # type: ignore[arg-type]
            cache_memory_limit_mb=float(cache_mb),
            wal_checkpoint_mb=0.3,
            wal_writer=wal_writer,  # type: ignore[arg-type]
            io_threads=2,
        )
    )
    await eng.start()
    await eng.create_table("t", TableConfig())
    print("ready", flush=True)
    acked: list[str] = []

    # the writer checkpoints by itself each time the log passes wal_checkpoint_mb (0.3 MB)
    await asyncio.gather(*(worker(eng, w, acked) for w in range(4)))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
