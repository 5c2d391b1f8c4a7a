"""The mmchaos panel in a real browser: headless Chromium (Debian's package, installed by `make test`) driven by
Playwright, against Locust's web UI.

- the report's version of vLLM: a run started from the form crashes the server, and the crash appears on the
  panel with its log signature (screenshots in test-output/);
- on the stand-in server: server text (error answers, log lines) is shown as text, never run as markup.

Both are in the `engine` tier (run by `make test`, which installs Chromium; not by `make unit`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys

import pytest
import requests
from conftest import REPORT_VERSION, standin_server, vllm_server
from locust_run import ROOT
from test_webui import LocustUI, wait_for

pytestmark = pytest.mark.engine

CHROMIUM = "/usr/bin/chromium"
INSTALL = "make browser  (or: apt-get update && apt-get install -y chromium)"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OUTPUT = ROOT / "test-output"
CRASH_WAIT_MS = 240_000  # from the start click: pool warm-up, the load (up to its 200 s), the crash, a UI poll


@contextlib.contextmanager
def browser_page(profile_dir, width: int = 1500, height: int = 1000):
    """A page of a fresh headless Chromium (its own user-data dir), closed at the end."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"headless Chromium is missing ({CHROMIUM}): install it with `{INSTALL}`")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright for Python is missing: `.venv/bin/pip install -e '.[test]'` (or `make test`)")
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(profile_dir),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": width, "height": height},
        )
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            page.set_default_timeout(30_000)
            yield page
        finally:
            ctx.close()


def start_from_form(page, url: str, users: int, spawn_rate: int, run_time: str, **custom: str) -> None:
    """Fill Locust's start form as a user does and press Start. ``custom``: the form's custom parameters."""
    page.goto(url)
    page.fill("input[name=userCount]", str(users))
    page.fill("input[name=spawnRate]", str(spawn_rate))
    page.get_by_role("button", name="Advanced options").click()
    page.fill("input[name=runTime]", run_time)
    if custom:
        page.get_by_role("button", name="Custom parameters").click()
        for name, value in custom.items():
            page.fill(f"input[name={name}]", value)
    page.get_by_role("button", name="Start").click()


@contextlib.contextmanager
def what_the_page_showed(page, ui: LocustUI, shot):
    """A failure says what the page showed (start form or dashboard), the run's state and Locust's output."""
    try:
        yield
    except Exception as e:
        page.screenshot(path=str(shot), full_page=True)
        shown = " ".join(page.inner_text("body").split())[:300]
        raise AssertionError(
            f"{e}\nthe page showed: {shown}\nthe run: {ui.state()['runner_state']}; Locust said:\n{ui.output()}"
        ) from e


def open_tab(page, title: str) -> None:
    page.get_by_role("tab", name=title).click()


def event_row(page, event: str, signature: str):
    cell = page.locator("td").filter(has_text=re.compile(rf"^{re.escape(event)}$"))
    return page.locator("tbody tr").filter(has=cell).filter(has_text=signature)


