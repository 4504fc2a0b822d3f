"""Cross-site requests in a real headless Chromium (hardening catalogue, issue 14): pages of another origin
submit forms and fetches to dlprofviewer's reaggregate route and get 403 (or are stopped by the browser),
a rebound host name gets 403, the databases stay unchanged; the real frontend's Reaggregate keeps working in
dlprofviewer and in TensorBoard with --path_prefix; names holding HTML are shown as text."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser import Browser, TensorBoard, free_port, query, requires_browser
from tests.damage import sha256
from tests.test_browser_views import goto, select_row, select_run, set_value, wait_table
from tests.test_hardening import HTML_KERNEL, HTML_OP, ROOT, hostile_names_profile, request, run_cli
from tests.test_plugin_checks import stop
from tests.waiting import wait_until

pytestmark = [pytest.mark.browser, requires_browser]

API = "/data/plugin/dlprof/"
BODY = {"run": "reagg_dldb", "iter_start": 1, "iter_stop": 2}
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def attack_pages(viewer: str) -> dict:
    """Pages of the attacker's site, aimed at the viewer at `viewer` (http://127.0.0.1:PORT)."""
    target = f"{viewer}{API}reaggregate"
    # text/plain form: name + '=' + value is the body, so it can carry JSON (the classic trick)
    name = json.dumps(dict(BODY, domain=""))[:-2]  # ... "domain": "   (the body ends "domain": "="})
    text_form = f"""<!DOCTYPE html><html><body>
<form id="f" method="POST" enctype="text/plain" action="{target}">
<input type="hidden" name='{name}' value='"}}'></form>
<script>document.getElementById("f").submit();</script></body></html>"""
    url_form = f"""<!DOCTYPE html><html><body>
<form id="f" method="POST" action="{target}">
<input type="hidden" name="run" value="reagg_dldb"><input type="hidden" name="iter_start" value="1"></form>
<script>document.getElementById("f").submit();</script></body></html>"""
    fetches = f"""<!DOCTYPE html><html><body><script>
window.results = {{}};
const body = JSON.stringify({json.dumps(BODY)});
const settle = (key, p) => p.then((r) => {{ window.results[key] = r.type + " " + r.status; }},
                                  (e) => {{ window.results[key] = "blocked"; }});
settle("simple", fetch("{target}", {{method: "POST", mode: "no-cors",
  headers: {{"Content-Type": "text/plain"}}, body}}));
settle("preflighted", fetch("{target}", {{method: "POST", body,
  headers: {{"Content-Type": "application/json", "X-DLProf-Request": "1"}}}}));
settle("read", fetch("{viewer}{API}runs"));
</script></body></html>"""
    return {"text_form.html": text_form, "url_form.html": url_form, "fetches.html": fetches}


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    """dlprofviewer on `reagg_dldb` (the training profile) and `hostile_dldb` (HTML names), and an attacker's
    site on another port (another origin) serving the attack pages."""
    work = tmp_path_factory.mktemp("browser_security")
    export = hostile_names_profile(work / "hostile.sqlite")
    assert run_cli(f"--database={export}", f"--output_path={work}", "--base_name=hostile", "--reports=summary")[0] == 0
    from tests.profiles import training_profile

    training = training_profile(work / "training.sqlite")
    assert run_cli(f"--database={training}", f"--output_path={work}", "--base_name=reagg", "--reports=summary")[0] == 0
    port, attacker_port = free_port(), free_port()
    viewer_url = f"http://127.0.0.1:{port}"
    pages = work / "attacker"
    pages.mkdir()
    for name, html in attack_pages(viewer_url).items():
        (pages / name).write_text(html)
    viewer_log = open(work / "viewer.log", "w")
    exe = Path(sys.executable).parent / "dlprofviewer"
    viewer = subprocess.Popen(
        ([str(exe)] if exe.exists() else [sys.executable, "-m", "dlprof_plugin.viewer"])
        + [str(work / "reagg_dldb.sqlite"), str(work / "hostile_dldb.sqlite"), f"--port={port}", "--host=127.0.0.1"],
        stdout=viewer_log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )
    attacker = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(attacker_port), "--bind", "127.0.0.1", "--directory", str(pages)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: request(port, "GET", API + "runs", timeout=5)[0] == 200, 60, "dlprofviewer", viewer)
        wait_until(
            lambda: request(attacker_port, "GET", "/fetches.html", timeout=5)[0] == 200,
            30,
            "the attacker's site",
            attacker,
        )
        yield {
            "viewer": viewer_url,
            "port": port,
            "attacker": f"http://localhost:{attacker_port}",
            "db": work / "reagg_dldb.sqlite",
            "log": work / "viewer.log",
            "training": training,
        }
    finally:
        stop(viewer)
        stop(attacker)
        viewer_log.close()


@pytest.fixture(scope="module")
def browser():
    """A Chromium of this module's own (in place of the session's): attacker.test resolves to this machine, a
    DNS-rebound name as the browser would see it, which only a launch flag can arrange."""
    with Browser(extra_flags=["--host-resolver-rules=MAP attacker.test 127.0.0.1"]) as b:
        yield b


def requests_logged(log: Path, method: str) -> list[int]:
    """HTTP statuses of the viewer's logged requests to reaggregate with this method."""
    out = []
    for line in ANSI.sub("", log.read_text()).splitlines():
        match = re.search(rf'"{method} {re.escape(API)}reaggregate HTTP/1.1" (\d+)', line)
        if match:
            out.append(int(match.group(1)))
    return out


