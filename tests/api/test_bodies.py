"""The msgpack push parser: the msgspec fast path answers exactly as the field-by-field walk.

The fast path may only take bodies the walk accepts, and must then return the same items;
every other body goes to the walk, so ``parse_push`` must give the walk's result or raise
the walk's error, for any bytes at all.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from rlreplay.app.api import bodies
from rlreplay.app.api.bodies import PushBody, parse_push
from rlreplay.app.api.encoding import BodyFormat
from rlreplay.wire.errors import BadRequest, ValidationFailed

_KEYS = st.one_of(
    st.text(alphabet=st.characters(max_codepoint=127), min_size=0, max_size=8),
    st.text(min_size=1, max_size=4),  # non-ASCII
    st.sampled_from(["k" * 512, "k" * 513, "é" * 200, "é" * 300]),
    st.binary(max_size=4),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.none(),
)
_PRIORITIES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, 1.7976931348623157e308, -0.5, math.inf, -math.inf, math.nan]),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.booleans(),
    st.none(),
    st.text(max_size=2),
)
_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**64 - 1),
        st.floats(),
        st.text(),
        st.binary(),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
_FIELD_NAMES = st.sampled_from(["key", "value", "priority", "other", "wait"])


def _pack_map(fields: list[tuple[Any, Any]]) -> bytes:
    """A msgpack map with ``fields`` in order, duplicates included."""
    packer = msgpack.Packer(use_bin_type=True)
    return packer.pack_map_header(len(fields)) + b"".join(
        packer.pack(k) + packer.pack(v) if not isinstance(v, _Raw) else packer.pack(k) + v.data
        for k, v in fields
    )


class _Raw:
    def __init__(self, data: bytes) -> None:
        self.data = data


_GOOD_KEYS = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1)


@st.composite
def _item(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 3)) > 0:  # mostly the common shape, where only a priority may be off
        fields = [("key", draw(_GOOD_KEYS)), ("value", draw(_VALUES))]
        if draw(st.booleans()):
            fields.append(("priority", draw(_PRIORITIES)))
        return _pack_map(draw(st.permutations(fields)))
    if draw(st.integers(0, 9)) == 0:
        return msgpack.packb(draw(_VALUES), use_bin_type=True)  # not a map, sometimes
    fields: list[tuple[Any, Any]] = []
    if draw(st.integers(0, 19)) > 0:
        fields.append(("key", draw(_KEYS)))
    if draw(st.integers(0, 19)) > 0:
        fields.append(("value", draw(_VALUES)))
    if draw(st.booleans()):
        fields.append(("priority", draw(_PRIORITIES)))
    for _ in range(draw(st.integers(0, 1)) * draw(st.integers(0, 2))):
        name = draw(_FIELD_NAMES)
        value = draw(_KEYS) if name == "key" else draw(_PRIORITIES)
        fields.append((name, value))
    return _pack_map(draw(st.permutations(fields)))


@st.composite
def push_bodies(draw: st.DrawFn) -> bytes:
    items = draw(st.lists(_item(), max_size=6))
    packer = msgpack.Packer(use_bin_type=True)
    items_bytes = packer.pack_array_header(len(items)) + b"".join(items)
    fields: list[tuple[Any, Any]] = [("items", _Raw(items_bytes))]
    if draw(st.booleans()):
        fields.append(("wait", draw(st.one_of(st.booleans(), st.integers(0, 1), st.none()))))
    if draw(st.integers(0, 9)) == 0:
        fields.append((draw(st.sampled_from(["items", "wait", "extra"])), _Raw(items_bytes)))
    body = _pack_map(draw(st.permutations(fields)))
    if draw(st.integers(0, 9)) == 0:
        body += b"\x01"  # trailing bytes
    return body


_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e308, -0.5, math.inf, -math.inf, math.nan]),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
)


@st.composite
def common_bodies(draw: st.DrawFn) -> bytes:
    """The shape the fast path takes, with numbers of every kind as priorities and keys
    that may be too long or not ASCII."""
    items = []
    for _ in range(draw(st.integers(1, 5))):
        item: dict[str, Any] = {
            "key": draw(st.one_of(_GOOD_KEYS, _KEYS.filter(lambda k: isinstance(k, str)))),
            "value": draw(_VALUES),
        }
        if draw(st.booleans()):
            item["priority"] = draw(_NUMBERS)
        items.append(item)
    body: dict[str, Any] = {"items": items}
    if draw(st.booleans()):
        body["wait"] = draw(st.booleans())
    return msgpack.packb(body, use_bin_type=True)


_BODIES = st.one_of(common_bodies(), push_bodies())


def _outcome(parse: Any, body: bytes) -> tuple[str, Any]:
    try:
        return "ok", parse(body)
    except (BadRequest, ValidationFailed) as exc:
        return type(exc).__name__, str(exc)


def _same(a: PushBody, b: PushBody) -> bool:
    return a.wait == b.wait and [
        (it.key, it.value, it.priority if not math.isnan(it.priority) else "nan") for it in a.items
    ] == [(it.key, it.value, it.priority) for it in b.items]


@settings(max_examples=600, deadline=None)
@given(_BODIES)
def test_the_fast_path_takes_only_what_the_walk_accepts_with_the_same_items(body: bytes) -> None:
    walked = _outcome(bodies._walk_push, body)
    fast = bodies._parse_push_fast(body)
    if fast is not None:
        assert walked[0] == "ok", (body, walked)
        assert _same(fast, walked[1])
    assert _outcome(lambda b: parse_push(b, BodyFormat.MSGPACK), body) == walked or (
        walked[0] == "ok" and _same(parse_push(body, BodyFormat.MSGPACK), walked[1])
    )


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_bodies_get_the_walks_answer(data: st.DataObject) -> None:
    body = bytearray(data.draw(_BODIES))
    for _ in range(data.draw(st.integers(1, 3))):
        if not body:
            break
        at = data.draw(st.integers(0, len(body) - 1))
        if data.draw(st.booleans()):
            body[at] = data.draw(st.integers(0, 255))
        else:
            del body[at:]
    walked = _outcome(bodies._walk_push, bytes(body))
    got = _outcome(lambda b: parse_push(b, BodyFormat.MSGPACK), bytes(body))
    assert got[0] == walked[0]
    if got[0] == "ok":
        assert _same(got[1], walked[1])
    else:
        assert got == walked


def test_the_common_body_takes_the_fast_path() -> None:
    value = msgpack.packb({"obs": b"x" * 100})
    body = msgpack.packb(
        {"items": [{"key": f"k{i}", "value": value, "priority": 0.5} for i in range(3)]}
    )
    fast = bodies._parse_push_fast(body)
    assert fast is not None and not fast.wait
    assert [(it.key, it.value, it.priority) for it in fast.items] == [
        (f"k{i}", msgpack.packb(value, use_bin_type=True), 0.5) for i in range(3)
    ]
    with_wait = msgpack.packb({"wait": True, "items": [{"value": 1, "key": "a"}]})
    assert bodies._parse_push_fast(with_wait) == PushBody(bodies._walk_push(with_wait).items, True)
    # a repeated field: msgspec would let the second win, the contract refuses it
    repeated = b"\x82\xa5items\x90\xa5items\x90"
    assert bodies._parse_push_fast(repeated) is None
    assert _outcome(lambda b: parse_push(b, BodyFormat.MSGPACK), repeated)[0] == "ValidationFailed"
