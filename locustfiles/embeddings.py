"""Realistic multimodal embedding traffic with chaos mixed in.

    locust -f locustfiles/embeddings.py --host http://127.0.0.1:8000            # web UI: knobs in the form
    locust -f locustfiles/embeddings.py --host ... --headless -u 8 -r 8 -t 60s
    locust -f locustfiles/embeddings.py --master / --worker                      # distributed

Every knob (weights, pool and reuse, malformed cases, abort delay, instruction, seeds, shape) is a custom
argument (`locust -f locustfiles/embeddings.py --help`). Rows land in --results-dir (default results/adhoc/...).
"""

from __future__ import annotations

import functools
import logging
import os
import random
import time

from gevent.lock import BoundedSemaphore
from gevent.threadpool import ThreadPool
from locust import events, task
from locust.runners import MasterRunner

from mmchaos.locustfiles import open_loop, plugin
from mmchaos.locustfiles.chaos_user import ChaosUser
from mmchaos.locustfiles.shapes import ChaosShape  # noqa: F401  (Locust picks the shape class up from this module)
from mmchaos.locustfiles.traffic import Traffic, TrafficConfigError, UserTraffic
from mmchaos.payloads import fresh

plugin.register()

log = logging.getLogger("mmchaos")
_traffic: dict[tuple, Traffic] = {}


def shared_traffic(o) -> Traffic:
    """One Traffic per process and option set (the web UI may change options between runs)."""
    key = tuple(sorted(vars(o).items(), key=lambda kv: kv[0]))
    key = tuple((k, v) for k, v in key if isinstance(v, (int, float, str, bool, type(None))))
    if key not in _traffic:
        _traffic.clear()
        _traffic[key] = Traffic(o)
    return _traffic[key]


class EmbeddingUser(ChaosUser):
    open_loop_capable = True  # --rate: each request waits for its arrival (open_loop.py)
    slot: float | None = None  # open loop: the epoch time of the arrival this user claimed

    def wait_time(self) -> float:
        pacer = open_loop.pacer(self.environment)
        if pacer is not None:
            # open loop: claim the next arrival when free, and wait for it in Locust's own wait (stoppable)
            self.slot = pacer.claim()
            return max(0.0, self.slot - time.time())
        # think time uniform in [0, wait_ms], as Locust's between(); read per wait: the web form may change it
        return random.uniform(0, self.environment.parsed_options.wait_ms / 1000)

    def on_start(self):
        o = self.environment.parsed_options
        try:
            traffic = shared_traffic(o)
        except (TrafficConfigError, ValueError, OSError) as e:
            log.error("mmchaos: %s", e)
            self.environment.process_exit_code = 2  # nothing could be sent: the run did not succeed
            self.environment.runner.quit()
            raise
        self.traffic = UserTraffic(traffic, o.seed, self.worker_index, self.user_id, o.model)
        if open_loop.pacer(self.environment) is not None:
            self.refused_backoff = 0.0  # the arrivals go on while the server is down, as callers' requests do
            self.wait()  # the first request waits for its arrival too

    @task
    def one_request(self):
        kind = self.traffic.next_kind()
        slot, self.slot = self.slot, None
        self.send(self.traffic.build(kind), abort=(kind == "abort"), t_sched=slot)


@functools.cache
def _encoders() -> ThreadPool:
    # as many threads as cores (made at first use, in the process that uses them): more would add nothing but
    # memory, glibc giving each thread that ever ran an encode an arena of its own (~20 MB here). gevent's hub pool
    # (10 threads) grew a one-hour run from 374 to 424 MB as bursts of fresh images woke more of its threads.
    return ThreadPool(os.cpu_count() or 1)


def _in_thread(fn, *args):
    return _encoders().apply(fn, args)


# whole-image re-encodes of fresh images (WebP) on another core, while this process's other users go on
fresh.set_offload(_in_thread, BoundedSemaphore(os.cpu_count() or 1))


@events.test_start.add_listener
def _warm_pool(environment, **_):
    # build (or load from the disk cache) the image pool before users start, not inside the first request
    if environment.parsed_options is not None and not isinstance(environment.runner, MasterRunner):
        try:
            shared_traffic(environment.parsed_options)
        except (TrafficConfigError, ValueError, OSError) as e:
            log.error("mmchaos: %s", e)
            environment.process_exit_code = 2
