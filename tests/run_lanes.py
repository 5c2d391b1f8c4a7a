"""`make test`: the suite in two lanes at once, one per core of the 2-core machines it runs on.

- the stand-in lane: the fast tests (``-m "not engine"``), started first; its report is printed at the end;
- the engine lane: the tests against real vLLM (``-m engine``), one server at a time, printed as it goes. What it
  needs (``--prepare``: `make engines browser`, minutes on a fresh machine) is installed while the stand-in lane
  runs, and the lane starts when that is done.

Exit code 0 only when both lanes pass. Each lane is a pytest process in a process group of its own, started here
(not by a shell's ``&``, which would start it with SIGINT ignored and so deafen the processes the tests interrupt);
Ctrl-C or SIGTERM stops both groups. Other arguments go to both pytest runs.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from mmchaos.harness.processes import stop_group

ROOT = Path(__file__).resolve().parent.parent
LANES = {"engine": ["-m", "engine", "--durations=25"], "stand-in": ["-m", "not engine", "--durations=15"]}
STOP_GRACE_S = 30


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
    with tempfile.TemporaryDirectory(prefix="mmchaos-test-lanes-") as tmp:
        def pytest(lane: str, **kw) -> subprocess.Popen:
            argv = [sys.executable, "-m", "pytest", "-ra", *LANES[lane], "--basetemp", f"{tmp}/{lane}", *extra]
            return subprocess.Popen(argv, cwd=ROOT, start_new_session=True, **kw)

        log = Path(tmp) / "stand-in.log"
        with open(log, "wb") as out:
            standin = pytest("stand-in", stdout=out, stderr=subprocess.STDOUT)
        procs = [standin]
        codes = {}
        try:
            if prepare:
                print(f"the stand-in lane runs; meanwhile: {prepare}", flush=True)
                procs.append(subprocess.Popen(shlex.split(prepare), cwd=ROOT, start_new_session=True))
                codes["prepare"] = procs[-1].wait()
            if not codes.get("prepare"):
                procs.append(pytest("engine"))
                codes["engine"] = procs[-1].wait()
            codes["stand-in"] = standin.wait()
        except KeyboardInterrupt:
            _stop(procs)
            print("\ntests interrupted: both lanes stopped", flush=True)
            return 130
        print("\n=== the stand-in lane (pytest -m 'not engine') ===", flush=True)
        sys.stdout.buffer.write(log.read_bytes())
    print("\n" + "; ".join(f"{step}: exit code {code}" for step, code in codes.items()), flush=True)
    return 0 if not any(codes.values()) else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prepare", default="", help="a command that installs what the engine lane needs")
    a, pytest_args = p.parse_known_args()
    sys.exit(main(a.prepare, pytest_args))
