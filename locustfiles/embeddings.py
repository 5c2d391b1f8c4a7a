"""Realistic multimodal embedding traffic with chaos mixed in.

    locust -f locustfiles/embeddings.py --host http://127.0.0.1:8000            # web UI: knobs in the form
    locust -f locustfiles/embeddings.py --host ... --headless -u 8 -r 8 -t 60s
    locust -f locustfiles/embeddings.py --master / --worker                      # distributed

Every knob (weights, pool and reuse, malformed cases, abort delay, instruction, seeds, shape) is a custom
argument (`locust -f locustfiles/embeddings.py --help`). Rows land in --results-dir (default results/adhoc/...).
"""

from __future__ import annotations

import logging

import gevent
from locust import between, constant, events, task
from locust.runners import MasterRunner
from mmchaos.locustfiles import plugin
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
    wait_time = constant(0)

    def on_start(self):
        o = self.environment.parsed_options
        if o.wait_ms:
            self.wait_time = between(0, o.wait_ms / 1000)
        try:
            traffic = shared_traffic(o)
        except (TrafficConfigError, ValueError, OSError) as e:
            log.error("mmchaos: %s", e)
            self.environment.process_exit_code = 2  # nothing could be sent: the run did not succeed
            self.environment.runner.quit()
            raise
        self.traffic = UserTraffic(traffic, o.seed, self.worker_index, self.user_id, o.model)

    @task
    def one_request(self):
        kind = self.traffic.next_kind()
        self.send(self.traffic.build(kind), abort=(kind == "abort"))


def _in_thread(fn, *args):
    return gevent.get_hub().threadpool.apply(fn, args)


# whole-image re-encodes of fresh images (WebP) on another core, while this process's other users go on
fresh.set_offload(_in_thread)


@events.test_start.add_listener
def _warm_pool(environment, **_):
    # build (or load from the disk cache) the image pool before users start, not inside the first request
    if environment.parsed_options is not None and not isinstance(environment.runner, MasterRunner):
        try:
            shared_traffic(environment.parsed_options)
        except (TrafficConfigError, ValueError, OSError) as e:
            log.error("mmchaos: %s", e)
            environment.process_exit_code = 2
