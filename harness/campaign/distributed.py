"""A campaign trial on Locust's master and workers: ``[workload] processes`` (local worker processes, Locust's
``--processes``) and ``expect_workers`` (workers on other machines, ``mmchaos worker``). The master is the trial's
Locust; it owns the run, takes every worker's rows (locustfiles/plugin/shipping.py) and tells the workers to stop
when it stops, so a crash policy's stop, the end of the run and Ctrl-C reach every worker through Locust's own messages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mmchaos import schema
from mmchaos.campaign_file import Workload

from ..servers.processes import LOOPBACK, free_port
from .locust_command import worker_argv

ALL_INTERFACES = ("*", "0.0.0.0", "::")  # bind hosts a local worker reaches on loopback


@dataclass(frozen=True)
class Distribution:
    processes: int  # local worker processes
    remote: int  # workers from other machines
    bind_host: str
    port: int
    max_wait: float  # seconds the master waits for all its workers before the trial fails

    @classmethod
    def of(cls, workload: Workload) -> Distribution | None:
        """None: one Locust process, no master."""
        processes, remote = workload.processes, workload.expect_workers
        if not processes and not remote:
            return None
        if not remote:  # only workers of ours: a free loopback port, no other Locust of the machine disturbed
            return cls(processes, 0, LOOPBACK, free_port(), workload.expect_workers_max_wait)
        return cls(
            processes,
            remote,
            workload.master_bind_host,
            workload.master_bind_port,
            workload.expect_workers_max_wait,
        )

    def master_args(self) -> list[str]:
        return [
            "--master",
            "--expect-workers",
            str(self.processes + self.remote),
            "--expect-workers-max-wait",
            str(max(1, round(self.max_wait))),
            "--master-bind-host",
            self.bind_host,
            "--master-bind-port",
            str(self.port),
        ]

    def local_workers_argv(self, locustfile: str) -> list[str] | None:
        """The command of this machine's workers (one process group: Locust forks them), or None."""
        if not self.processes:
            return None
        host = LOOPBACK if self.bind_host in ALL_INTERFACES else self.bind_host
        return [*worker_argv(host, self.port, locustfile, self.processes), "--loglevel", "WARNING"]


def ledger(folder: Path) -> dict:
    """What the master wrote about its workers (locustfiles/plugin/shipping.py), for the manifest: each worker, and
    those lost mid-trial. Empty when there was no master, or it died before writing it."""
    try:
        data = json.loads((folder / schema.WORKERS).read_text())
    except (OSError, ValueError):
        return {}
    return {"workers": data.get("workers", []), "workers_lost": data.get("lost", [])}


def lost_note(lost: list[str]) -> str:
    return (
        f"{len(lost)} Locust worker{'s' * (len(lost) != 1)} lost mid-trial ({', '.join(lost)}); "
        "rows kept up to each one's last flush"
    )