def test_engine_crash_appears_on_the_panel(tmp_path):
    """vLLM 0.30.0, default flags, the default mix started from the web form: the panel shows the crash with
    the report's signature (detokenizer_assert), read from the server log named by --server-log."""
    OUTPUT.mkdir(exist_ok=True)
    log = tmp_path / "server.log"
    shot = OUTPUT / f"webui-panel-crash-vllm-{REPORT_VERSION}.png"
    with vllm_server(REPORT_VERSION, [], log) as server:
        ui = LocustUI(
            tmp_path, "--host", server.base_url, "--server-log", str(log), "--results-dir", str(tmp_path / "results")
        ).wait_up()
        try:
            with browser_page(tmp_path / "chromium-profile") as page:
                # a form change that must reach the run: no /tokenize requests. The run is stopped once the crash
                # shows; its length only bounds a server that lives. The mix needed 10-216 requests to the first
                # crash (docs/benchmarks.md section 2); here a lone server died after 82, 21 s in, close to the
                # 30 s this run used to have
                with what_the_page_showed(page, ui, shot):
                    start_from_form(page, ui.url + "/", users=4, spawn_rate=4, run_time="200s", weightTokenize="0")
                    open_tab(page, "mmchaos: events")
                    row = event_row(page, "crash", "detokenizer_assert").first
                    row.wait_for(timeout=CRASH_WAIT_MS)
                page.screenshot(path=str(shot), full_page=True)
                crash_text = row.inner_text()
                open_tab(page, "mmchaos: outcomes")
                page.locator("tbody tr").filter(has_text="valid_image").first.wait_for()
                page.screenshot(path=str(OUTPUT / f"webui-panel-outcomes-vllm-{REPORT_VERSION}.png"), full_page=True)
                open_tab(page, "mmchaos: server")
                page.locator("td", has_text="health now").wait_for()
                page.screenshot(path=str(OUTPUT / f"webui-panel-server-vllm-{REPORT_VERSION}.png"), full_page=True)
                open_tab(page, "mmchaos: verdict")
                page.locator("tbody tr").filter(has_text="verdict").filter(has_text="fails").first.wait_for()
                page.screenshot(path=str(OUTPUT / f"webui-panel-verdict-vllm-{REPORT_VERSION}.png"), full_page=True)
                # the timeline page, linked from the panel: health band, the crash and drift marks
                page.goto(ui.url + "/mmchaos/timeline")
                page.locator("#verdict[data-level=fails]").wait_for()
                page.locator("svg line.crash").first.wait_for(state="attached")  # a vertical line: no width
                page.locator("svg text.crash-label", has_text="detokenizer_assert").first.wait_for()
                assert page.locator("svg rect.health[data-state=ok]").count() >= 1
                assert page.locator("svg path.drift").count() >= 1
                page.screenshot(path=str(OUTPUT / f"webui-timeline-vllm-{REPORT_VERSION}.png"), full_page=True)
            st = ui.state()
        finally:
            ui.stop()
    # Locust's exit code follows the gates: the crash fails --max-crashes 0
    assert ui.proc.returncode == 1 and "gate failed: crashes 1 > --max-crashes 0" in ui.output(tail=10**7)
    assert "health" in crash_text and "after ok" in crash_text, crash_text
    crash = [e for e in st["events"] if e["event"] == "crash"]
    assert crash and crash[-1]["signature"] == "detokenizer_assert", st["events"][:10]
    assert any(e["event"] == "drift" and e["signature"] == "cache_drift" for e in st["events"]), st["events"][:20]
    assert st["options"]["weight_tokenize"] == 0 and "tokenize" not in st["outcomes"]["kinds"]
    assert st["outcomes"]["kinds"]["valid_image"]["ok"] > 0  # it served before it died
    assert st["health"]["state"] != "ok" and st["health"]["last_ok"] < crash[-1]["t"]
    assert st["verdict"]["level"] == "fails"
    assert shot.stat().st_size > 10_000


XSS_ANSWER = '<img src=x onerror="window.__mmchaos_xss=1">dimensions refused'
XSS_LOG = "WARNING <script>window.__mmchaos_xss=2</script> P0/P1 cache drift mm_hashes=['0123456789ab']"


