"""The push body parser against the contract's rules, for any bytes at all.

:func:`reference` walks a msgpack push body field by field and lists every rule it breaks.
The parser (msgspec and the wire schemas) must accept exactly the bodies that break none,
with the same items, and refuse every other body with the error of one rule it breaks: a
body that breaks several may be refused for any of them.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlreplay.app.api.bodies import (
    PushBody,
    parse_keys,
    parse_push,
    parse_sample,
    parse_table_config,
)
from rlreplay.app.api.encoding import BodyFormat
from rlreplay.app.tables.items import push_body_items
from rlreplay.wire.errors import BadRequest, ValidationFailed
from rlreplay.wire.schemas import MAX_KEY_BYTES

BAD, INVALID = "BadRequest", "ValidationFailed"

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
    """The common shape, with numbers of every kind as priorities and keys that may be too
    long or not ASCII."""
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


# --- the rules, walked ------------------------------------------------------------------------

_MALFORMED = (ValueError, TypeError, msgpack.UnpackException, RecursionError)


class Reference:
    """The contract's rules for a msgpack push body, checked field by field.

    ``problems`` holds the error class of every rule the body breaks, up to where it stops
    being readable msgpack; ``items`` and ``wait`` what a body that breaks none pushes.
    """

    def __init__(self, body: bytes) -> None:
        self.problems: set[str] = set()
        self.items: list[tuple[str, bytes, float]] = []
        self.wait = False
        self._body = body
        self._unpacker = msgpack.Unpacker(
            raw=False, strict_map_key=False, max_buffer_size=max(len(body), 1024)
        )
        self._unpacker.feed(body)
        try:
            self._walk()
        except _MALFORMED:
            self.problems.add(BAD)

    def _walk(self) -> None:
        if not self._body:
            raise ValueError("empty")
        fields = self._map()
        if fields is None:
            return
        seen: list[object] = []
        for _ in range(fields):
            name = self._unpacker.unpack()
            if name in seen:
                self.problems.add(INVALID)  # a repeated field
            seen.append(name)
            if name == "items":
                self._items()
            elif name == "wait":
                wait = self._unpacker.unpack()
                if type(wait) is bool:
                    self.wait = wait
                else:
                    self.problems.add(BAD)
            else:
                self._name(name)
                self._unpacker.skip()
        if "items" not in seen:
            self.problems.add(INVALID)
        if self._unpacker.tell() != len(self._body):
            self.problems.add(BAD)  # trailing bytes

    def _map(self) -> int | None:
        try:
            n: int = self._unpacker.read_map_header()
        except ValueError:  # not a map: read past it
            self.problems.add(BAD)
            self._unpacker.skip()
            return None
        return n

    def _name(self, name: object) -> None:
        """An unknown field; a name that is not even a string is of the wrong type."""
        self.problems.add(INVALID if isinstance(name, str) else BAD)

    def _items(self) -> None:
        try:
            count: int = self._unpacker.read_array_header()
        except ValueError:
            self.problems.add(BAD)
            self._unpacker.skip()
            return
        for _ in range(count):
            self._item()

    def _item(self) -> None:
        fields = self._map()
        if fields is None:
            return
        # a field given twice in an item: the decoder (msgspec) checks each one's type and
        # schema bounds (a key of 1 to 512 characters) as it reads, and keeps the last; the
        # key's 512 bytes of UTF-8 are checked on that last one
        key: str | None = None
        key_given = False
        value: bytes | None = None
        priority = 1.0
        for _ in range(fields):
            name = self._unpacker.unpack()
            if name == "key":
                raw = self._unpacker.unpack()
                key_given = True
                if type(raw) is str:
                    key = raw
                    if not 1 <= len(raw) <= MAX_KEY_BYTES:
                        self.problems.add(INVALID)
                else:
                    self.problems.add(BAD)
                    key = None
            elif name == "value":
                start = self._unpacker.tell()
                self._unpacker.skip()
                value = self._body[start : self._unpacker.tell()]
            elif name == "priority":
                priority = self._priority(self._unpacker.unpack())
            else:
                self._name(name)
                self._unpacker.skip()
        if key_given and key is not None:
            key = self._key(key)
        if key is None or value is None:
            self.problems.add(INVALID)  # a missing field (or a key refused above)
        else:
            self.items.append((key, value, priority))

    def _key(self, key: object) -> str | None:
        if type(key) is not str:
            self.problems.add(BAD)
            return None
        if not 1 <= len(key.encode()) <= 512:
            self.problems.add(INVALID)
        return key

    def _priority(self, priority: object) -> float:
        if type(priority) not in (int, float):
            self.problems.add(BAD)
            return 1.0
        if not (priority >= 0 and math.isfinite(priority)):  # type: ignore[operator]
            self.problems.add(INVALID)
        return float(priority)  # type: ignore[arg-type]


def _outcome(body: bytes, fmt: BodyFormat = BodyFormat.MSGPACK) -> tuple[str, Any]:
    try:
        return "ok", parse_push(body, fmt)
    except (BadRequest, ValidationFailed) as exc:
        return type(exc).__name__, str(exc)


def _items(push: PushBody) -> list[tuple[str, bytes, Any]]:
    return [
        (it.key, it.value, "nan" if math.isnan(it.priority) else it.priority) for it in push.items
    ]


def _check(body: bytes) -> None:
    reference = Reference(body)
    kind, got = _outcome(body)
    if reference.problems:
        assert kind in reference.problems, (body, reference.problems, got)
    else:
        assert kind == "ok", (body, got)
        assert _items(got) == [(k, v, p) for k, v, p in reference.items]
        assert got.wait == reference.wait
        assert got.raw == body  # the log keeps it as sent, and reads back the same items
        assert push_body_items(body) == got.items


@settings(max_examples=600, deadline=None)
@given(_BODIES)
def test_a_body_is_accepted_iff_it_breaks_no_rule(body: bytes) -> None:
    _check(body)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_bodies_are_refused_for_a_rule_they_break(data: st.DataObject) -> None:
    body = bytearray(data.draw(_BODIES))
    for _ in range(data.draw(st.integers(1, 3))):
        if not body:
            break
        at = data.draw(st.integers(0, len(body) - 1))
        if data.draw(st.booleans()):
            body[at] = data.draw(st.integers(0, 255))
        else:
            del body[at:]
    _check(bytes(body))


# --- JSON bodies ------------------------------------------------------------------------------

_JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**64 - 1),
        # NaN and infinities too: json.dumps writes them as literals. A NaN's payload bits
        # cannot travel as the literal NaN, so the msgpack side gets the one NaN JSON reads.
        st.floats().map(lambda x: math.nan if math.isnan(x) else x),
        st.text(),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
_JSON_KEYS = st.one_of(_GOOD_KEYS, _KEYS.filter(lambda k: not isinstance(k, bytes)))
_JSON_PRIORITIES = _PRIORITIES


@st.composite
def json_bodies(draw: st.DrawFn) -> dict[str, Any]:
    items: list[Any] = []
    for _ in range(draw(st.integers(0, 4))):
        item: dict[str, Any] = {}
        if draw(st.integers(0, 9)) > 0:
            item["key"] = draw(_JSON_KEYS)
        if draw(st.integers(0, 9)) > 0:
            value = draw(_JSON_VALUES)
            if isinstance(value, dict) and len(value) == 1 and next(iter(value)).startswith("$"):
                value = [value]  # not a tag of the JSON form, which msgpack would not have
            item["value"] = value
        if draw(st.booleans()):
            item["priority"] = draw(_JSON_PRIORITIES)
        if draw(st.integers(0, 9)) == 0:
            item["other"] = 1
        items.append(item if draw(st.integers(0, 19)) > 0 else [item])
    body: dict[str, Any] = {"items": items}
    if draw(st.booleans()):
        body["wait"] = draw(st.one_of(st.booleans(), st.integers(0, 1), st.none()))
    return body


@settings(max_examples=400, deadline=None)
@given(json_bodies())
def test_a_json_body_gets_the_answer_of_the_same_body_in_msgpack(body: dict[str, Any]) -> None:
    """JSON bodies, NaN and Infinity literals included (Python's json writes and reads them,
    msgspec's does not), get the same answer and items as msgpack ones."""
    kind, got = _outcome(json.dumps(body).encode(), BodyFormat.JSON)
    expected_kind, expected = _outcome(msgpack.packb(body, use_bin_type=True))
    assert kind == expected_kind, (body, got, expected)
    if kind == "ok":
        assert _items(got) == _items(expected) and got.wait == expected.wait
        assert got.raw is None


# --- the rules the Structs cannot state -------------------------------------------------------


def test_a_field_named_twice_is_refused() -> None:
    # msgspec would let the second win; the contract refuses it
    for body in (
        b"\x82\xa5items\x90\xa5items\x90",
        b"\x83\xa5items\x90\xa4wait\xc3\xa5items\x90",
        b"\xde\x00\x02\xa5items\x90\xa5items\x90",
    ):
        assert _outcome(body)[0] == INVALID
    assert _outcome(b"\x82\xa5items\x90\xa4wait\xc3")[1] == PushBody([], True)


@pytest.mark.parametrize("fmt", [BodyFormat.MSGPACK, BodyFormat.JSON])
def test_keys_are_bounded_in_bytes_of_utf8(fmt: BodyFormat) -> None:
    def body(key: str) -> bytes:
        data = {"items": [{"key": key, "value": 1}]}
        return msgpack.packb(data) if fmt is BodyFormat.MSGPACK else json.dumps(data).encode()

    assert _outcome(body("é" * 256), fmt)[0] == "ok"  # 512 bytes
    kind, message = _outcome(body("é" * 257), fmt)  # 257 characters, 514 bytes
    assert kind == INVALID and "items[0].key is 514 bytes" in message
    assert _outcome(body("k" * 513), fmt)[0] == INVALID


def test_unpaired_surrogates_in_json_keys_are_invalid() -> None:
    kind, message = _outcome(b'{"items": [{"key": "\\ud800", "value": 1}]}', BodyFormat.JSON)
    assert kind == INVALID and "not valid UTF-8" in message


def test_an_infinite_priority_is_invalid() -> None:
    kind, message = _outcome(
        msgpack.packb({"items": [{"key": "k", "value": 1, "priority": math.inf}]})
    )
    assert kind == INVALID and "items[0].priority" in message


def test_json_only_pythons_parser_reads_is_read_as_before() -> None:
    """NaN and Infinity literals and UTF-16 are not JSON for msgspec; the server reads them."""
    items = [
        {"key": "a", "value": {"x": [math.nan, 1]}},
        {"key": "b", "value": -math.inf, "priority": 2},
        {"key": "c", "value": "é"},
    ]
    text = json.dumps({"items": items, "wait": True})
    expected = [
        ("a", msgpack.packb({"x": [math.nan, 1]}), 1.0),
        ("b", msgpack.packb(-math.inf), 2.0),
        ("c", msgpack.packb("é"), 1.0),
    ]
    for body in (text.encode(), text.encode("utf-16")):
        kind, got = _outcome(body, BodyFormat.JSON)
        assert kind == "ok" and got.wait
        assert [(it.key, it.value, it.priority) for it in got.items] == expected
    kind, message = _outcome(text.replace("2}", "NaN}").encode(), BodyFormat.JSON)
    assert kind == INVALID and "items[1].priority" in message


@pytest.mark.parametrize("fmt", [BodyFormat.MSGPACK, BodyFormat.JSON])
@pytest.mark.parametrize("depth", [400, 960, 990, 1020, 2000, 100_000])
def test_deep_bodies_are_refused_never_failed(fmt: BodyFormat, depth: int) -> None:
    """Nesting past what the decoders take, behind a field decoded the slow way, is a 4xx."""
    if fmt is BodyFormat.MSGPACK:
        deep, nan, eight = b"\x91" * depth + b"\xc0", msgpack.packb(math.nan), msgpack.packb(8.0)

        def body(*fields: tuple[str, bytes]) -> bytes:
            return _pack_map([(name, _Raw(value)) for name, value in fields])

        def seq(*values: bytes) -> bytes:
            return bytes([0x90 | len(values)]) + b"".join(values)

    else:
        deep, nan, eight = b"[" * depth + b"null" + b"]" * depth, b"NaN", b"8.0"

        def body(*fields: tuple[str, bytes]) -> bytes:
            return b"{" + b",".join(json.dumps(n).encode() + b":" + v for n, v in fields) + b"}"

        def seq(*values: bytes) -> bytes:
            return b"[" + b",".join(values) + b"]"

    item = body(("key", b"\xa1k" if fmt is BodyFormat.MSGPACK else b'"k"'), ("value", deep))
    for parse, data in (
        (parse_sample, body(("batch_size", eight), ("extra", deep))),
        (parse_sample, body(("batch_size", eight), ("timeout_ms", nan), ("extra", deep))),
        (parse_keys, body(("keys", seq(deep)), ("x", nan))),
        (parse_push, body(("items", seq(item)), ("x", nan))),
    ):
        with pytest.raises((BadRequest, ValidationFailed)):
            parse(data, fmt)


@pytest.mark.parametrize("bad", [True, "5", b"5"])
@pytest.mark.parametrize("field", ["max_size", "max_times_sampled", "max_staleness"])
def test_a_table_config_count_given_as_text_or_a_boolean_is_refused(field: str, bad: Any) -> None:
    """The schema says integer: pydantic's lax reading of "5" and true must not stand."""
    body = msgpack.packb({field: bad}, use_bin_type=True)
    with pytest.raises(BadRequest, match=field):
        parse_table_config(body, BodyFormat.MSGPACK)


def test_a_table_config_count_may_be_spelled_as_an_integral_float() -> None:
    config = parse_table_config(b'{"max_size": 8.0}', BodyFormat.JSON)
    assert config.max_size == 8
