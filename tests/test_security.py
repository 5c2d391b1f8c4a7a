"""Secrets, exposure and bad input (issue 12), on the stand-in: no key reaches any output, the web UI listens on
loopback, commands keep their JSON, `campaign check` checks what `campaign run` does, damaged results are read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
import requests as http
from cli_inprocess import mmchaos
from conftest import TESTS, standin_server
from locust_run import ROOT, only, rows

from mmchaos import schema
from mmchaos.analysis.report import write_report
from mmchaos.harness.servers.processes import free_port
from mmchaos.harness.servers.server import fill_placeholders
from mmchaos.redact import Redactor, secrets_of
from mmchaos.tables import COMPACT, table_dir

PY = sys.executable
STANDIN = f"{PY} {TESTS / 'standin_server.py'}"


def cli(*args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "mmchaos.harness.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout, env=env
    )


def grep_tree(root: Path, needles: list[str]) -> list[str]:
    """Every file under ``root`` (Parquet included: their bytes hold the strings) that contains a needle."""
    hits = []
    for p in root.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            hits += [f"{p.relative_to(root)}: {n}" for n in needles if n.encode() in data]
    return hits


# --- what is secret ---------------------------------------------------------------------------------------------


def test_what_is_secret_is_decided_once():
    s = secrets_of(
        ["--api-key", "sk-a1b2", "--port", "1", "--api-key=sk-c3d4"],
        {"VLLM_API_KEY": "sk-e5f6", "HF_TOKEN": "hf-g7h8", "PATH": "/bin", "MY_PASSWORD": "pw-9999"},
        "vllm serve m --api-key 'sk-i9j0' --x",
    )
    assert s == {"sk-a1b2", "sk-c3d4", "sk-e5f6", "hf-g7h8", "pw-9999", "sk-i9j0"}
    r = Redactor(s)
    text = (
        "args: {'api_key': ['sk-a1b2']} Authorization: Bearer tok-unknown http://me:hunter2@host/x "
        "--api-key never-seen sk-e5f6 /bin"
    )
    out = r.text(text)
    assert "sk-" not in out and "tok-unknown" not in out and "hunter2" not in out and "never-seen" not in out
    assert out.endswith("/bin") and "http://me:***@host/x" in out
    assert r.argv(["--api-key", "k", "k2", "--port", "1"]) == ["--api-key", "***", "***", "--port", "1"]
    assert r.env({"HF_TOKEN": "x", "PATH": "/bin"}) == {"HF_TOKEN": "***", "PATH": "/bin"}


def test_only_host_port_and_model_are_placeholders():
    cmd = "vllm serve {model} --host {host} --port {port} --limit-mm-per-prompt '{\"image\": 4}' --x '{}' {other}"
    assert fill_placeholders(cmd, host="127.0.0.1", port=8000, model="/m") == (
        "vllm serve /m --host 127.0.0.1 --port 8000 --limit-mm-per-prompt '{\"image\": 4}' --x '{}' {other}"
    )


# --- campaigns: keys in flags, env and command ------------------------------------------------------------------


def _keyed_campaign(tmp_path: Path, keys: dict[str, str]) -> Path:
    f = tmp_path / "keyed.toml"
    f.write_text(f'''
[campaign]
name = "keyed"
target = "command"
command = "{STANDIN} --port {{port}} --echo-key --api-key {keys["command"]} --limit-mm-per-prompt '{{\\"image\\": 4}}'"

[workload]
users = 3
spawn_rate = 3
duration = 120  # only a hung trial reaches it: the trial ends at its budget
max_requests = 300  # ~5 % are a dimensions case (its 400 echoes the key): none of 300, p < 1e-6

[workload.options]
image_preset = "small"
pool_size = 8

[[config]]
name = "keyed"
flags = ["--api-key", "{keys["flags"]}"]
env = {{ VLLM_API_KEY = "{keys["env"]}", HF_TOKEN = "{keys["token"]}" }}
''')
    return f


@pytest.mark.integration
def test_keys_in_flags_env_and_command_reach_the_server_and_no_output(tmp_path):
    """The server gets its keys and quotes them (in its argument dump and in its error answers); requests carry
    the key it accepts; no byte written under results, and no line on the terminal, holds any of them."""
    keys = {k: f"sk-{k}-{uuid.uuid4().hex}" for k in ("command", "flags", "env", "token")}
    f = _keyed_campaign(tmp_path, keys)
    root = tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMCHAOS_API_KEY")}
    run = cli("campaign", "run", str(f), "--results", str(root), env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    trial = root / "keyed" / "keyed" / "t000"
    assert "standin non-default args" in (trial / schema.SERVER_LOG).read_text()  # the dump is there, masked
    df = rows(trial)
    posts = df[df["endpoint"] == "/v1/embeddings"]
    assert (posts["status"] != 401).all() and (posts["outcome"] == schema.OK).any()  # the flags' key, sent
    assert df["error"].astype(str).str.contains(r"with key \*\*\*", regex=True).any()  # echoed, and masked
    rep = cli("report", str(root / "keyed"), env=env)
    assert rep.returncode == 0, rep.stderr[-2000:]
    check = cli("campaign", "check", str(f), "--results", str(root), env=env)
    assert check.returncode == 0, check.stderr
    needles = list(keys.values())
    assert grep_tree(root, needles) == []
    for out in (run.stdout, run.stderr, rep.stdout, rep.stderr, check.stdout, check.stderr):
        assert not [n for n in needles if n in out]
    manifest = json.loads((trial / schema.MANIFEST).read_text())
    assert manifest["flags"] == ["--api-key", "***"] and manifest["env"] == {"VLLM_API_KEY": "***", "HF_TOKEN": "***"}


@pytest.mark.integration
def test_the_web_ui_state_never_shows_the_key(tmp_path):
    from test_webui import LocustUI, run_finished_and_flushed, wait_for

    key = f"sk-ui-{uuid.uuid4().hex}"
    with standin_server(tmp_path / "s.log", "--api-key", key, "--echo-key") as s:
        os.environ["MMCHAOS_API_KEY"] = key
        try:
            ui = LocustUI(
                tmp_path,
                "--host",
                s.base_url,
                "--autostart",
                "-u",
                "2",
                "-r",
                "2",
                "-t",
                "60s",
                "--max-requests",
                "40",  # a budget, not a count reached in a fixed time
                "--autoquit",
                "60",
                "--results-dir",
                str(tmp_path / "out"),
                "--image-preset",
                "small",
                "--pool-size",
                "4",
                "--malformed-cases",
                "dimensions_unsupported",
                *only(valid_image=3, malformed_post=1),
            ).wait_up()
        finally:
            del os.environ["MMCHAOS_API_KEY"]
        try:
            st, df = wait_for(lambda: run_finished_and_flushed(ui, tmp_path / "out"), 90, "the run to end")
            stats = http.get(ui.url + "/stats/requests", timeout=5).text
        finally:
            ui.stop()
    assert (df["status"] == 400).any() and (df["status"] != 401).all()
    assert key not in json.dumps(st) and key not in stats
    assert grep_tree(tmp_path / "out", [key]) == []


# --- loopback by default ----------------------------------------------------------------------------------------


@pytest.mark.integration
def test_plain_locust_opens_the_mix_on_loopback_only(tmp_path):
    """locust.conf at the repository root: `.venv/bin/locust` with no arguments serves the mix on 127.0.0.1."""
    port = free_port()
    proc = subprocess.Popen(
        [PY, "-m", "locust", "--web-port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline, listening = time.time() + 60, []
        while not listening and time.time() < deadline and proc.poll() is None:
            listening = [
                c.laddr
                for c in psutil.Process(proc.pid).net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port
            ]
            time.sleep(0.1)  # polling for the UI to listen
        assert listening == [("127.0.0.1", port)], listening
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


# --- one validation path ----------------------------------------------------------------------------------------

BASE = """
[campaign]
name = "v"
target = "command"
command = "{standin} --port {{port}}"

