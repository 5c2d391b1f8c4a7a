"""Watchers: /health polled sub-second and /metrics scraped, into the HEALTH and METRICS timelines.

They run in the process that owns the test (the master, or a standalone Locust), never on workers, and stop
with the test. Each loop is bounded: it ends when the test stops or after ``max_seconds``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import gevent
from geventhttpclient import HTTPClient
from geventhttpclient.url import URL
from prometheus_client.parser import text_string_to_metric_families

from mmchaos.tables import PartWriter

log = logging.getLogger("mmchaos")
# Samples worth a timeline: vLLM's own (names vary by version, so by prefix) and the HTTP server's counters.
METRIC_PREFIXES = ("vllm:", "http_requests_total")
SKIP_SUFFIXES = ("_bucket", "_created")


def parse_metrics(text: str, t: float) -> list[dict]:
    rows = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(METRIC_PREFIXES) and not s.name.endswith(SKIP_SUFFIXES):
                rows.append(
                    {"t": t, "name": s.name, "labels": json.dumps(s.labels, sort_keys=True), "value": float(s.value)}
                )
    return rows


class Watchers:
    def __init__(
        self,
        base_url: str,
        writer_for: Callable[[str], PartWriter],
        headers: dict | None = None,
        health_interval: float = 0.25,
        metrics_interval: float = 1.0,
        max_seconds: float = 24 * 3600,
    ):
        url = URL(base_url)
        # a client of their own, so polls never queue behind load requests
        self.client = HTTPClient.from_url(url, concurrency=2, connection_timeout=1.0, network_timeout=2.0)
        self.headers = headers or {}
        self.health, self.metrics = writer_for("health"), writer_for("metrics")
        self.health_interval, self.metrics_interval = health_interval, metrics_interval
        self.deadline = time.time() + max_seconds
        self.observers: list = []  # live states shown each row as it is written: .on_health(row), .on_metric(row)
        self.metrics_available: bool | None = None
        self._greenlets: list[gevent.Greenlet] = []

    def _get(self, path: str) -> tuple[int | None, bytes, float, str | None]:
        t0 = time.perf_counter()
        try:
            r = self.client.get(path, headers=self.headers)
            body = r.read()
            return r.status_code, body, (time.perf_counter() - t0) * 1000, None
        except Exception as e:  # any failure to get an answer is the observation itself
            return None, b"", (time.perf_counter() - t0) * 1000, type(e).__name__

    def _health_loop(self) -> None:
        while time.time() < self.deadline:
            t = time.time()
            status, _, ms, err = self._get("/health")
            row = {"t": t, "ok": status == 200, "status": status, "latency_ms": ms, "error": err}
            self.health.add(row)
            self._show("on_health", row)
            gevent.sleep(max(0.0, self.health_interval - (time.time() - t)))  # poll period

    def _metrics_loop(self) -> None:
        while time.time() < self.deadline:
            t = time.time()
            status, body, _, _ = self._get("/metrics")
            if status == 200:
                try:
                    self.metrics_available = True
                    for row in parse_metrics(body.decode(errors="replace"), t):
                        self.metrics.add(row)
                        self._show("on_metric", row)
                except ValueError:
                    self.metrics_available = False
            elif status == 404:
                self.metrics_available = False
            self._flush()
            gevent.sleep(max(0.0, self.metrics_interval - (time.time() - t)))  # scrape period

    def _show(self, method: str, row: dict) -> None:
        for o in self.observers:
            try:
                getattr(o, method)(row)
            except Exception:  # a live display must never cost the watchers a row
                log.exception("mmchaos: %s of a live display", method)

    def _flush(self) -> None:
        self.health.flush()
        self.metrics.flush()

    def start(self) -> Watchers:
        self._greenlets = [gevent.spawn(self._health_loop), gevent.spawn(self._metrics_loop)]
        return self

    def stop(self) -> None:
        gevent.killall(self._greenlets)
        self.health.flush()
        self.metrics.flush()
        self.client.close()
