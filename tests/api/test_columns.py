"""Columnar bodies in-process: pushes of columns store what per-item pushes store, and
sample and batchGet answer stacked columns (or refuse, consuming nothing)."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import msgpack
import msgspec
import numpy as np
import pytest

from rlreplay.wire.arrays import BFloat16Array
from rlreplay.wire.codec import from_jsonable, packb, to_jsonable, unpackb

MSGPACK = "application/msgpack"


class _StoredItem(msgspec.Struct):
    key: str
    value: msgspec.Raw
    priority: float
    inserted_at: float
    times_sampled: int


_STORED = msgspec.msgpack.Decoder(dict[str, list[_StoredItem | None]])


async def post(client: httpx.AsyncClient, path: str, body: Any, fmt: str = "msgpack") -> Any:
    """POSTs ``body`` (JSON bodies in the contract's JSON form) and returns (status, answer)
    decoded, arrays as NumPy arrays either way."""
    if fmt == "msgpack":
        content = body if isinstance(body, bytes) else packb(body)
        headers = {"content-type": MSGPACK, "accept": MSGPACK}
        r = await client.post(path, content=content, headers=headers)
        return r.status_code, unpackb(r.content)
    r = await client.post(path, json=to_jsonable(body))
    return r.status_code, from_jsonable(r.json())


async def stored(client: httpx.AsyncClient, table: str, keys: list[str]) -> list[bytes]:
    """The stored msgpack value of each key, as the server splices it into answers."""
    r = await client.post(
        f"/v1/tables/{table}/items:batchGet",
        content=packb({"keys": keys}),
        headers={"content-type": MSGPACK, "accept": MSGPACK},
    )
    assert r.status_code == 200, r.content
    items = _STORED.decode(r.content)["items"]
    assert all(item is not None for item in items)
    return [bytes(item.value) for item in items if item is not None]


async def make_table(client: httpx.AsyncClient, name: str, **config: Any) -> None:
    r = await client.put(f"/v1/tables/{name}", json={"sampler": {"type": "fifo"}, **config})
    assert r.status_code == 201, r.text


def columns_example(n: int = 3) -> dict[str, Any]:
    base = np.arange(n * 8, dtype=">f8").reshape(n, 2, 4)
    return {
        "obs": np.asfortranarray(base[:, :, ::2].astype("<f4")),  # not C-contiguous
        "big": base,
        "reward": np.linspace(-1, 1, n).astype("<f4"),
        "half": np.array([0.5, -0.0, np.inf][:n], dtype="<f2"),
        "action": np.array([3, 200, -70000][:n], dtype="<i8"),  # three msgpack int widths
        "done": np.array([True, False, True][:n]),
        "phase": np.array([1 + 2j, -0.5j, 3][:n], dtype="<c8"),
        "logits": BFloat16Array(np.arange(n * 2, dtype=np.uint16).reshape(n, 2) + 0x3F80),
        "empty": np.zeros((n, 0), dtype="<u2"),
    }


def per_item(columns: dict[str, Any], i: int) -> dict[str, Any]:
    """Item ``i``'s value as the per-item form would send it."""
    out = {}
    for name, column in columns.items():
        if isinstance(column, BFloat16Array):
            bits = column.bits[i]
            out[name] = BFloat16Array(np.asarray(bits))
        else:
            out[name] = column[i]
    return out


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
async def test_a_columnar_push_stores_the_bytes_of_the_per_item_form(
    client: httpx.AsyncClient, fmt: str
) -> None:
    columns = columns_example()
    keys = ["a", "b", "c"]
    await make_table(client, "cols")
    await make_table(client, "rows")
    body = {"keys": keys, "columns": columns, "priorities": [1.0, 2.5, 0.0], "wait": True}
    status, answer = await post(client, "/v1/tables/cols/items", body, fmt)
    assert (status, answer) == (200, {"committed": 3})
    items = [
        {"key": k, "value": per_item(columns, i), "priority": p}
        for i, (k, p) in enumerate(zip(keys, [1.0, 2.5, 0.0], strict=True))
    ]
    status, _ = await post(client, "/v1/tables/rows/items", {"items": items, "wait": True})
    assert status == 200
    assert await stored(client, "cols", keys) == await stored(client, "rows", keys)
    assert await stored(client, "cols", keys) == [packb(per_item(columns, i)) for i in range(3)]
    _, got = await post(client, "/v1/tables/cols/items:batchGet", {"keys": keys})
    assert [item["priority"] for item in got["items"]] == [1.0, 2.5, 0.0]
    value = got["items"][1]["value"]
    assert value["action"] == 200 and value["done"] is False and value["half"] == -0.0
    assert value["obs"].dtype.str == "<f4" and value["big"].dtype.str == ">f8"
    assert value["phase"].shape == () and value["phase"].dtype.str == "<c8"


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
async def test_columnar_answers_stack_each_field(client: httpx.AsyncClient, fmt: str) -> None:
    columns = columns_example()
    keys = ["a", "b", "c"]
    await make_table(client, "t")
    await post(client, "/v1/tables/t/items", {"keys": keys, "columns": columns, "wait": True})
    status, got = await post(
        client, "/v1/tables/t/items:batchGet", {"keys": ["c", "zz", "a"], "layout": "columns"}, fmt
    )
    assert status == 200, got
    assert got["keys"] == ["c", "a"] and got["missing"] == ["zz"]
    assert set(got) == {"keys", "priorities", "times_sampled", "columns", "missing"}
    picked = [2, 0]
    stacked = got["columns"]
    assert list(stacked) == list(columns)
    for name in ("obs", "big", "phase", "empty"):
        want = np.ascontiguousarray(columns[name][picked])
        assert stacked[name].dtype.str == want.dtype.str and stacked[name].shape == want.shape
        assert stacked[name].tobytes() == want.tobytes()
    assert stacked["logits"] == BFloat16Array(columns["logits"].bits[picked])
    # a 1-D column's elements are scalars per item: floats come back float64, ints int64
    assert stacked["reward"].dtype.str == "<f8"
    assert stacked["reward"].tolist() == columns["reward"][picked].astype(float).tolist()
    assert stacked["half"].dtype.str == "<f8" and stacked["half"].tolist() == [np.inf, 0.5]
    assert stacked["action"].dtype.str == "<i8" and stacked["action"].tolist() == [-70000, 3]
    assert stacked["done"].dtype.str == "|b1" and stacked["done"].tolist() == [True, True]
    assert got["priorities"].tolist() == [1.0, 1.0] and got["times_sampled"].tolist() == [0, 0]

    status, sample = await post(
        client, "/v1/tables/t/sample", {"batch_size": 2, "layout": "columns"}, fmt
    )
    assert status == 200, sample
    assert set(sample) == {
        "keys", "priorities", "probabilities", "weights", "times_sampled", "columns"
    }  # fmt: skip
    assert sample["keys"] == ["a", "a"]  # fifo: the oldest, twice
    want = np.ascontiguousarray(columns["obs"][[0, 0]])
    assert sample["columns"]["obs"].tobytes() == want.tobytes()
    assert sample["times_sampled"].tolist() == [2, 2]  # as the items layout counts them
    assert sample["weights"].tolist() == [1.0, 1.0]


async def test_json_columns_are_the_contracts_ndarray_form(client: httpx.AsyncClient) -> None:
    await make_table(client, "t")
    values = [{"x": np.arange(3, dtype="<i2") + i} for i in range(2)]
    items = [{"key": f"k{i}", "value": v} for i, v in enumerate(values)]
    await post(client, "/v1/tables/t/items", {"items": items, "wait": True})
    r = await client.post("/v1/tables/t/items:batchGet", json={"keys": ["k1"], "layout": "columns"})
    assert r.status_code == 200
    x = r.json()["columns"]["x"]
    data = base64.b64encode(np.array([[1, 2, 3]], dtype="<i2").tobytes()).decode()
    assert x == {"$ndarray": {"dtype": "<i2", "shape": [1, 3], "data": data}}
    assert r.json()["keys"] == ["k1"] and r.json()["missing"] == []


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
async def test_variable_length_fields_pack_end_to_end_with_cu_seqlens(
    client: httpx.AsyncClient, fmt: str
) -> None:
    await make_table(client, "t")
    lengths = [3, 0, 5, 1]
    tokens = [np.arange(n, dtype="<i4") + 10 * i for i, n in enumerate(lengths)]
    items = [
        {"key": f"k{i}", "value": {"tokens": t, "score": float(i)}} for i, t in enumerate(tokens)
    ]
    await post(client, "/v1/tables/t/items", {"items": items, "wait": True})
    keys = ["k2", "k0", "k1", "k3"]
    status, got = await post(
        client, "/v1/tables/t/items:batchGet", {"keys": keys, "layout": "columns"}, fmt
    )
    assert status == 200, got
    order = [2, 0, 1, 3]
    columns = got["columns"]
    assert list(columns) == ["tokens", "tokens.cu_seqlens", "score"]
    assert columns["tokens"].dtype.str == "<i4"
    assert columns["tokens"].tolist() == np.concatenate([tokens[i] for i in order]).tolist()
    offsets = columns["tokens.cu_seqlens"]
    assert offsets.dtype.str == "<i4" and offsets.tolist() == [0, 5, 8, 8, 9]
    assert columns["score"].tolist() == [2.0, 0.0, 1.0, 3.0]


UNSTACKABLE = [
    ("dtype", {"obs": np.zeros(2, "<f4")}, {"obs": np.zeros(2, "<f8")}, "obs"),
    ("shape", {"obs": np.zeros((2, 3))}, {"obs": np.zeros((3, 3))}, "obs"),
    ("fields", {"obs": np.zeros(2), "x": 1}, {"obs": np.zeros(2), "y": 1}, "'x'"),
    ("kinds", {"obs": np.zeros(2), "r": 1}, {"obs": np.zeros(2), "r": 1.5}, "'r'"),
    ("string", {"obs": np.zeros(2), "note": "a"}, {"obs": np.zeros(2), "note": "b"}, "'note'"),
    ("array_vs_scalar", {"v": np.zeros(1)}, {"v": 0.0}, "'v'"),
    ("past_int64", {"n": 2**63}, {"n": 2**63 + 1}, "'n'"),
    ("not_a_map", {"obs": np.zeros(2)}, [1, 2], "'k1'"),
    (
        "offsets_clash",
        {"t": np.zeros(2), "t.cu_seqlens": 0},
        {"t": np.zeros(3), "t.cu_seqlens": 0},
        "'t.cu_seqlens'",
    ),
]


@pytest.mark.parametrize(("case", "first", "second", "named"), UNSTACKABLE, ids=lambda x: x)
async def test_values_that_do_not_stack_are_refused_and_the_sample_consumes_nothing(
    client: httpx.AsyncClient, case: str, first: Any, second: Any, named: str
) -> None:
    await make_table(
        client,
        "q",
        max_times_sampled=1,
        rate_limiter={"type": "queue", "size": 10},
    )
    items = [
        {"key": "k0", "value": first},
        {"key": "k1", "value": second},
        {"key": "k2", "value": first},
    ]
    await post(client, "/v1/tables/q/items", {"items": items, "wait": True})
    for fmt in ("msgpack", "json"):
        status, answer = await post(
            client, "/v1/tables/q/sample", {"batch_size": 2, "layout": "columns"}, fmt
        )
        assert status == 422, answer
        assert answer["error"]["code"] == "validation_error"
        assert named in answer["error"]["message"]
        status, answer = await post(
            client, "/v1/tables/q/items:batchGet", {"keys": ["k0", "k1"], "layout": "columns"}
        )
        assert status == 422 and named in answer["error"]["message"]
    stats = (await client.get("/v1/tables/q")).json()["stats"]
    assert stats["size"] == 3 and stats["samples"] == 0
    # neither retired nor counted by the queue limiter, nor moved in FIFO order: each comes
    # out once, at once, in the order pushed
    status, answer = await post(client, "/v1/tables/q/sample", {"batch_size": 3, "timeout_ms": 0})
    assert status == 200, answer
    assert [item["key"] for item in answer["items"]] == ["k0", "k1", "k2"]
    assert [item["times_sampled"] for item in answer["items"]] == [1, 1, 1]


async def test_a_sample_without_values_has_no_columns(client: httpx.AsyncClient) -> None:
    await make_table(client, "t")
    items = [{"key": "k", "value": "not stackable"}]
    await post(client, "/v1/tables/t/items", {"items": items, "wait": True})
    body = {"batch_size": 1, "layout": "columns", "include_values": False}
    status, got = await post(client, "/v1/tables/t/sample", body)
    assert status == 200 and got["keys"] == ["k"] and got["columns"] == {}


def raw_map(*pairs: tuple[Any, bytes]) -> bytes:
    """A msgpack map written by hand: repeated names and any key kept as given."""
    out = bytes([0x80 | len(pairs)])
    for key, value in pairs:
        out += msgpack.packb(key) + value
    return out


COLUMN = packb(np.zeros(2, dtype="<f4"))
TWO = {"keys": ["a", "b"], "columns": {"o": np.zeros(2)}}
BAD_BODIES = [
    ("axis", {"keys": ["a", "b"], "columns": {"obs": np.zeros((3, 2))}}, 422, "obs"),
    ("zero_d", {"keys": ["a"], "columns": {"obs": np.array(1.0, dtype="<f4")}}, 422, "obs"),
    ("list", {"keys": ["a", "b"], "columns": {"obs": [1, 2]}}, 400, "obs"),
    ("no_columns", {"keys": ["a"], "columns": {}}, 422, "columns"),
    ("columns_type", {"keys": ["a"], "columns": 3}, 400, "columns"),
    ("key", {"keys": ["", "b"], "columns": {"obs": np.zeros(2)}}, 422, "keys[0]"),
    ("priority", {**TWO, "priorities": [1, -1]}, 422, "priorities[1]"),
    ("priorities", {**TWO, "priorities": [1]}, 422, "priorities"),
    ("unknown", {**TWO, "extra": 1}, 422, "extra"),
]


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
@pytest.mark.parametrize(("case", "body", "status", "named"), BAD_BODIES, ids=lambda x: x)
async def test_bad_columnar_pushes_are_refused_naming_the_field(
    client: httpx.AsyncClient, fmt: str, case: str, body: Any, status: int, named: str
) -> None:
    got_status, answer = await post(client, "/v1/tables/default/items", body, fmt)
    assert got_status == status, answer
    assert named in answer["error"]["message"]
    _, got = await post(client, "/v1/tables/default/items:batchGet", {"keys": ["a", "b"]})
    assert got["items"] == [None, None]


@pytest.mark.parametrize(
    ("columns", "named"),
    [
        (raw_map(("obs", COLUMN), ("obs", COLUMN)), "named twice"),
        (raw_map((7, COLUMN)), "7"),
        (raw_map(((1, 2), COLUMN)), "(1, 2)"),
    ],
    ids=["duplicate", "int_name", "array_name"],
)
async def test_field_names_must_be_distinct_strings(
    client: httpx.AsyncClient, columns: bytes, named: str
) -> None:
    body = raw_map(("keys", msgpack.packb(["a", "b"])), ("columns", columns))
    status, answer = await post(client, "/v1/tables/default/items", body)
    assert status == 422, answer
    assert answer["error"]["code"] == "validation_error"
    assert named in answer["error"]["message"]


async def test_a_body_of_neither_form_keeps_the_per_item_answer(
    client: httpx.AsyncClient,
) -> None:
    status, answer = await post(client, "/v1/tables/default/items", {"wait": True})
    assert status == 422
    assert answer["error"]["message"] == "Object missing required field `items`"


async def test_columnar_bodies_and_answers_match_the_documented_schemas(
    client: httpx.AsyncClient,
) -> None:
    import jsonschema

    document = (await client.get("/openapi.json")).json()

    def check(instance: Any, name: str) -> None:
        schema = {**document, "$ref": f"#/components/schemas/{name}"}
        jsonschema.Draft202012Validator(schema).validate(instance)

    body = to_jsonable({"keys": ["a", "b"], "columns": columns_example(2), "wait": True})
    check(body, "PushRequestOrColumnsPushRequest")
    check(body, "ColumnsPushRequest")
    r = await client.post("/v1/tables/default/items", json=body)
    assert r.status_code == 200
    r = await client.post("/v1/tables/default/sample", json={"batch_size": 3, "layout": "columns"})
    check(r.json(), "SampleResponseOrSampleColumnsOrWindowColumns")
    r = await client.post(
        "/v1/tables/default/items:batchGet", json={"keys": ["a", "x"], "layout": "columns"}
    )
    check(r.json(), "ItemListOrItemColumns")
    with pytest.raises(jsonschema.ValidationError):
        check({"keys": ["a"], "columns": {"obs": [1, 2]}}, "PushRequestOrColumnsPushRequest")


def _ext(dtype: str, shape: list[int], data: bytes) -> msgpack.ExtType:
    return msgpack.ExtType(1, msgpack.packb([dtype, shape, data]))


_GOOD = msgpack.packb({"keys": ["t"], "columns": {"x": _ext("<f8", [1], bytes(8))}})
_JSON_COLUMN = '{"$ndarray": {"dtype": "<f8", "shape": [1], "data": "AAAAAAAAAAA="}}'
RAW_BODIES = [
    ("truncated", MSGPACK, _GOOD[:-3], 400, "malformed"),
    ("trailing_byte", MSGPACK, _GOOD + b"\xc0", 400, "malformed"),
    ("json_truncated", "application/json", b'{"keys": ["t"], "columns": {}', 400, "malformed"),
    (
        "code_point_past_unicode",
        MSGPACK,
        msgpack.packb({"keys": ["t"], "columns": {"s": _ext("<U1", [1], b"\xff" * 4)}}),
        422,
        "'s'",
    ),
    (
        "empty_but_past_numpy",
        MSGPACK,
        msgpack.packb({"keys": ["t"], "columns": {"e": _ext("<f8", [1, 2**62, 0], b"")}}),
        400,
        "past what NumPy can hold",
    ),
    (
        "priority_past_a_float",
        "application/json",
        f'{{"keys": ["t"], "columns": {{"x": {_JSON_COLUMN}}}, "priorities": [1{"0" * 400}]}}',
        422,
        "priorities[0]",
    ),
]


@pytest.mark.parametrize(("case", "media", "body", "status", "named"), RAW_BODIES, ids=lambda x: x)
async def test_raw_columnar_bodies_get_the_contracts_refusal(
    client: httpx.AsyncClient, case: str, media: str, body: bytes | str, status: int, named: str
) -> None:
    await post(client, "/v1/tables/default/items", {"items": [{"key": "kept", "value": 1}]})
    r = await client.post("/v1/tables/default/items", content=body, headers={"content-type": media})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == ("bad_request" if status == 400 else "validation_error")
    assert named in error["message"]
    r = await client.get("/v1/tables/default/items/kept")
    assert r.status_code == 200 and r.json()["value"] == 1
    assert (await client.get("/v1/tables/default/items/t")).status_code == 404