def test_server_text_is_shown_as_text_not_markup(tmp_path):
    log = tmp_path / "server.log"
    with standin_server(log, "--error-text", shlex.quote(XSS_ANSWER)) as s:  # a shell-split command line
        weights = {
            f"weight{k}": "0"
            for k in ("ValidImage", "Text", "MultiImage", "Batch", "Tokenize", "MalformedPre", "Abort")
        }
        ui = LocustUI(
            tmp_path,
            "--host",
            s.base_url,
            "--server-log",
            str(log),
            "--results-dir",
            str(tmp_path / "results"),
            "--image-preset",
            "small",
            "--pool-size",
            "8",
        ).wait_up()
        try:
            with browser_page(tmp_path / "chromium-profile") as page:
                start_from_form(
                    page,
                    ui.url + "/",
                    users=2,
                    spawn_rate=2,
                    run_time="200s",  # the test stops it once the page has shown the texts; 200 s: a hang
                    malformedCases="dimensions_unsupported",
                    **weights,
                )
                wait_for(lambda: ui.state()["runner_state"] == "running", 30, "the run to start")
                with open(log, "a") as f:  # the server "logs" markup
                    f.write(XSS_LOG + "\n")
                open_tab(page, "mmchaos: outcomes")
                page.locator("td").filter(has_text=XSS_ANSWER).first.wait_for()
                open_tab(page, "mmchaos: events")
                page.locator("td").filter(has_text="<script>window.__mmchaos_xss=2</script>").first.wait_for()
                page.screenshot(path=str(tmp_path / "escaping.png"), full_page=True)
                assert page.evaluate("window.__mmchaos_xss") is None
                assert page.locator("img[src=x]").count() == 0 and page.locator("td script").count() == 0
            assert requests.get(ui.url + "/mmchaos/state", timeout=5).json()["options"]["weight_text"] == 0
        finally:
            ui.stop()


@contextlib.contextmanager
def served_standin(tmp_path, *flags: str, dev_mode: bool = True):
    """`mmchaos serve` of a stand-in playing TP=2 (its own process group, stopped by it): yields the addresses it
    prints (the fault proxy to load, the fault control for the web UI) and the serve process."""
    standin = ROOT / "tests/standin_server.py"
    cmd = f"{sys.executable} {standin} --port {{port}} --tensor-parallel-size 2 {' '.join(flags)}"
    out = tmp_path / "serve.out"
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1" if dev_mode else "0"}
    with open(out, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mmchaos.harness.cli", "serve", "--command", cmd, "--log", str(tmp_path / "s.log")],
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
            env=env,
        )
    try:
        wait_for(lambda: "--fault-control" in out.read_text() or proc.poll() is not None, 60, "serve's addresses")
        found = re.search(r"--host (\S+) --fault-control (\S+)", out.read_text())
        assert proc.poll() is None and found, out.read_text()
        yield found.group(1), found.group(2), proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # serve stops its server as on Ctrl-C
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def fault_rows(page):
    return page.locator("#faults tr")


