"""Load shapes, selected by ``--shape``: steady, ramp, spike, soak.

All take the users, spawn rate and run time of Locust's own options (``-u``, ``-r``, ``-t`` or the web form) and
stop the test when the run time is used (a shape returning None ends the test): every run is bounded in time.
With ``--rate`` (open loop, open_loop.py) the users are the run's concurrency instead: sized for the rate by
Little's law from the latency of the last second's answers, never fewer, at most ``--max-concurrency``.
"""

from __future__ import annotations

import logging
import math

from locust import LoadTestShape

from mmchaos import arrivals

from . import run_state

DEFAULT_RUN_TIME = 60.0  # when the user gave no run time: loads here are always bounded
log = logging.getLogger("mmchaos")


def users_at(shape: str, t: float, users: int, run_time: float) -> int:
    """Target user count at ``t`` seconds into a run of ``run_time`` seconds."""
    if shape == "ramp":  # linear climb over the first half, then hold: where does it break?
        return max(1, math.ceil(users * min(1.0, t / max(run_time / 2, 1e-9))))
    if shape == "spike":  # a quarter of the users, all of them for the middle fifth, then a quarter again
        return users if 0.4 * run_time <= t < 0.6 * run_time else max(1, users // 4)
    if shape == "soak":  # steady with a gentle ±20% swell every 5 minutes: long runs, realistic drift
        return max(1, round(users * (1 + 0.2 * math.sin(2 * math.pi * t / 300))))
    return users  # steady


class ChaosShape(LoadTestShape):
    use_common_options = True  # users / spawn rate / run time come from the command line or the web form
    _pool = 0  # open loop: the users so far
    _seen = (0, 0.0)  # open loop: Locust's count and summed response time of requests at the last tick
    _said_behind = False  # open loop: the run said once that it fell behind

    def reset_time(self):
        super().reset_time()
        self._pool, self._seen, self._said_behind = 0, (0, 0.0), False

    def open_loop_users(self, opts) -> int:
        runner = self.runner
        assert runner is not None  # Locust gives a shape its runner before the first tick
        total = runner.stats.total
        n, rt = total.num_requests, total.total_response_time
        dn = n - self._seen[0]
        latency = (rt - self._seen[1]) / dn / 1000 if dn > 0 else None
        if dn > 0:
            self._seen = (n, rt)
        cap = opts.max_concurrency or arrivals.AUTO_MAX_CONCURRENCY
        backlog = run_state.of(runner.environment).live.backlog()
        if not self._said_behind and arrivals.behind(backlog, opts.rate):
            self._said_behind = True
            log.warning(
                "mmchaos: falling behind --rate %g: %d arrivals due and not sent, with %d users (at most %d)",
                opts.rate,
                backlog,
                self._pool,
                cap,
            )
        self._pool = opts.max_concurrency or arrivals.pool_size(opts.rate, latency, self._pool, cap, backlog)
        return self._pool

    def tick(self):
        opts = self.runner.environment.parsed_options
        run_time = float(opts.run_time or DEFAULT_RUN_TIME)
        t = self.get_run_time()
        if t >= run_time:
            return None
        if getattr(opts, "rate", 0):
            users = self.open_loop_users(opts)
            return users, users  # spawned within a second: the pool is there for the arrivals
        users = int(opts.num_users or 1)
        rate = float(opts.spawn_rate or users)
        return users_at(getattr(opts, "shape", "steady"), t, users, run_time), rate
