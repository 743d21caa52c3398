"""The README's Python examples in a Jupyter kernel (run with nbclient), whose main thread
already runs an event loop: the synchronous one as written, the async one with ``await
main()`` as the README says for notebooks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.clients.test_sync_client_live import (
    ASYNC_EXAMPLE,
    README_URL,
    SYNC_EXAMPLE,
    readme_python,
)
from tests.live import running_server

pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("notebook")) as server:
        yield server.url


def test_the_readme_examples_run_in_a_jupyter_kernel(
    server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    sync_code = readme_python(SYNC_EXAMPLE).replace(README_URL, server_url)
    async_code = readme_python(ASYNC_EXAMPLE).replace(README_URL, server_url)
    assert "asyncio.run(main())" in async_code
    cells = [
        "import asyncio\nassert asyncio.get_running_loop().is_running()  # the kernel's loop",
        sync_code,
        async_code.replace("asyncio.run(main())", "await main()"),
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    outputs = [output for cell in notebook.cells for output in cell.outputs]
    assert [o for o in outputs if o.output_type == "error"] == []
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert printed.count("items") == 2, printed
