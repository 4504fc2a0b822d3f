"""Shared Selenium helper for the browser tests: Debian Chromium (headless) via /usr/bin/chromedriver, a real
TensorBoard serving a logdir, downloads into a temporary folder, screenshots under test-artifacts/.

    with TensorBoard(logdir) as tb, Browser() as b:
        b.open_dlprof(tb.url)          # TensorBoard's #dlprof tab, switched into the plugin iframe
        b.wait_css("[data-metric=wall_time]")
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROME_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--disable-default-apps",
    "--disable-extensions",
    "--lang=en-US",
    "--force-device-scale-factor=1",
]


def browser_missing_reason() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    if not Path(CHROMIUM).exists():
        return f"Debian chromium not found at {CHROMIUM} (apt-get install chromium chromium-driver)"
    if not Path(CHROMEDRIVER).exists():
        return f"chromedriver not found at {CHROMEDRIVER} (apt-get install chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium)"
    return None


requires_browser = pytest.mark.skipif(
    browser_missing_reason() is not None, reason=browser_missing_reason() or "browser available"
)


# ---------------------------------------------------------------------------- formatting, as format.js does
# Intl.NumberFormat("en-US") rounds the exact value of the double half away from zero; Decimal(float) is that
# exact value, so ROUND_HALF_UP on it gives the same digits.


def _round_text(value: float, digits: int, keep_zeros: bool = False) -> str:
    d = Decimal(float(value)).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    text = f"{d:,f}"
    if "." in text and not keep_zeros:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def fmt_ns(ns) -> str:
    """format.js fmtNs: 950 -> '950 ns', 30000 -> '30 µs', 1290000 -> '1.29 ms'."""
    if ns is None:
        return "—"
    v = float(ns)
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if abs(v) >= scale:
            return f"{_round_text(v / scale, 2)} {unit}"
    return f"{_round_text(v, 2)} ns"


def fmt_offset_ns(ns) -> str:
    """format.js fmtOffsetNs: every nanosecond, '+950 ns', '+12.345 µs', '+1.234567 ms', '+2.000000001 s'."""
    if ns is None:
        return "—"
    n = int(round(ns))
    sign, a = ("−" if n < 0 else "+"), abs(n)
    for scale, unit, digits in ((10**9, "s", 9), (10**6, "ms", 6), (10**3, "µs", 3)):
        if a >= scale:
            return f"{sign}{a // scale:,}.{a % scale:0{digits}d} {unit}"
    return f"{sign}{a} ns"


def fmt_pct(v) -> str:
    """format.js fmtPct: one decimal, '8.6 %'."""
    return "—" if v is None else f"{_round_text(v, 1, keep_zeros=True)} %"


def fmt_int(v) -> str:
    """format.js fmtInt: thousands separators, '1,234,567'."""
    return "—" if v is None else _round_text(v, 0)


# ---------------------------------------------------------------------------- TensorBoard


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, timeout: float = 10.0):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read().decode("utf-8"))


class TensorBoard:
    """`tensorboard --logdir <logdir> --port <free> --host 127.0.0.1` in a subprocess, ready when the DLPROF
    plugin reports itself active (loaded, for an `empty` logdir that runs are published into later)."""

    def __init__(self, logdir: Path, timeout: float = 90.0, path_prefix: str = "", extra_args=(), empty=False):
        self.logdir = Path(logdir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{path_prefix}"  # TensorBoard's root, with --path_prefix
        self.path_prefix = path_prefix
        self.extra_args = list(extra_args) + ([f"--path_prefix={path_prefix}"] if path_prefix else [])
        self.timeout = timeout
        self.empty = empty  # no runs yet: ready when the plugin is loaded (it is active once a run is there)
        self.proc = None
        self.log = None

    def __enter__(self) -> "TensorBoard":
        ARTIFACTS.mkdir(exist_ok=True)
        self.log = open(ARTIFACTS / f"tensorboard_{self.port}.log", "w")
        exe = Path(sys.executable).with_name("tensorboard")
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "tensorboard.main"]
        self.proc = subprocess.Popen(
            cmd
            + [
                "--logdir",
                str(self.logdir),
                "--port",
                str(self.port),
                "--host",
                "127.0.0.1",
                "--reload_interval",
                "5",
                *self.extra_args,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=str(ROOT),
        )
        state = {"last": None}

        def active():
            try:
                state["last"] = http_json(f"{self.url}/data/plugins_listing", timeout=5).get("dlprof")
            except OSError as exc:
                state["last"] = exc
                return False
            return bool(state["last"] and (self.empty or state["last"].get("enabled")))

        try:
            wait_until(active, self.timeout, "TensorBoard's DLPROF plugin to become active", self.proc)
        except AssertionError as exc:
            self.__exit__(None, None, None)
            raise RuntimeError(f"{exc} (last answer: {state['last']}; see {self.log.name})") from None
        return self

    def api(self, route: str):
        return http_json(f"{self.url}/data/plugin/dlprof/{route}")

    def publish(self, name: str, logdir: Path, timeout: float = 60.0) -> Path:
        """Move a logdir's runs under <this logdir>/<name>/ (its run `x/dlprof` is then `<name>/x/dlprof`) and
        return that folder once the plugin lists every one of them: how test modules share one TensorBoard."""
        target = self.logdir / name
        shutil.move(str(logdir), str(target))
        runs = {f"{name}/{p.parent.relative_to(target).as_posix()}" for p in target.rglob("events.out.tfevents.*")}

        def listed():
            return runs <= {r["run"] for r in self.api("runs")["runs"]}

        wait_until(listed, timeout, f"TensorBoard to list the runs {sorted(runs)}", self.proc)
        return target

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.log:
            self.log.close()


# ---------------------------------------------------------------------------- the browser


class Browser:
    """Headless Debian Chromium driven by Selenium, with a fresh profile and a download folder."""

    def __init__(self, width: int = 1440, height: int = 1000, extra_flags=()):
        self.width, self.height = width, height
        self.extra_flags = list(extra_flags)
        self.driver = None
        self.profile_dir = None
        self.download_dir = None

    def __enter__(self) -> "Browser":
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.profile_dir = Path(tempfile.mkdtemp(prefix="dlprof-chrome-profile-"))
        self.download_dir = Path(tempfile.mkdtemp(prefix="dlprof-downloads-"))
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        for flag in CHROME_FLAGS + self.extra_flags:
            opts.add_argument(flag)
        opts.add_argument(f"--user-data-dir={self.profile_dir}")
        opts.add_argument(f"--window-size={self.width},{self.height}")
        opts.add_experimental_option(
            "prefs",
            {
                "download.default_directory": str(self.download_dir),
                "download.prompt_for_download": False,
                "download.directory_upgrade": True,
                "safebrowsing.enabled": False,
                "profile.default_content_setting_values.automatic_downloads": 1,
            },
        )
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        # one log per pytest-xdist worker (each has its own browser)
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        log_name = f"chromedriver_{worker}.log" if worker else "chromedriver.log"
        service = Service(executable_path=CHROMEDRIVER, log_output=str(self._artifact(log_name)))
        self.driver = webdriver.Chrome(service=service, options=opts)
        self.driver.set_script_timeout(30)
        self.driver.execute_cdp_cmd(
            "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(self.download_dir)}
        )
        return self

    def __exit__(self, *exc):
        if self.driver is not None:
            with contextlib.suppress(Exception):
                self.driver.quit()
        for d in (self.profile_dir, self.download_dir):
            if d:
                shutil.rmtree(d, ignore_errors=True)

    @staticmethod
    def _artifact(name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        return ARTIFACTS / name

    def fresh(self, width: int = 1440, height: int = 1000) -> "Browser":
        """The shared browser as a new one for the next test module: this window size, no page, no downloads,
        and no state left in the TensorBoard origin's storage (theme, URL state) by the module before."""
        d = self.driver
        d.switch_to.default_content()
        if d.current_url.startswith("http"):
            self.js("window.localStorage.clear(); window.sessionStorage.clear();")
        d.delete_all_cookies()
        d.get("about:blank")
        for path in self.download_dir.iterdir():  # downloads start from an empty folder, as in a new browser
            path.unlink()
        self.width, self.height = width, height
        d.set_window_size(width, height)
        return self

    # -- navigation
    def open_dlprof(self, tb_url: str, timeout: float = 30.0, run: str | None = None):
        """TensorBoard's DLPROF tab (showing `run`, else the first run); switches into the plugin's iframe and
        waits for the UI."""
        from selenium.webdriver.common.by import By

        d = self.driver
        d.switch_to.default_content()
        d.get(f"{tb_url}/#dlprof" + (f"&p.dlprof.run={urllib.parse.quote(run, safe='')}" if run else ""))
        frame = self.wait(
            lambda drv: drv.find_element(By.CSS_SELECTOR, "iframe[src*='plugin_entry.html?name=dlprof']"),
            timeout,
            "the DLPROF plugin iframe",
        )
        d.switch_to.frame(frame)
        self.wait_css("#dlprof-app", timeout)
        return self

    # -- waiting and finding
    def wait(self, predicate, timeout: float = 15.0, what: str = "condition"):
        from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, TimeoutException
        from selenium.webdriver.support.ui import WebDriverWait

        try:
            return WebDriverWait(
                self.driver,
                timeout,
                poll_frequency=0.05,
                ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
            ).until(predicate)
        except TimeoutException as exc:
            name = "timeout_" + "".join(ch if ch.isalnum() else "_" for ch in what)[:60] + ".png"
            with contextlib.suppress(Exception):
                self.driver.save_screenshot(str(self._artifact(name)))
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what}; console: {self.console()[-5:]}"
            ) from exc

    def choose(self, css: str, value: str, timeout: float = 15.0):
        """Choose an option of a <select> by value; a list re-rendered meanwhile (stale element) is tried again
        (wait ignores stale elements)."""
        from selenium.webdriver.support.ui import Select

        def chosen(d) -> bool:
            Select(self.css(css)).select_by_value(value)
            return True

        return self.wait(chosen, timeout, f"choosing {value!r} in {css}")

    def wait_css(self, css: str, timeout: float = 15.0, visible: bool = False):
        from selenium.webdriver.common.by import By

        def find(d):
            el = d.find_element(By.CSS_SELECTOR, css)
            return el if (not visible or el.is_displayed()) else False

        return self.wait(find, timeout, css)

    def wait_text(self, css: str, text: str, timeout: float = 15.0):
        """Wait until the element matching css contains text; returns the element."""
        from selenium.webdriver.common.by import By

        def find(d):
            el = d.find_element(By.CSS_SELECTOR, css)
            return el if text in el.text else False

        return self.wait(find, timeout, f"{text!r} in {css}")

    def css(self, css: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def js(self, script: str, *args):
        return self.driver.execute_script(script, *args)

    def click(self, css: str):
        el = self.wait_css(css, visible=True)
        self.js("arguments[0].scrollIntoView({block: 'center'});", el)
        el.click()
        return el

    def console(self) -> list[str]:
        with contextlib.suppress(Exception):
            return [f"{e['level']}: {e['message']}" for e in self.driver.get_log("browser")]
        return []

    # -- downloads and screenshots
    def wait_download(self, suffix: str, timeout: float = 20.0, before: set | None = None) -> Path:
        """The newest completed download ending with suffix (not in `before`)."""
        before = before or set()

        def done():
            ready = [
                p
                for p in self.download_dir.iterdir()
                if p.name.endswith(suffix) and p.name not in before and not p.name.endswith(".crdownload")
            ]
            path = max(ready, key=lambda p: p.stat().st_mtime) if ready else None
            return path if path is not None and path.stat().st_size > 0 else None

        try:
            return wait_until(done, timeout, f"a {suffix} download")
        except AssertionError:
            raise AssertionError(f"no {suffix} download in {timeout}s: {os.listdir(self.download_dir)}") from None

    def screenshot(self, name: str, full_page: bool = True, scale: float = 1.0) -> Path:
        """PNG of the top-level page under test-artifacts/ (the whole scroll height of the plugin iframe when
        full_page)."""
        path = self._artifact(name)
        d = self.driver
        if not full_page:
            d.save_screenshot(str(path))
            return path
        self.js("window.scrollTo(0, 0);")
        height = int(self.js("return Math.max(document.documentElement.scrollHeight, document.body.scrollHeight);"))
        d.switch_to.default_content()
        try:
            top = int(d.execute_script("return Math.max(document.documentElement.clientHeight, 600);"))
            frame_top = int(
                d.execute_script(
                    "const f = document.querySelector(\"iframe[src*='plugin_entry.html?name=dlprof']\");"
                    "return f ? Math.round(f.getBoundingClientRect().top) : 0;"
                )
            )
            total = max(top, frame_top + height + 8)
            d.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride",
                {"width": self.width, "height": total, "deviceScaleFactor": 1, "mobile": False},
            )
            # TensorBoard lays the iframe out again at the new size: wait for it to reach the page's bottom
            frame_bottom = (
                "const f = document.querySelector(\"iframe[src*='plugin_entry.html?name=dlprof']\");"
                "return f ? f.getBoundingClientRect().bottom : 0;"
            )
            with contextlib.suppress(AssertionError):  # (a page shorter than the window never grows the frame)
                wait_until(lambda: d.execute_script(frame_bottom) >= total - 16, 5, "the iframe's new size")
            shot = d.execute_cdp_cmd(
                "Page.captureScreenshot",
                {
                    "format": "png",
                    "captureBeyondViewport": False,
                    "clip": {"x": 0, "y": 0, "width": self.width, "height": total, "scale": scale},
                },
            )
            path.write_bytes(base64.b64decode(shot["data"]))
        finally:
            d.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
            frame = d.find_element("css selector", "iframe[src*='plugin_entry.html?name=dlprof']")
            d.switch_to.frame(frame)
        return path


def wait_for_server(url: str, proc, timeout: float = 30.0, what: str = "the server") -> None:
    """Until `url` answers (a server just started)."""

    def answers():
        with urllib.request.urlopen(url, timeout=2) as resp:
            resp.read()
        return True

    wait_until(answers, timeout, what, proc)


def query(db, sql: str, args=()):
    """Rows of a read-only query on a DLProf database (the tests' independent view of the figures)."""
    import sqlite3

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()
