"""A headless Chromium driven over the Chrome DevTools protocol, for the documentation tests.

:class:`Browser` starts Debian's ``chromium`` with a throwaway profile and a DevTools port
it picks itself (read back from the ``DevToolsActivePort`` file), and opens pages;
:meth:`Page.wait_for` polls a JavaScript expression until it holds, so a test waits for a
condition of the rendered DOM rather than for a fixed delay.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
from websockets.sync.client import ClientConnection, connect

__all__ = ["CHROMIUM", "Browser", "Page"]

CHROMIUM = Path("/usr/bin/chromium")
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1800",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)


class Page:
    """One tab: DevTools calls, JavaScript evaluation, polling, screenshots."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """A DevTools command's result (events met meanwhile are dropped)."""
        call_id = next(self._ids)
        self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv(timeout=180))
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, *, timeout_s: float = 60.0) -> Any:
        """Poll ``expression`` until it is truthy; returns its value.

        Raises:
            TimeoutError: It never held within ``timeout_s``; the message has the page's
                text as it was then.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                text = self.evaluate("document.body ? document.body.innerText : ''")
                raise TimeoutError(f"{expression} never held; the page reads:\n{text[:3000]}")
            time.sleep(0.1)

    def goto(self, url: str) -> None:
        """Navigate, returning once the document has loaded (rendering goes on after)."""
        self.call("Page.enable")
        self.call("Page.navigate", url=url)
        self.wait_for(f"document.readyState === 'complete' && location.href === {json.dumps(url)}")

    def screenshot(self, path: Path, *, full_page: bool = False) -> None:
        """A PNG of the window (of the whole page with ``full_page``)."""
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=full_page)
        path.write_bytes(base64.b64decode(shot["data"]))


class Browser:
    """A headless Chromium for the block (``with Browser() as browser``)."""

    def __init__(self, chromium: Path = CHROMIUM) -> None:
        self._chromium = chromium
        self._profile = tempfile.TemporaryDirectory(prefix="rlreplay-chromium-")
        self._process: subprocess.Popen[bytes] | None = None
        self._port = 0

    def __enter__(self) -> Self:
        profile = Path(self._profile.name)
        log = (profile / "chromium.log").open("wb")
        self._process = subprocess.Popen(
            [str(self._chromium), *_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its helper processes in one group, stopped together
        )
        log.close()
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (active.exists() and active.read_text().count("\n") >= 1):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError(
                    f"chromium did not start:\n{(profile / 'chromium.log').read_text()[-3000:]}"
                )
            time.sleep(0.05)
        self._port = int(active.read_text().split("\n")[0])
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(15)
            # chromium's helpers (renderer, GPU, crashpad) may outlive it and go on writing
            # into the profile: stop the whole group before removing it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process = None
        for attempt in range(50):
            try:
                self._profile.cleanup()
                break
            except OSError:  # a helper's last write landed while the folder was removed
                if attempt == 49:
                    raise
                time.sleep(0.1)

    @contextlib.contextmanager
    def page(self) -> Iterator[Page]:
        """The browser's first tab, for the block."""
        targets = httpx.get(f"http://127.0.0.1:{self._port}/json/list", timeout=10).json()
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        with connect(url, max_size=2**27, open_timeout=30) as ws:
            yield Page(ws)
