"""Open-loop arrivals on Locust's own machinery (``--rate``; the rules are mmchaos.arrivals').

The Locust users of an open-loop run are its concurrency: each free user claims the next arrival of this process's
lane of the arrival process and waits for its time in ``wait_time`` (so Locust stops it at once while it waits),
then sends. A user still busy when its arrival is due leaves the arrival to the next user that is free: that
request goes out late, and its row says by how much (``sched_lag_ms``, from ``t_sched``), so coordinated omission is
visible instead of hidden. The shape (shapes.py) sizes the users for the rate by Little's law, up to
``--max-concurrency``.

With Locust's master and workers, the master lists its workers in lane order at the start (``--arrival-lanes``,
sent to them with its options) and each takes every L-th arrival of the one sequence.
"""

from __future__ import annotations

import logging
import time

from locust.runners import MasterRunner, WorkerRunner

from mmchaos import arrivals

log = logging.getLogger("mmchaos")


class Pacer:
    """This process's arrivals: ``claim()`` gives the next one's epoch time; ``due()`` counts those whose time has
    come (up to the stop)."""

    def __init__(
        self, rate: float, arrival: str, burstiness: float, seed: int, lane: int = 0, lanes: int = 1, clock=time.time
    ):
        self.clock = clock
        self._claims = arrivals.Lane(rate, arrival, burstiness, seed, lane, lanes)
        self._dues = arrivals.Lane(rate, arrival, burstiness, seed, lane, lanes)  # the same times, counted apart
        self.t0: float | None = None  # the lane's start: its first claim (after the pool and users are made)
        self.stopped_at: float | None = None
        self._due = 0

    def claim(self) -> float:
        if self.t0 is None:
            self.t0 = self.clock()
        return self.t0 + self._claims.pop()

    def stop(self) -> None:
        if self.stopped_at is None:
            self.stopped_at = self.clock()

    def due(self) -> int:
        if self.t0 is None:
            return 0
        until = (self.stopped_at if self.stopped_at is not None else self.clock()) - self.t0
        while self._dues.peek() <= until:
            self._dues.pop()
            self._due += 1
        return self._due


def pacer(environment) -> Pacer | None:
    """The pacer of this process's current run, in its run state (None: closed loop, or the master, which sends
    nothing)."""
    state = getattr(environment, "mmchaos", None)
    return state.pacer if state is not None else None


def lanes_of(runner) -> list[str]:
    """A master's workers in lane order: by Locust's worker index, as they were when the run started."""
    clients = [*runner.clients.ready, *runner.clients.running, *runner.clients.spawning]
    return [c.id for c in sorted(clients, key=lambda c: runner.get_worker_index(c.id))]


def test_start(environment) -> None:
    """At the start of a run: the master lists the lanes; a process that sends makes its pacer."""
    o = environment.parsed_options
    runner = environment.runner
    state = environment.mmchaos
    state.pacer = None
    if o is None or not getattr(o, "rate", 0):
        return
    if isinstance(runner, MasterRunner):
        o.arrival_lanes = ",".join(lanes_of(runner))
        return
    lane, lanes = 0, 1
    if isinstance(runner, WorkerRunner):
        order = [c for c in o.arrival_lanes.split(",") if c]
        if runner.client_id not in order:
            # joined after the start: the arrivals are the other workers' lanes already
            log.warning("mmchaos: this worker joined the open-loop run after its start: it sends nothing")
            return
        lane, lanes = order.index(runner.client_id), len(order)
    state.pacer = Pacer(o.rate, o.arrival, o.burstiness, o.seed, lane, lanes)


def test_stopping(environment, **_) -> None:
    p = pacer(environment)
    if p is not None:
        p.stop()  # arrivals after the stop are not due: the run ended, not the generator


def summary(rate: float, arrival: str, sent: int, due: int, lags: arrivals.LagCounts) -> str:
    """The line a run ends with: asked, achieved, how late."""
    ratio = arrivals.held(sent, due)
    p50, p99 = lags.percentile(0.5), lags.percentile(0.99)
    lag = f"schedule lag p50 <= {p50:g} ms, p99 <= {p99:g} ms" if p99 is not None else "no request sent"
    held = f"{ratio:.1%}" if ratio is not None else "n/a"
    return f"open loop: asked {rate:g} req/s ({arrival}); sent {sent} of the {due} requests due ({held}); {lag}"
