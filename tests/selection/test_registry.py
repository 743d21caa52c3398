"""Selectors are found by name, built-in or plugin, and reject bad parameters eagerly."""

from __future__ import annotations

from importlib.metadata import entry_points

import numpy as np
import pytest

from rlreplay.app.selection.base import Selector
from rlreplay.app.selection.registry import (
    BUILTIN,
    ENTRY_POINT_GROUP,
    make_selector,
    plugin_names,
    selector_class,
)


def test_contract_sampler_types_are_built_in() -> None:
    contract = {"uniform", "prioritized", "fifo", "lifo", "max_heap", "min_heap", "ptime"}
    assert set(BUILTIN) == contract
    for name, cls in BUILTIN.items():
        assert issubclass(cls, Selector) and cls.name == name
        assert len(make_selector(name, {})) == 0


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("prioritized", {"exponent": -1.0}, "exponent (-1.0) must be >= 0"),
        ("prioritized", {"is_exponent": -0.5}, "is_exponent (-0.5) must be >= 0"),
        ("prioritized", {"exponent": "high"}, "exponent ('high') must be a number"),
        ("prioritized", {"exponent": float("nan")}, "exponent (nan) must be finite"),
        ("prioritized", {"exponent": True}, "exponent (True) must be a number"),
        ("ptime", {"half_life_s": 0}, "half_life_s (0.0) must be > 0"),
        ("ptime", {"half_life_s": -3.5}, "half_life_s (-3.5) must be > 0"),
        ("prioritized", {"alpha": 0.5}, "alpha"),
        ("uniform", {"exponent": 0.5}, "exponent"),
        ("fifo", {"size": 3}, "size"),
    ],
)
def test_bad_params_raise_value_error_naming_them(
    name: str, params: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_selector(name, params)


def test_good_params_are_kept() -> None:
    sampler = make_selector("prioritized", {"exponent": 1, "is_exponent": 0.25})
    assert (sampler.exponent, sampler.is_exponent) == (1.0, 0.25)  # type: ignore[attr-defined]
    assert make_selector("ptime", {"half_life_s": 2}).half_life_s == 2.0  # type: ignore[attr-defined]


def test_unknown_type_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown sampler type 'nope'.*prioritized.*score"):
        selector_class("nope")


def test_plugin_is_found_through_its_entry_point() -> None:
    found = entry_points(group=ENTRY_POINT_GROUP, name="score")
    assert [ep.value for ep in found] == ["rlreplay_score_sampler:HighestScoreSampler"]
    assert "score" in plugin_names()
    cls = selector_class("score")
    assert cls.__module__ == "rlreplay_score_sampler"
    assert cls.index_fields == frozenset({"score"}) and cls.deterministic
    sampler = make_selector("score", {})
    sampler.insert(
        np.arange(3, dtype=np.int64), np.ones(3), np.zeros(3), [{"score": 1.0}, {"score": 9.0}, {}]
    )
    assert sampler.sample(2, np.random.default_rng(0))[0].tolist() == [1, 1]