[workload]
users = 2
spawn_rate = 2
duration = 2
shape = "steady"

[workload.options]
image_preset = "small"

[[config]]
name = "a"
"""
MISTAKES = {
    "misspelled option": (
        ('image_preset = "small"', 'image_presett = "small"'),
        ":14: unknown option 'image_presett' in [workload.options]; did you mean 'image_preset'?",
    ),
    "misspelled kind": (
        ("[workload.options]", "[workload.mix]\nvalid_imag = 3\n\n[workload.options]"),
        "unknown kind 'valid_imag' in [workload.mix]; did you mean 'valid_image'?",
    ),
    "preset": (
        ('image_preset = "small"', 'image_preset = "huge"'),
        "image_preset must be one of realistic, small, not 'huge'",
    ),
    "shape": (('shape = "steady"', 'shape = "sawtooth"'), ":11: shape 'sawtooth' unknown; known: "),
    "missing cases file": (
        ('image_preset = "small"', 'cases_file = "no-such.toml"'),
        "cases_file: malformed case file",
    ),
    "short duration": (("duration = 2", "duration = 0.3"), "duration must be at least 1 s, not 0.3"),
    "no spawn rate": (("spawn_rate = 2", "spawn_rate = 0"), "spawn_rate must be positive"),
    "bad case name": (
        ('image_preset = "small"', 'malformed_cases = "dimension_unsupported"'),
        "unknown case 'dimension_unsupported'; did you mean 'dimensions_unsupported'?",
    ),
    "port": (('target = "command"', 'target = "attach"\nurl = "http://127.0.0.1:99999"'), "ports are 1-65535"),
    "weight": (
        ("[workload.options]", "[workload.mix]\nabort = -1\n\n[workload.options]"),
        "[workload.mix] abort must be at least 0, not -1",
    ),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_check_rejects_what_run_would_reject(tmp_path, mistake):
    (old, new), needle = MISTAKES[mistake]
    f = tmp_path / "c.toml"
    f.write_text(BASE.format(standin=STANDIN).replace(old, new, 1))
    results = tmp_path / "results"
    for action in ("check", "run"):  # in this process: refused before anything runs
        r = mmchaos("campaign", action, str(f), "--results", str(results))
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], (action, r.stderr)
    assert not results.exists()


@pytest.mark.integration
def test_paths_in_a_campaign_file_are_relative_to_it(tmp_path):
    from PIL import Image

    (tmp_path / "sub" / "imgs").mkdir(parents=True)
    Image.new("RGB", (32, 32), (9, 9, 9)).save(tmp_path / "sub" / "imgs" / "a.png")
    src = ROOT / "payloads" / "malformed_cases.toml"
    text = src.read_text().replace('name = "dimensions_unsupported"', 'name = "mine"', 1)
    (tmp_path / "sub" / "mine.toml").write_text(
        text[text.index("[[case]]") : text.index("[[case]]", text.index("[[case]]") + 1)]
    )
    f = tmp_path / "sub" / "c.toml"
    # the one case selected fails after rendering: malformed_pre has none to draw from, so its weight is 0
    f.write_text(
        BASE.format(standin=STANDIN)
        .replace('image_preset = "small"', 'image_dir = "imgs"\ncases_file = "mine.toml"\nmalformed_cases = "mine"')
        .replace("[workload.options]", "[workload.mix]\nmalformed_pre = 0\n\n[workload.options]")
    )
    r = cli("campaign", "check", str(f), "--results", str(tmp_path / "results"), timeout=60)
    assert r.returncode == 0, r.stderr  # run from another folder than the file's


@pytest.mark.integration
def test_a_trial_whose_locust_cannot_start_fails_with_locusts_reason(tmp_path):
    lf = tmp_path / "broken.py"
    lf.write_text("raise RuntimeError('this locustfile does not load')\n")
    f = tmp_path / "c.toml"
    f.write_text(BASE.format(standin=STANDIN).replace('shape = "steady"', f'shape = "steady"\nlocustfile = "{lf}"'))
    r = cli("campaign", "run", str(f), "--results", str(tmp_path / "results"))
    assert r.returncode == 1, r.stderr
    manifest = json.loads((tmp_path / "results" / "v" / "a" / "t000" / schema.MANIFEST).read_text())
    assert manifest["status"] == "failed" and "this locustfile does not load" in manifest["error"]
    assert "Locust could not run" in r.stderr


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_bad_port_is_one_line(port):
    r = mmchaos("serve", "--engine", "0.30.0", "--port", port)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "is not a port (1-65535)" in r.stderr


# --- damaged results --------------------------------------------------------------------------------------------


def _small_campaign(tmp_path: Path) -> Path:
    f = tmp_path / "c.toml"
    # the server dies at its 31st embedding request; the budget ends the trial however busy the machine (the
    # duration only bounds a hung one)
    f.write_text(
        BASE.format(standin=STANDIN)
        .replace('[[config]]\nname = "a"\n', '[[config]]\nname = "a"\nflags = ["--die-after", "30"]\n')
        .replace("duration = 2\n", "duration = 120\nmax_requests = 100\n")
    )
    r = cli("campaign", "run", str(f), "--results", str(tmp_path / "results"))
    assert r.returncode == 0, r.stderr
    return tmp_path / "results" / "v"


@pytest.mark.integration
def test_the_report_reads_damaged_results_and_says_what_it_skipped(tmp_path):
    camp = _small_campaign(tmp_path)
    trial = camp / "a" / "t000"
    table_dir(trial, "metrics").mkdir(exist_ok=True)
    (table_dir(trial, "metrics") / COMPACT).write_bytes(b"PAR1 broken")  # a compacted file that cannot be read
    health = table_dir(trial, "health")
    first = sorted(health.iterdir())[0]
    pq.write_table(pq.read_table(first).replace_schema_metadata({}), health / COMPACT)  # no list of its parts
    for p in table_dir(trial, "crashes").iterdir():
        p.unlink()  # the manifest says 1 crash; the table is gone
    res = write_report(camp, out_dir=tmp_path / "report")
    md = res.markdown.read_text()
    assert "skipped unreadable" in md and "metrics" in md and "health" in md
    assert "manifest says 1 crash(es) but its crashes table holds 0" in md
