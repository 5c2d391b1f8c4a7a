"""Bad input across the commands: one line on stderr, naming what is wrong, exit 2, no traceback, before any work
(no server, no process: the unit lane refuses to start one)."""

from __future__ import annotations

import pytest

from mmchaos.harness import cli

CAMPAIGN = """
[campaign]
name = "c"
trials = 1
target = "engine"

[workload]
users = 2
duration = 5

[[config]]
name = "a"
engine = "0.32.0"
"""

CASES = [
    # --url: parsed up front, never "is the server up?"
    (["repro", "--url", "notaurl"], "not a URL"),
    (["repro", "--url", "http://127.0.0.1:99999"], "port"),
    (["repro", "--url", "ftp://127.0.0.1:8000"], "http"),
    (["hunt", "--url", "127.0.0.1:8000"], "not a URL"),
    (["serve", "--url", "http://"], "not a URL"),
    # targets: one of them, and conflicting ones named
    (["serve", "--engine", "0.30.0", "--url", "http://127.0.0.1:8000"], "--engine"),
    (["hunt", "--engine", "0.30.0", "--command", "x {port}"], "one target"),
    (["hunt"], "one target"),
    # numbers in their ranges
    (["serve", "--engine", "0.30.0", "--port", "0"], "1-65535"),
    (["serve", "--engine", "0.30.0", "--port", "70000"], "1-65535"),
    (["hunt", "--engine", "0.30.0", "--max-cases", "0"], "max-cases"),
    (["hunt", "--engine", "0.30.0", "--max-minutes", "0"], "max-minutes"),
    (["hunt", "--engine", "0.30.0", "--mutants", "1.5"], "--mutants"),
    (["hunt", "--engine", "0.30.0", "--flags-axis", "auto:0"], "auto:0"),
    (["hunt", "--command", "x", "--flags-axis", "auto"], "--engine"),
    (["hunt", "--url", "http://127.0.0.1:8000", "--operator-actions"], "--operator-actions"),
    (["hunt", "--engine", "0.30.0", "--versions", "--mm-processor-cache-gb 0"], "version first"),
    (["minimize", "TRIAL", "--repeats", "0"], "not a positive whole number"),
    (["minimize", "TRIAL", "--max-starts", "-1"], "max-starts"),
    (["report", "RESULTS", "--window", "-5"], "window"),
    (["report", "RESULTS", "--window", "x"], "window"),
    (["report", "RESULTS", "--expect", "a"], "CONFIG=VERDICT"),
    (["report", "RESULTS", "--expect", "a=broken"], "broken"),
    (["report", "RESULTS", "--max-wedge-s", "-1"], "max-wedge-s"),
    (["predict", "RESULTS", "--rps", "-3", "--disconnects", "1%"], "rps"),
    (["predict", "RESULTS", "--rps", "10", "--disconnects", "150%"], "disconnects"),
    (["campaign", "run", "NOFILE"], "NOFILE"),
    (["campaign", "check", "RUN_TIME"], "'run_time' is Locust's name: here it is 'duration'"),
    (["campaign", "check", "BADTOML"], "not valid TOML"),
    (["k8s", "NOFILE", "--config", "a", "--workers", "2", "--image", "x"], "NOFILE"),
    (["k8s", "CAMPAIGN", "--config", "nope", "--workers", "2", "--image", "x"], "nope"),
    (["k8s", "CAMPAIGN", "--config", "a", "--workers", "0", "--image", "x"], "workers"),
    (["engine", "install", "0.3"], "0.3"),
    (["engine", "install", "banana"], "banana"),
    (["versions", "--flag-set", "noequals"], "NAME=FLAGS"),
    (["worker", "--master-host", "127.0.0.1", "--master-port", "0"], "master-port"),
    (["nosuchcommand"], "nosuchcommand"),
]


@pytest.fixture
def places(tmp_path):
    (tmp_path / "c.toml").write_text(CAMPAIGN)
    (tmp_path / "run_time.toml").write_text(CAMPAIGN.replace("duration = 5", "run_time = 5"))
    (tmp_path / "bad.toml").write_text("[campaign\nname = ")
    results = tmp_path / "results" / "c"
    (results / "a" / "t000").mkdir(parents=True)
    (results / "campaign.toml").write_text(CAMPAIGN)
    return {
        "NOFILE": str(tmp_path / "nofile.toml"),
        "RUN_TIME": str(tmp_path / "run_time.toml"),
        "BADTOML": str(tmp_path / "bad.toml"),
        "CAMPAIGN": str(tmp_path / "c.toml"),
        "RESULTS": str(results),
        "TRIAL": str(results / "a" / "t000"),
    }


@pytest.mark.parametrize("argv, says", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input_is_one_line_exit_2(argv, says, places, capsys):
    argv = [places.get(x, x) for x in argv]
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in out.err, (code, out.err[-1500:])
    assert says.lower() in lines[0].lower(), lines[0]


def test_the_table_is_long_enough():
    assert len(CASES) >= 30
