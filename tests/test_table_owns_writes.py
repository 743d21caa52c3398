"""A table owns its writes: no module outside ``app/tables`` changes a ``Table``'s columns.

``Table`` keeps its columns in private attributes and lets other modules read them through
read-only properties (assigning a property raises, and mypy refuses it); so does the part
it holds for the ops not applied yet, ``PendingOps`` (``t.pending``). What neither
catches is a write *through* a property: ``t.priority[slot] = p``,
``t.pending.entries.update(...)``, ``np.add.at(t.times_sampled, ...)``, or a read of the
private attribute itself. This test walks the service's source (``app/``, ``workers/``)
and fails on any of those outside ``app/tables``; the columns it knows are read from
``Table`` and ``PendingOps`` themselves, so a new column is covered without editing the test.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Each class whose columns are the table's, and its file.
OWNERS = (
    (REPO / "app" / "tables" / "table.py", "Table"),
    (REPO / "app" / "tables" / "pending.py", "PendingOps"),
)
#: The folders holding the service's code; ``app/tables`` is the table's own.
CHECKED = ("app", "workers")
OWN = REPO / "app" / "tables"
#: Calls that change a list, dict or bytearray in place.
MUTATORS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "pop",
        "popitem",
        "clear",
        "update",
        "setdefault",
        "remove",
        "__setitem__",
        "__delitem__",
    }
)


def table_columns() -> tuple[frozenset[str], frozenset[str]]:
    """The private attributes (set in ``__init__``) and the read-only properties of
    ``Table`` and of the parts in :data:`OWNERS`."""
    private: set[str] = set()
    readable: set[str] = set()
    for path, name in OWNERS:
        tree = ast.parse(path.read_text())
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
        _collect(cls, private, readable)
    return frozenset(private), frozenset(readable)


def _collect(cls: ast.ClassDef, private: set[str], readable: set[str]) -> None:
    """Adds ``cls``'s private attributes and read-only properties to the two sets."""
    for node in cls.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        if node.name == "__init__":
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.ctx, ast.Store)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == "self"
                    and sub.attr.startswith("_")
                ):
                    private.add(sub.attr)
        elif any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list):
            readable.add(node.name)


def _column_of(node: ast.expr, names: frozenset[str]) -> ast.Attribute | None:
    """The ``<x>.<column>`` under subscripts of ``node`` (``x`` not ``self``), if any."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Call):  # np.frombuffer(t.dirty, ...)[slots] = 1
        for arg in node.args:
            found = _column_of(arg, names)
            if found is not None:
                return found
        return None
    if (
        isinstance(node, ast.Attribute)
        and node.attr in names
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    ):
        return node
    return None


def writes_in(source: str, private: frozenset[str], readable: frozenset[str]) -> list[str]:
    """Each line of ``source`` that writes a table's columns or reads its private ones."""
    found: list[str] = []
    columns = private | readable

    def report(node: ast.AST, what: str) -> None:
        found.append(f"{getattr(node, 'lineno', '?')}: {what}")

    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in private
            and not (isinstance(node.value, ast.Name) and node.value.id == "self")
        ):
            report(node, f"reads the private {ast.unparse(node)}")
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for one in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(one, ast.Subscript) and _column_of(one, columns) is not None:
                    report(node, f"writes {ast.unparse(one)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in MUTATORS and _column_of(node.func.value, columns) is not None:
                report(node, f"changes {ast.unparse(node.func.value)}")
            # np.add.at(t.times_sampled, ...), np.put(t.priority, ...)
            if node.func.attr in {"at", "put", "copyto"} and node.args:
                if _column_of(node.args[0], columns) is not None:
                    report(node, f"changes {ast.unparse(node.args[0])}")
    return found


def test_no_module_outside_app_tables_writes_a_tables_columns() -> None:
    private, readable = table_columns()
    assert {"_priority", "_keys", "_pending", "_dropped", "_entries", "_visible"} <= private
    assert {"priority", "keys", "pending", "dropped", "entries", "applied_seq"} <= readable
    broken: list[str] = []
    for folder in CHECKED:
        for path in sorted((REPO / folder).rglob("*.py")):
            if OWN in path.parents:
                continue
            for line in writes_in(path.read_text(), private, readable):
                broken.append(f"{path.relative_to(REPO)}:{line}")
    assert not broken, "change a table's columns through Table's methods:\n" + "\n".join(broken)


def test_the_check_finds_each_kind_of_write() -> None:
    private, readable = table_columns()
    planted = """
import numpy as np

def bad(t, slots):
    t.priority[slots] = 1.0
    t.meta_dirty[3] += 1
    np.frombuffer(t.dirty, np.uint8)[slots] = 1
    t.pending.update({})
    t.pending.entries.pop("k")
    del t.index["k"]
    np.add.at(t.times_sampled, slots, 1)
    t.pending._ops += 1
    return t._visible
"""
    found = writes_in(planted, private, readable)
    assert len(found) == 9, found
    fine = "def fine(t):\n    return t.priority[0] + len(t.keys)\n"
    assert writes_in(fine, private, readable) == []
