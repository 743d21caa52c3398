"""One export list: ``rlreplay.__all__`` is the public API, exactly, and written once.

Every name in it loads, from the module the type checkers' imports name; none is missing
(every error of the tree, every type a client's call answers); no subpackage's ``__init__``
repeats it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

import rlreplay
from rlreplay.wire import errors

ROOT = Path(rlreplay.__file__).resolve().parent
SUBPACKAGES = ["app", "clients", "gpu", "wire", "workers"]
#: Answer types that are not exported: the abstract base of Lease and ShardedLease.
NOT_EXPORTED = {"LeaseBase"}


def type_checking_imports() -> dict[str, str]:
    """Name -> module of the root's ``if TYPE_CHECKING:`` imports."""
    tree = ast.parse((ROOT / "__init__.py").read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imported in node.body:
                assert isinstance(imported, ast.ImportFrom) and imported.module
                for alias in imported.names:
                    found[alias.asname or alias.name] = imported.module
    return found


def test_all_has_no_duplicates() -> None:
    assert len(set(rlreplay.__all__)) == len(rlreplay.__all__)


def test_every_name_loads_from_where_the_type_checkers_are_told() -> None:
    imports = type_checking_imports()
    assert set(imports) == set(rlreplay.__all__) - {"__version__"}
    for name, module in imports.items():
        assert getattr(rlreplay, name) is getattr(importlib.import_module(module), name), name
    assert isinstance(rlreplay.__version__, str)


@pytest.mark.parametrize("name", ["Requester", "packb", "LeaseBase", "ClaimLoop"])
def test_an_internal_name_is_not_served_from_the_root(name: str) -> None:
    with pytest.raises(AttributeError, match=name):
        getattr(rlreplay, name)


def test_every_error_of_the_tree_is_exported() -> None:
    tree = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.ReplayError)
    }
    assert tree - set(rlreplay.__all__) == set()


def test_every_type_a_client_call_answers_is_exported() -> None:
    missing: set[str] = set()
    for client in (rlreplay.ReplayClient, rlreplay.ShardedReplayClient, rlreplay.Client):
        for name, call in inspect.getmembers(client, callable):
            if name.startswith("_"):
                continue
            module = vars(importlib.import_module(call.__module__))
            for word in re.findall(r"[A-Za-z_]\w*", str(inspect.signature(call).return_annotation)):
                value = module.get(word)
                if inspect.isclass(value) and value.__module__.startswith("rlreplay."):
                    missing |= {word} - set(rlreplay.__all__) - NOT_EXPORTED
    assert missing == set()


def test_no_subpackage_repeats_the_export_list() -> None:
    public = set(rlreplay.__all__) - {"__version__"}
    for package in SUBPACKAGES:
        tree = ast.parse((ROOT / package / "__init__.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                listed = set(ast.literal_eval(node.value))
                assert listed & public == set(), package
            if isinstance(node, ast.ImportFrom):
                named = {alias.asname or alias.name for alias in node.names}
                assert named & public == set(), (package, node.module)
