"""The engine is composed, not stacked: no class of ``app/engine`` inherits from a class of
the project (each part takes its collaborators in its constructor), and the façade holds
one part per concern, which the routes call."""

from __future__ import annotations

import ast
from pathlib import Path

from rlreplay.app.engine.admission import Admission
from rlreplay.app.engine.claims import Claims
from rlreplay.app.engine.core import EngineCore
from rlreplay.app.engine.engine import Engine
from rlreplay.app.engine.reads import Reads
from rlreplay.app.settings import Settings

ENGINE = Path(__file__).resolve().parents[2] / "app" / "engine"


def test_no_engine_class_inherits_from_a_project_class() -> None:
    stacked = []
    for path in sorted(ENGINE.glob("*.py")):
        tree = ast.parse(path.read_text())
        project = {
            alias.asname or alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlreplay")
            for alias in node.names
        }
        local = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    if isinstance(base, ast.Name) and base.id in project | local:
                        stacked.append(f"{path.name}:{node.lineno} {node.name}({base.id})")
    assert stacked == []


def test_the_engine_holds_one_part_per_concern(tmp_path: Path) -> None:
    engine = Engine(Settings(data_dir=tmp_path, storage_mode="memory"))
    assert isinstance(engine.core, EngineCore)
    assert isinstance(engine.admission, Admission)
    assert isinstance(engine.reads, Reads)
    assert isinstance(engine.claims, Claims)
    assert Engine.__mro__ == (Engine, object)


def test_the_data_routes_call_the_parts() -> None:
    api = ENGINE.parent / "api"
    calls = {
        "items.py": ["engine.admission.push_answer(", "engine.admission.delete_answer("],
        "sampling.py": ["engine.reads.sample_batch("],
        "rollouts.py": ["engine.claims.claim(", "engine.claims.patch("],
    }
    for name, wanted in calls.items():
        source = (api / name).read_text()
        for call in wanted:
            assert call in source, (name, call)
