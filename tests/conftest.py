"""Suite-wide hooks: with pytest-xdist (``-n 2 --dist loadgroup``, as ``make test`` runs it),
each test module runs whole in one worker, so a module's server fixture starts once; a test
marked ``xdist_group(NAME)`` runs in the worker that runs NAME's other tests (those that must
not overlap, such as two Ray clusters)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist registers it too; here so that a run without xdist still knows the name
    config.addinivalue_line("markers", "xdist_group(name): run in one xdist worker with name's")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Before xdist reads the groups: an unmarked test joins its module's group."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
