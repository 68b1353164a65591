#!/usr/bin/env python3
"""Browser check for the offline HTML run report (`ksearch report RUN -o FILE`).

Drives headless Chromium through chromedriver's W3C WebDriver HTTP API, using only
the Python standard library, and checks that the report:

* becomes ready (document.readyState == "complete" and window.ksearchReady === true),
  timed as open_seconds from the navigation's request to the first poll that sees it ready
  (after a first navigation to a tiny page has started the renderer, as in a running
  browser), with the browser's own load-event time as load_event_seconds;
* rendered the tree (`#tree .node`), the chart (`#curve path.best-so-far`) and the
  candidates table (`#candidates tr.cand`);
* fills `#source` after a click on the first candidate row (decoded asynchronously);
* logged no browser console entry of level SEVERE.

A PNG screenshot is saved after the click. A one-line JSON summary goes to stdout
(and to --json when given); progress and console entries go to stderr.

Run:
    python3 crates/cli/tests/browser_check.py --report /abs/report.html \
        --screenshot /abs/out.png [--json /abs/result.json] \
        [--chromium /usr/bin/chromium] [--chromedriver /usr/bin/chromedriver] [--timeout 30]

Exit status: 0 all checks passed, 1 a check failed, 2 chromium/chromedriver could not
be started.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

CHROME_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
]
POLL_S = 0.1


class StartupError(Exception):
    """Chromium or chromedriver could not be started (exit status 2)."""


class WebDriverError(Exception):
    """A WebDriver command returned an error."""


def log(msg: str) -> None:
    print(f"[browser_check] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def resolve_exe(path: str, what: str) -> str:
    found = shutil.which(path)
    if found is None:
        raise StartupError(f"{what} not found or not executable: {path}")
    return found


class WebDriver:
    """Minimal W3C WebDriver client over urllib."""

    def __init__(self, base: str, timeout: float) -> None:
        self.base = base
        self.timeout = timeout
        self.session: str | None = None

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base + path, data=data, method=method,
            headers={"Content-Type": "application/json; charset=utf-8"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout + 30) as resp:
                payload = json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                value = json.loads(e.read()).get("value", {})
                msg = f"{value.get('error')}: {value.get('message', '')}".splitlines()[0]
            except (ValueError, AttributeError):
                msg = str(e)
            raise WebDriverError(f"{method} {path}: {msg}") from None
        return payload.get("value")

    def s(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.call(method, f"/session/{self.session}{path}", body)

    def script(self, js: str) -> Any:
        return self.s("POST", "/execute/sync", {"script": js, "args": []})

    def find_all(self, css: str) -> list[str]:
        els = self.s("POST", "/elements", {"using": "css selector", "value": css})
        return [next(iter(e.values())) for e in els]


def poll(fn: Any, timeout: float) -> Any:
    """Call fn every POLL_S seconds until it returns a truthy value or timeout expires."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(POLL_S)


