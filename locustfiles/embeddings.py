"""Realistic multimodal embedding traffic with chaos mixed in.

    locust -f locustfiles/embeddings.py --host http://127.0.0.1:8000            # web UI: knobs in the form
    locust -f locustfiles/embeddings.py --host ... --headless -u 8 -r 8 -t 60s
    locust -f locustfiles/embeddings.py --master / --worker                      # distributed

Every knob (weights, pool and reuse, malformed cases, abort delay, instruction, seeds, shape) is a custom
argument (`locust -f locustfiles/embeddings.py --help`). Rows land in --results-dir (default results/adhoc/...).
"""

from __future__ import annotations

import logging
import random
import time

from locust import events, task
from locust.runners import MasterRunner

from mmchaos.locustfiles.plugin import listeners as plugin
from mmchaos.locustfiles.plugin import open_loop
from mmchaos.locustfiles.plugin.chaos_user import ChaosUser
from mmchaos.locustfiles.plugin.shapes import ChaosShape  # noqa: F401  (Locust picks the shape class up from this module)
from mmchaos.locustfiles.plugin.traffic import Traffic, TrafficConfigError, UserTraffic

plugin.register()

log = logging.getLogger("mmchaos")


def shared_traffic(environment) -> Traffic:
    """One Traffic per process and option set (the web UI may change options between runs), kept in its run
    state."""
    o, state = environment.parsed_options, environment.mmchaos
    key = tuple(sorted(vars(o).items(), key=lambda kv: kv[0]))
    key = tuple((k, v) for k, v in key if isinstance(v, (int, float, str, bool, type(None))))
    if state.traffic is None or state.traffic[0] != key:
        state.traffic = None
        state.traffic = key, Traffic(o)
    return state.traffic[1]


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
            traffic = shared_traffic(self.environment)
        except (TrafficConfigError, ValueError, OSError) as e:
            log.error("mmchaos: %s", e)
            self.environment.process_exit_code = 2  # nothing could be sent: the run did not succeed
            self.environment.runner.quit()
            raise
        # whole-image re-encodes of fresh images (WebP) on another core, while this process's other users go on
        offload = self.environment.mmchaos.encoders.offload
        self.traffic = UserTraffic(traffic, o.seed, self.worker_index, self.user_id, o.model, offload)
        if open_loop.pacer(self.environment) is not None:
            self.refused_backoff = 0.0  # the arrivals go on while the server is down, as callers' requests do
            self.wait()  # the first request waits for its arrival too

    @task
    def one_request(self):
        kind = self.traffic.next_kind()
        slot, self.slot = self.slot, None
        self.send(self.traffic.build(kind), abort=(kind == "abort"), t_sched=slot)


@events.test_start.add_listener
def _warm_pool(environment, **_):
    # build (or load from the disk cache) the image pool before users start, not inside the first request
    if environment.parsed_options is not None and not isinstance(environment.runner, MasterRunner):
        try:
            shared_traffic(environment)
        except (TrafficConfigError, ValueError, OSError) as e:
            log.error("mmchaos: %s", e)
            environment.process_exit_code = 2
