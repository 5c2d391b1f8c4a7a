"""The embeddings locustfile plus per-worker bookkeeping, for tests of master/worker runs.

Each worker adds its pid to every stats report it sends; the master adds up, per worker pid, the requests each
reported, and writes them as JSON to the file named by MMCHAOS_TEST_WORKER_COUNTS when it quits (after its
--json-file). A recorder row's ``worker`` column ends in the same pid, so rows and Locust's counts can be compared
worker by worker, including for a worker that was killed. Each worker also counts Locust's request events itself
and writes the count to that file name + ``.<pid>`` when it quits (a worker whose master is gone reports nothing).
"""

from __future__ import annotations

import json
import os
from collections import Counter

from locust import events
from locust.runners import WorkerRunner

from mmchaos.locustfiles.embeddings import ChaosShape, EmbeddingUser  # noqa: F401  (Locust picks them up from here)

_reported: Counter = Counter()
_own = Counter()


@events.request.add_listener
def _count_own(**_):
    _own["requests"] += 1


@events.report_to_master.add_listener
def _tag(client_id, data, **_):
    data["mmchaos_pid"] = os.getpid()


@events.worker_report.add_listener
def _count(client_id, data, **_):
    if "mmchaos_pid" in data:
        _reported[data["mmchaos_pid"]] += data["stats_total"]["num_requests"]


@events.init.add_listener
def _on_init(environment, **_):
    if isinstance(environment.runner, WorkerRunner):
        events.quit.add_listener(_write_own)


def _write_own(**_):
    out = os.environ.get("MMCHAOS_TEST_WORKER_COUNTS")
    if out:
        with open(f"{out}.{os.getpid()}", "w") as f:
            json.dump(_own["requests"], f)


@events.quit.add_listener
def _write(**_):
    out = os.environ.get("MMCHAOS_TEST_WORKER_COUNTS")
    if out and _reported:
        with open(out, "w") as f:
            json.dump({str(pid): n for pid, n in _reported.items()}, f)