def unchanged(sites) -> tuple:
    return sha256(sites["db"]), query(sites["db"], "SELECT count(*) FROM aggregations")[0][0]


@pytest.mark.parametrize("page", ["text_form.html", "url_form.html"])
def test_a_cross_origin_form_is_refused(sites, browser, page):
    before = unchanged(sites)
    posts = len(requests_logged(sites["log"], "POST"))
    browser.driver.get(f"{sites['attacker']}/{page}")
    browser.wait(lambda d: d.current_url.startswith(sites["viewer"]), 20, "the form's navigation")
    text = browser.wait(lambda d: d.find_element("tag name", "body").text or False, 20, "the answer")
    assert "cross-site request refused" in json.loads(text)["error"]
    assert requests_logged(sites["log"], "POST")[posts:] == [403]
    assert unchanged(sites) == before
    assert (
        json.loads(request(sites["port"], "GET", API + "reaggregate_status?run=reagg_dldb")[2])["job"]["status"]
        == "idle"
    )


def test_cross_origin_fetches_are_refused_or_stopped(sites, browser):
    """A simple (no-cors) fetch reaches the server and gets 403; one that sets the request header needs a
    preflight, which is not granted, so the browser never sends it; reading data cross-origin is blocked."""
    before = unchanged(sites)
    posts = len(requests_logged(sites["log"], "POST"))
    options = len(requests_logged(sites["log"], "OPTIONS"))
    browser.driver.get(f"{sites['attacker']}/fetches.html")
    results = browser.wait(
        lambda d: (r := d.execute_script("return window.results")) and len(r) == 3 and r, 20, "the fetches"
    )
    assert results == {"simple": "opaque 0", "preflighted": "blocked", "read": "blocked"}, results
    assert requests_logged(sites["log"], "POST")[posts:] == [403]
    assert requests_logged(sites["log"], "OPTIONS")[options:] == [405]
    assert unchanged(sites) == before


def test_a_rebound_host_name_is_refused(sites, browser):
    before = unchanged(sites)
    for path in ("/", API + "runs", API + "index.js"):
        browser.driver.get(f"http://attacker.test:{sites['port']}{path}")
        text = browser.wait(lambda d: d.find_element("tag name", "body").text or False, 20, "the answer")
        assert "host 'attacker.test' is not served" in json.loads(text)["error"], path
    assert unchanged(sites) == before


def reaggregate_in_the_ui(b, db: Path, run: str) -> None:
    """Iterations view: iterations 1..2, Reaggregate, confirm; the new aggregation appears."""
    before = query(db, "SELECT count(*) FROM aggregations")[0][0]
    select_run(b, run)
    goto(b, "iterations")
    set_value(b, b.css("#iter-start"), "1")
    set_value(b, b.css("#iter-stop"), "2")
    b.click("#reaggregate")
    b.wait_css("#confirm-dialog", visible=True).find_element("css selector", "button.dialog-ok").click()
    b.wait_css("#reaggregate-status[data-status=succeeded]", timeout=120)
    assert query(db, "SELECT count(*) FROM aggregations")[0][0] == before + 1
    assert query(db, "SELECT iter_start, iter_stop FROM aggregations ORDER BY aggr_id DESC LIMIT 1")[0] == (1, 2)


def test_the_frontends_reaggregate_still_works_in_dlprofviewer(sites, browser):
    browser.driver.get(sites["viewer"] + "/")
    browser.wait_css("#dlprof-app", 30)
    reaggregate_in_the_ui(browser, sites["db"], "reagg_dldb")
    assert requests_logged(sites["log"], "POST")[-1] == 202


def test_html_in_names_is_shown_as_text(sites, browser):
    b = browser
    b.driver.get(sites["viewer"] + "/")
    b.wait_css("#dlprof-app", 30)
    select_run(b, "hostile_dldb")
    goto(b, "ops_kernels")
    wait_table(b, b.css("#ops .datatable"))
    b.wait(lambda d: HTML_OP in b.css("#ops .datatable").text, 15, "the op named with HTML")
    goto(b, "kernels_by_iteration")
    select_row(b, b.css("#iterations-table .datatable"), "iteration", "0")
    kernels = b.css("#iteration-kernels .datatable")
    b.wait(lambda d: HTML_KERNEL in kernels.text, 15, "the kernel named with HTML")
    assert "k_\ufffd_kernel" in kernels.text  # not UTF-8 in the database: decoded with replacement
    assert b.js("return [window.__xss, document.querySelectorAll('#view img, #view script').length]") == [None, 0]


def test_the_frontends_reaggregate_still_works_in_tensorboard_with_a_path_prefix(sites, tmp_path, browser):
    logdir = tmp_path / "logdir"
    assert (
        run_cli(f"--database={sites['training']}", f"--output_path={logdir / 'training'}", "--reports=summary")[0] == 0
    )
    db = logdir / "training" / "dlprof_dldb.sqlite"
    with TensorBoard(logdir, path_prefix="/pfx") as tb:  # its own: TensorBoard started with --path_prefix
        b = browser.fresh()
        b.open_dlprof(tb.url)
        reaggregate_in_the_ui(b, db, "training/dlprof")
