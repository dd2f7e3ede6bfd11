"""A headless Chromium driven over the DevTools protocol on a pipe (no Node.js, no websocket).

    with Chromium() as browser:
        page = browser.open("/tmp/report.html")   # waits for window.gpucheckRendered
        page.errors        # uncaught exceptions, console.error/assert, log entries of level error
        page.requests      # every URL the page asked for that is not the file itself
        page.render_ms     # performance.now() when every plot had rendered
        page.text          # document.body.innerText
        png = browser.screenshot(full_page=False)

Debian's chromium (/usr/bin/chromium) as root: --headless --no-sandbox --disable-gpu
--disable-quic --no-first-run --disable-background-networking --disable-component-update
--disable-sync, a fresh --user-data-dir, --remote-debugging-pipe (commands on fd 3, answers on
fd 4, each message JSON ended by a NUL byte). The browser runs in a session of its own and is
stopped (SIGTERM, then SIGKILL to its process group) on close.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("GPUCHECK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe"]


def available() -> bool:
    return os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK)


@dataclass
class Page:
    url: str
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    render_ms: float | None = None
    load_s: float = 0.0
    text: str = ""
    html: str = ""


class Chromium:
    def __init__(self, width: int = 1280, height: int = 900, timeout_s: float = 60.0):
        self.width, self.height, self.timeout_s = width, height, timeout_s
        self.profile = tempfile.mkdtemp(prefix="gpucheck-chromium-")
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()

        def child_fds() -> None:  # commands on fd 3, answers on fd 4
            a = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 20)
            b = fcntl.fcntl(out_w, fcntl.F_DUPFD, 20)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}",
                                      f"--window-size={width},{height}", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     preexec_fn=child_fds, pass_fds=(3, 4), start_new_session=True)
        os.close(cmd_r)
        os.close(out_w)
        self._answers: dict[int, "queue.Queue[dict[str, Any]]"] = {}
        self._events: "queue.Queue[dict[str, Any]]" = queue.Queue()
        self._next = 0
        self._lock = threading.Lock()
        self._stderr: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.session = self._attach()

    # -- protocol -------------------------------------------------------------------------------
    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._out_r, 1 << 20)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    self._answers.setdefault(msg["id"], queue.Queue()).put(msg)
                else:
                    self._events.put(msg)

    def _drain_stderr(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            self._stderr.append(line)

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None,
             timeout_s: float | None = None) -> dict[str, Any]:
        with self._lock:
            self._next += 1
            mid = self._next
            self._answers.setdefault(mid, queue.Queue())
        msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        try:
            answer = self._answers[mid].get(timeout=timeout_s or self.timeout_s)
        except queue.Empty:
            raise TimeoutError(f"chromium did not answer {method} within {timeout_s or self.timeout_s} s; "
                               f"stderr: {b''.join(self._stderr[-20:]).decode(errors='replace')}") from None
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def page_cmd(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        return self.send(method, params, session=self.session, **kw)

    def _attach(self) -> str:
        targets = self.send("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        session = self.send("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                         "deviceScaleFactor": 1, "mobile": False}, session=session)
        return session

    # -- pages ----------------------------------------------------------------------------------
    def open(self, path: str | Path, wait_for: str = "window.gpucheckRendered") -> Page:
        url = Path(path).resolve().as_uri()
        while not self._events.empty():
            self._events.get_nowait()
        page = Page(url)
        t0 = time.monotonic()
        self.page_cmd("Page.navigate", {"url": url})
        deadline = t0 + self.timeout_s
        while time.monotonic() < deadline:
            got = self.page_cmd("Runtime.evaluate", {"expression": wait_for, "returnByValue": True})
            value = got.get("result", {}).get("value")
            if isinstance(value, (int, float)):
                page.render_ms = float(value)
                break
            time.sleep(0.05)
        page.load_s = time.monotonic() - t0
        self._collect(page, url)
        page.text = self._eval("document.body ? document.body.innerText : ''")
        page.html = self._eval("document.documentElement.outerHTML")
        return page

    def _eval(self, expression: str) -> Any:
        return self.page_cmd("Runtime.evaluate", {"expression": expression, "returnByValue": True})["result"].get("value")

    def _collect(self, page: Page, url: str) -> None:
        time.sleep(0.2)  # late console messages
        while not self._events.empty():
            ev = self._events.get_nowait()
            method, params = ev.get("method"), ev.get("params", {})
            if method == "Runtime.exceptionThrown":
                d = params.get("exceptionDetails", {})
                page.errors.append(f"Uncaught: {d.get('text')} {d.get('exception', {}).get('description', '')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                page.errors.append("console." + params["type"] + ": " + " ".join(
                    str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                page.errors.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
            elif method == "Network.requestWillBeSent":
                req = params.get("request", {}).get("url", "")
                if req != url and not req.startswith(("data:", "blob:", "about:")):
                    page.requests.append(req)

    def screenshot(self, *, full_page: bool = False, max_height: int = 6000) -> bytes:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.page_cmd("Page.getLayoutMetrics")["cssContentSize"]
            params.update(captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": self.width,
                                                            "height": min(max_height, int(size["height"])), "scale": 1})
        return base64.b64decode(self.page_cmd("Page.captureScreenshot", params)["data"])

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout_s=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=3)
                    break
                except subprocess.TimeoutExpired:
                    continue
        for fd in (self._cmd_w, self._out_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def distinct_colours(png: bytes, step: int = 4) -> int:
    """How many distinct colours a PNG has (sampling every `step`-th pixel of every row)."""
    import io

    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    w, hgt = img.size
    px = img.load()
    return len({px[x, y] for y in range(0, hgt, step) for x in range(0, w, step)})
