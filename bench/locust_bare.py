"""The yardstick of bench/loadgen.py: a bare FastHttpUser posting pre-built bodies (the realistic mix's own,
built before the run by the bench), round-robin, with no recording, no context and no per-request work."""

from __future__ import annotations

import os
import pickle

from locust import FastHttpUser, constant, task

with open(os.environ["MMCHAOS_BENCH_BODIES"], "rb") as f:
    BODIES: list[tuple[str, bytes]] = pickle.load(f)
HEADERS = {"Content-Type": "application/json"}


class BareUser(FastHttpUser):
    wait_time = constant(0)
    _next = 0

    def on_start(self):
        BareUser._next += 7  # users start at different bodies
        self.i = BareUser._next

    @task
    def post(self):
        self.i += 1
        path, body = BODIES[self.i % len(BODIES)]
        self.client.post(path, data=body, headers=HEADERS, name=path)
