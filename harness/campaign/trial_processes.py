"""The processes of one campaign trial, owned by one object: the server (replaced by its restart after a crash), the
fault proxy, injector and control, Locust and this machine's Locust workers. Used as ``with``, whatever was started
is stopped however the trial ends (its end, a failure to start, Ctrl-C), in the order that keeps the rows:

1. the load's clock stops (a trial's clock is its load, not its stops);
2. faults by hand end, then the campaign's faults (a stopped process is continued, the proxy's faults turned off);
3. Locust on SIGTERM stops its users and flushes its recorder; what of its group is left after the grace is killed;
4. this machine's workers quit when their master tells them (it has their rows then), or are stopped;
5. the crash watcher reads the log one last time, then the server and the proxy stop.
"""

from __future__ import annotations

import subprocess
import time

from mmchaos.manifest import TrialManifest

from ..injection.control import FaultControl
from ..injection.injector import FaultInjector
from ..injection.proxy import FaultProxy
from ..servers.crash_watch import CrashWatch
from ..servers.processes import stop_group
from ..servers.server import Server


class TrialProcesses:
    def __init__(self, server: Server, manifest: TrialManifest, grace: float):
        self.server = server
        self.manifest = manifest
        self.grace = grace  # seconds Locust and its workers may take to stop and flush their rows
        self.proxy: FaultProxy | None = None  # between Locust and the server, when the trial has network faults
        self.injector: FaultInjector | None = None
        self.control: FaultControl | None = None  # faults by hand (the web UI's form) and the panel's list of faults
        self.locust: subprocess.Popen | None = None
        self.local_workers: subprocess.Popen | None = None  # [workload] processes: a process group of their own
        self.watch: CrashWatch | None = None
        self.locust_code: int | None = None  # Locust's exit code once stopped

    def __enter__(self) -> TrialProcesses:
        return self

    def __exit__(self, *exc) -> None:
        if self.manifest.t_load_start is not None:  # the load began
            self.manifest.t_load_end = time.time()
        if self.control is not None:
            self.control.stop()
        if self.injector is not None:
            self.injector.finish(time.time())
        self.locust_code = stop_group(self.locust, self.grace) if self.locust else None
        if self.local_workers is not None:
            try:
                self.local_workers.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                pass
            stop_group(self.local_workers, self.grace)
        if self.watch:
            self.watch.finish()
        self.server.stop()
        if self.proxy is not None:
            self.proxy.stop()