def test_faults_fired_by_hand_from_the_web_ui(tmp_path):
    """A server `mmchaos serve` started: the fault page lists only what it can take, a pause and a kill of TP worker
    1 fired from its form reach the server, and the panel's faults tab lists both with their outcome."""
    OUTPUT.mkdir(exist_ok=True)
    shot = OUTPUT / "webui-faults-by-hand.png"
    with served_standin(tmp_path, "--delay-ms", "20") as (load_url, control, _serve):
        ui = LocustUI(
            tmp_path, "--host", load_url, "--fault-control", control, "--results-dir", str(tmp_path / "results")
        ).wait_up()
        try:
            with browser_page(tmp_path / "chromium-profile") as page, what_the_page_showed(page, ui, shot):
                start_from_form(page, ui.url + "/", users=2, spawn_rate=2, run_time="120s")
                page.goto(ui.url + "/mmchaos/faults")
                page.locator("#kind option", has_text="pause").wait_for(state="attached")
                kinds = page.locator("#kind option").all_inner_texts()
                assert {"kill", "stop", "latency", "pause", "reset_mm_cache"} <= set(kinds), kinds
                page.select_option("#kind", "kill")
                targets = page.locator("#target option").all_inner_texts()
                assert targets == ["tp_worker:0", "tp_worker:1", "engine_core", "api_server:0"], targets
                # a pause that keeps, for 2 s
                page.select_option("#kind", "pause")
                page.select_option("select[name=mode]", "keep")
                page.fill("#duration", "2")
                page.click("#go")
                page.locator("#said.fired", has_text="pause").wait_for()
                fault_rows(page).filter(has_text="pause server by hand").filter(has_text="POST /resume: 200").wait_for(
                    timeout=30_000
                )
                # a fault the server cannot take is refused in one line, through the same relay
                bad = {"kind": "kill", "target": "tp_worker:2"}
                r = requests.post(ui.url + "/mmchaos/faults/fire", json=bad, timeout=10)
                assert r.status_code == 400 and "has TP ranks 0-1, not 2" in r.json()["error"], r.text
                # a kill of TP worker 1: the stand-in's engine core exits, and the server with it
                page.select_option("#kind", "kill")
                page.select_option("#target", "tp_worker:1")
                page.click("#go")
                page.locator("#said.fired", has_text="kill").wait_for()
                kill = fault_rows(page).filter(has_text="kill tp_worker:1 by hand")
                kill.filter(has_text="injected").wait_for()
                assert "VLLM::Worker_TP1" in kill.inner_text()
                page.screenshot(path=str(shot), full_page=True)
                page.goto(ui.url + "/")
                open_tab(page, "mmchaos: faults")
                page.locator("tbody tr").filter(has_text="kill tp_worker:1 by hand").filter(
                    has_text="injected"
                ).wait_for()
                assert page.locator("tbody tr").filter(has_text="pause server by hand").count() == 1
                page.screenshot(path=str(OUTPUT / "webui-panel-faults.png"), full_page=True)
            st = ui.state()
        finally:
            ui.stop()
    assert [f["fault"] for f in st["faults"]] == ["pause server by hand #1", "kill tp_worker:1 by hand #2"]
    assert [f["outcome"] for f in st["faults"]] == ["injected", "injected"]


def test_the_fault_form_offers_no_operator_action_without_dev_mode(tmp_path):
    with served_standin(tmp_path, dev_mode=False) as (load_url, control, _serve):
        ui = LocustUI(tmp_path, "--host", load_url, "--fault-control", control).wait_up()
        try:
            with browser_page(tmp_path / "chromium-profile") as page:
                page.goto(ui.url + "/mmchaos/faults")
                page.locator("#kind option", has_text="kill").wait_for(state="attached")
                kinds = page.locator("#kind option").all_inner_texts()
                assert "pause" not in kinds and "reset_mm_cache" not in kinds and "latency" in kinds, kinds
            r = requests.post(ui.url + "/mmchaos/faults/fire", json={"kind": "pause", "duration": 2}, timeout=10)
            assert r.status_code == 400 and "VLLM_SERVER_DEV_MODE" in r.json()["error"], r.text
        finally:
            ui.stop()


def test_the_reports_first_screen_at_1280_px_holds_the_cards_and_the_figure(tmp_path):
    """A campaign of three configurations: at 1280 x 900 the cards and the crash-rate-against-cost figure are on
    the first screen, and nothing (no table) makes the page scroll sideways."""
    from synthetic import make_campaign

    from mmchaos.analysis import report

    res = report.write_report(make_campaign(tmp_path, "c", trials=2, requests_per_trial=300, duration_s=300))
    with browser_page(tmp_path / "chromium-profile", width=1280, height=900) as page:
        page.goto(res.html.as_uri())
        cards = page.locator("div.cards").bounding_box()
        figure = page.locator("img[alt^='crash rate against latency']").bounding_box()
        assert cards and figure and cards["y"] + cards["height"] <= figure["y"], (cards, figure)
        assert figure["y"] + figure["height"] <= 900, figure
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
        # a card's long line (its trial folder) wraps inside it
        spill = "[...document.querySelectorAll('.card p')].some(p => p.scrollWidth > p.clientWidth)"
        assert not page.evaluate(spill)
        OUTPUT.mkdir(exist_ok=True)
        page.screenshot(path=str(OUTPUT / "report-first-screen-1280.png"))
