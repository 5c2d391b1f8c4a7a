"""``mmchaos worker``: a Locust worker on this machine for a campaign's master on another, trial after trial.

A Locust worker quits when its master's run ends (a campaign runs one Locust master per trial), so this starts it
again until Ctrl-C or SIGTERM: one command serves a whole campaign. Each run is ``locust --worker`` in a process
group of its own, stopped by that group's id; on the stop it first hands its last rows to the master. Its output
goes through this process's terminal, where secrets are masked.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from mmchaos import paths
from mmchaos.errors import MmchaosError

from ..servers import sigterm
from ..servers.processes import stop_group
from .locust_command import worker_argv

STOP_GRACE = 25.0  # a stopping worker stops its users, then waits up to 15 s for the master's acknowledgements
QUICK_FAIL_S = 10.0  # a run that fails this fast, three times over, will not do better the fourth time
RESTART_PAUSE_S = 1.0  # between two runs: a master that just ended needs a moment before the next one listens


class WorkerError(MmchaosError):
    """One line: what is wrong, what to do."""


def serve(
    master_host: str, master_port: int, locustfile: str | None = None, processes: int = 0, once: bool = False, say=print
) -> int:
    """Run Locust workers for the master at ``master_host:master_port`` until interrupted (``once``: one run, its
    exit code). Returns the exit code."""
    if not master_host.strip():
        raise WorkerError("--master-host is empty: give the master's address")
    lf = Path(locustfile).expanduser().resolve() if locustfile else paths.locustfile()
    if not lf.is_file():
        raise WorkerError(f"locustfile {locustfile} not found: give the file the campaign's master runs")
    argv = worker_argv(master_host, master_port, lf, processes)
    sigterm.as_ctrl_c()
    quick_fails = 0
    proc = None
    try:
        while True:
            say(f"mmchaos worker: joining the master at {master_host}:{master_port} ({lf.name})")
            t0 = time.monotonic()
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                text=True,
                errors="replace",
            )
            assert proc.stdout is not None  # piped above
            for line in proc.stdout:
                sys.stdout.write(line)  # through the terminal's redaction
                sys.stdout.flush()
            code = proc.wait()
            proc = None
            if once:
                return code
            quick_fails = quick_fails + 1 if code and time.monotonic() - t0 < QUICK_FAIL_S else 0
            if quick_fails >= 3:
                raise WorkerError(
                    f"the Locust worker failed three times within {QUICK_FAIL_S:g} s (exit code {code}); "
                    "see its output above"
                )
            say(f"mmchaos worker: the run ended (exit code {code}); waiting for the master's next one")
            time.sleep(RESTART_PAUSE_S)  # pacing restarts
            sigterm.check()
    except KeyboardInterrupt:
        if proc is not None:
            say("mmchaos worker: stopping (its last rows go to the master first)")
            stop_group(proc, STOP_GRACE)
        return 0
