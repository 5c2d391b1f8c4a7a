"""Load shapes, selected by ``--shape``: steady, ramp, spike, soak.

All take the users, spawn rate and run time of Locust's own options (``-u``, ``-r``, ``-t`` or the web form) and
stop the test when the run time is used (a shape returning None ends the test): every run is bounded in time.
"""

from __future__ import annotations

import math

from locust import LoadTestShape

DEFAULT_RUN_TIME = 60.0  # when the user gave no run time: loads here are always bounded


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

    def tick(self):
        opts = self.runner.environment.parsed_options
        run_time = float(opts.run_time or DEFAULT_RUN_TIME)
        t = self.get_run_time()
        if t >= run_time:
            return None
        users = int(opts.num_users or 1)
        rate = float(opts.spawn_rate or users)
        return users_at(getattr(opts, "shape", "steady"), t, users, run_time), rate