def start_chromedriver(exe: str, timeout: float) -> tuple[subprocess.Popen[bytes], WebDriver]:
    port = free_port()
    proc = subprocess.Popen(
        [exe, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wd = WebDriver(f"http://127.0.0.1:{port}", timeout)

    def ready() -> bool:
        if proc.poll() is not None:
            raise StartupError(f"chromedriver exited with status {proc.returncode}: {exe}")
        try:
            return bool(wd.call("GET", "/status").get("ready"))
        except (OSError, WebDriverError):
            return False

    try:
        if not poll(ready, timeout):
            raise StartupError(f"chromedriver did not become ready within {timeout}s: {exe}")
    except BaseException:
        stop(proc)
        raise
    return proc, wd


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_checks(wd: WebDriver, report: Path, screenshot: Path, timeout: float) -> dict[str, Any]:
    failures: list[str] = []
    result: dict[str, Any] = {"open_seconds": None, "load_event_seconds": None,
                              "tree_nodes": 0, "rows": 0,
                              "source_chars": 0, "console": [], "failures": failures,
                              "screenshot": None}

    # A first navigation starts the renderer process; opening the report is timed after it,
    # as in a browser that is already running.
    warm = Path(tempfile.mkdtemp(prefix="ksearch-browser-warm-")) / "warm.html"
    warm.write_text("<!doctype html><title>warm</title><p>warm</p>")
    wd.s("POST", "/url", {"url": warm.as_uri()})
    shutil.rmtree(warm.parent, ignore_errors=True)

    start = time.monotonic()
    wd.s("POST", "/url", {"url": report.as_uri()})
    ready_js = "return document.readyState === 'complete' && window.ksearchReady === true;"
    ready = poll(lambda: wd.script(ready_js), timeout)
    result["open_seconds"] = round(time.monotonic() - start, 3)
    load_ms = wd.script("var n = performance.getEntriesByType('navigation')[0];"
                        "return n ? n.loadEventEnd : null;")
    result["load_event_seconds"] = None if load_ms is None else round(load_ms / 1000, 3)
    if not ready:
        failures.append(f"report not ready within {timeout}s "
                        "(readyState complete and window.ksearchReady === true)")

    result["tree_nodes"] = len(wd.find_all("#tree .node"))
    if result["tree_nodes"] == 0:
        failures.append("tree not rendered: no element matches '#tree .node'")
    if not wd.find_all("#curve path.best-so-far"):
        failures.append("chart not rendered: no element matches '#curve path.best-so-far'")
    rows = wd.find_all("#candidates tr.cand")
    result["rows"] = len(rows)
    if not rows:
        failures.append("candidates table empty: no element matches '#candidates tr.cand'")
    else:
        try:
            wd.s("POST", f"/element/{rows[0]}/click", {})
            src_js = ("const e = document.querySelector('#source');"
                      "return e ? e.textContent.length : 0;")
            result["source_chars"] = int(poll(lambda: wd.script(src_js), timeout) or 0)
            if result["source_chars"] == 0:
                failures.append(f"#source still empty {timeout}s after clicking the "
                                "first '#candidates tr.cand'")
        except WebDriverError as e:
            failures.append(f"clicking the first candidate row failed: {e}")

    try:
        png = base64.b64decode(wd.s("GET", "/screenshot"))
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        screenshot.write_bytes(png)
        result["screenshot"] = str(screenshot)
    except (WebDriverError, OSError) as e:
        failures.append(f"screenshot failed: {e}")

    try:
        entries = wd.s("POST", "/se/log", {"type": "browser"}) or []
    except WebDriverError as e:
        entries = []
        failures.append(f"console log unavailable: {e}")
    for entry in entries:
        item = {"level": entry.get("level"), "message": entry.get("message")}
        result["console"].append(item)
        log(f"console {item['level']}: {item['message']}")
        if item["level"] == "SEVERE":
            failures.append(f"console SEVERE: {item['message']}")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", required=True, type=Path)
    ap.add_argument("--screenshot", required=True, type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args()

    report = args.report.resolve()
    summary: dict[str, Any] = {"ok": False, "open_seconds": None, "tree_nodes": 0,
                               "rows": 0, "source_chars": 0, "console": [],
                               "failures": [], "screenshot": None}
    code = 1
    profile = tempfile.mkdtemp(prefix="ksearch-browser-check-")
    proc: subprocess.Popen[bytes] | None = None
    wd: WebDriver | None = None
    try:
        if not report.is_file():
            summary["failures"].append(f"report not found: {report}")
        else:
            chromium = resolve_exe(args.chromium, "chromium")
            driver = resolve_exe(args.chromedriver, "chromedriver")
            proc, wd = start_chromedriver(driver, args.timeout)
            caps = {"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {"binary": chromium,
                                       "args": CHROME_ARGS + [f"--user-data-dir={profile}"]},
                "goog:loggingPrefs": {"browser": "ALL"},
            }}}
            try:
                wd.session = wd.call("POST", "/session", caps)["sessionId"]
            except (WebDriverError, OSError) as e:
                raise StartupError(f"chromium could not be started ({chromium}): {e}") from None
            summary.update(run_checks(wd, report, args.screenshot.resolve(), args.timeout))
            summary["ok"] = not summary["failures"]
            code = 0 if summary["ok"] else 1
    except StartupError as e:
        summary["failures"].append(str(e))
        code = 2
    except (WebDriverError, OSError) as e:
        summary["failures"].append(f"webdriver error: {e}")
        code = 1
    finally:
        if wd is not None and wd.session is not None:
            try:
                wd.s("DELETE", "")
            except (WebDriverError, OSError):
                pass
        if proc is not None:
            stop(proc)
        shutil.rmtree(profile, ignore_errors=True)

    for failure in summary["failures"]:
        log(f"FAIL: {failure}")
    line = json.dumps(summary)
    print(line, flush=True)
    if args.json:
        args.json.write_text(line + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
