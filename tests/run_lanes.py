"""`make test`: every lane of the suite (tests/conftest.py puts each test in one), two at a time on the 2-core
machines it runs on, and the static checks.

- the static checks (``STATIC``: ruff's lint and format check, mypy over the package as it installs), started
  with the unit lane: seconds of ruff and under a minute of mypy, in the unit lane's shadow;
- the unit lane (``-m unit``: in-process, a minute or two), then the integration lane (``-m integration``: stand-in
  servers, Locust, the mmchaos command, campaigns), one after the other, started first;
- the first engine lane: the tests against real vLLM that start their own servers, printed as it goes. What it
  needs (``--prepare``: `make engines browser`, minutes on a fresh machine) is installed while the unit and
  integration lanes run, and the lane starts when that is done;
- the second engine lane: the tests that share the session's servers and the demo campaign (``shared_server``, set
  by tests/conftest.py: a shared server is started once only within one pytest process), and a few with servers of
  their own marked ``second_lane`` (this lane starts ~15 minutes later: they even the two lanes' end), started when
  the integration lane is done and its core is free. A vLLM start is ~30 s of mostly one core: two engine lanes overlap
  them.

The reports of the lanes not printed as they go, and the static checks', are printed at the end, then each step's
exit code and one line of totals across the lanes in pytest's form (from each lane's JUnit XML). Exit code 0 only
when every lane and every static check passes; a lane that collects no test fails (an empty engine lane must not
pass), unless a filter was given by hand (``-k``, ``-m`` or test ids after the options), which may empty a lane.
Each lane is a pytest process in a process group of its own, started here (not by a shell's ``&``, which would start
it with SIGINT ignored and so deafen the processes the tests interrupt); Ctrl-C or SIGTERM stops them all. Other
arguments go to every pytest run.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mmchaos.harness.servers.processes import stop_group

ROOT = Path(__file__).resolve().parent.parent
LANES = {
    "unit": ["-m", "unit", "--durations=10"],
    "integration": ["-m", "integration", "--durations=15"],
    "engine, own servers": ["-m", "engine and not (shared_server or second_lane)", "--durations=20"],
    "engine, shared servers": ["-m", "engine and (shared_server or second_lane)", "--durations=20"],
}
STOP_GRACE_S = 30
NO_TESTS = pytest.ExitCode.NO_TESTS_COLLECTED
# `make lint` and `make typecheck`, each a process of its own (ruff's and mypy's exit codes: 0 clean)
STATIC = {
    "ruff check": [sys.executable, "-m", "ruff", "check", "."],
    "ruff format --check": [sys.executable, "-m", "ruff", "format", "--check", "."],
    "mypy": [sys.executable, "tests/typecheck.py"],
}


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        stop_group(p, STOP_GRACE_S)


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def main(prepare: str, extra: list[str]) -> int:
    # handled here, so default in the lanes (an exec resets handled signals), even when this was started with
    # SIGINT ignored: tests interrupt the processes they start and expect them to hear it
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    with tempfile.TemporaryDirectory(prefix="mmchaos-test-lanes-", ignore_cleanup_errors=True) as tmp:
        logs: dict[str, Path] = {}
        junit: list[Path] = []

        def logged(step: str, argv: list[str]) -> subprocess.Popen:
            logs[step] = Path(tmp) / f"{len(logs)}.log"
            with open(logs[step], "wb") as out:
                return subprocess.Popen(argv, cwd=ROOT, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)

        def start(lane: str, live: bool = False) -> subprocess.Popen:
            argv = [
                sys.executable,
                "-m",
                "pytest",
                "-ra",
                *LANES[lane],
                "--basetemp",
                f"{tmp}/{lane.replace(', ', '-').replace(' ', '-')}",
                f"--junit-xml={tmp}/{len(junit)}.xml",
                *extra,
            ]
            junit.append(Path(f"{tmp}/{len(junit)}.xml"))
            if live:
                return subprocess.Popen(argv, cwd=ROOT, start_new_session=True)
            return logged(lane, argv)

        procs = [start("unit")]
        static = {step: logged(step, argv) for step, argv in STATIC.items()}
        procs += static.values()
        codes = {}
        try:
            if prepare:
                print(f"the unit and integration lanes run; meanwhile: {prepare}", flush=True)
                preparing = subprocess.Popen(shlex.split(prepare), cwd=ROOT, start_new_session=True)
                procs.append(preparing)
            # the unit lane, then the integration lane in its slot, while the engines install
            codes["unit"] = procs[0].wait()
            procs.append(start("integration"))
            integration = procs[-1]
            for step, proc in static.items():  # started with the unit lane, done long before it
                codes[step] = proc.wait()
            if prepare:
                codes["prepare"] = preparing.wait()
            if not codes.get("prepare"):
                own = start("engine, own servers", live=True)
                procs.append(own)
                codes["integration"] = integration.wait()
                shared = start("engine, shared servers")
                procs.append(shared)
                codes["engine, own servers"] = own.wait()
                codes["engine, shared servers"] = shared.wait()
            else:
                codes["integration"] = integration.wait()
        except KeyboardInterrupt:
            _stop(procs)
            print("\ntests interrupted: every lane stopped", flush=True)
            return 130
        for step, log in logs.items():
            what = f"the {step} lane (pytest {shlex.join(LANES[step][:2])})" if step in LANES else f"{step} (static)"
            print(f"\n=== {what} ===", flush=True)
            sys.stdout.buffer.write(log.read_bytes())
        totals = _totals(junit)
    print("\n" + "; ".join(f"{step}: exit code {code}" for step, code in codes.items()), flush=True)
    print(totals, flush=True)
    lanes = [code for step, code in codes.items() if step in LANES]
    # 5 is pytest's "no test collected": a failure, unless a filter given by hand may have emptied a lane
    empty_ok = bool(extra)
    failed = any(code not in (0, NO_TESTS) for code in codes.values()) or all(c == NO_TESTS for c in lanes)
    failed = failed or (not empty_ok and NO_TESTS in lanes)
    return 1 if failed else 0


def _totals(reports: list[Path]) -> str:
    """``N passed, N failed, N errors, N skipped`` over the lanes' JUnit XML reports (a lane that wrote none: said)."""
    n = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    missing = 0
    for f in reports:
        try:
            root = ET.parse(f).getroot()
        except (OSError, ET.ParseError):
            missing += 1
            continue
        for suite in root.iter("testsuite"):
            for k in n:
                n[k] += int(suite.get(k, 0))
    passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    line = f"{passed} passed, {n['failures']} failed, {n['errors']} errors, {n['skipped']} skipped (all lanes)"
    return line + (f"; {missing} lane(s) wrote no report" if missing else "")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prepare", default="", help="a command that installs what the engine lane needs")
    a, pytest_args = p.parse_known_args()
    sys.exit(main(a.prepare, pytest_args))
