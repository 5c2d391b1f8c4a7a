"""Open-loop arrivals: when requests are due, whoever is free to send them.

A run with a rate (``--rate R``, ``[workload] rate``) sends requests at the times of an arrival process, not as fast
as its users get answers: ``poisson`` (exponential gaps, what independent callers make), ``constant`` (a gap of
exactly 1/R) or ``gamma`` (gamma gaps of mean 1/R and shape ``burstiness``: below 1 burstier than Poisson, above 1
smoother; 1 is Poisson), as vLLM's ``bench serve --request-rate R --burstiness B`` draws them.

The process is one sequence for the whole run, drawn from the run's seed. With several Locust processes each takes
every L-th arrival (its lane of L): the lanes together are exactly that one sequence, whatever the process.

Also the rules a run is judged on: what contradicts a rate (one phrase each, for the CLI, the web form and
campaign files alike), and when the asked rate counts as held (requests sent over requests due).
"""

from __future__ import annotations

import bisect
import math

import numpy as np

ARRIVALS = ("poisson", "constant", "gamma")
DEFAULT_MIN_RATE_RATIO = 0.95  # the gate's default: 95 % of the requests due were sent
BEHIND_S, BEHIND_MIN = 1.0, 5  # behind(): a second of arrivals due and not sent, and at least 5
AUTO_MAX_CONCURRENCY = 1000  # the pool sized for the rate grows to this at most (--max-concurrency sets another cap)
_BLOCK = 1024  # gaps drawn at once
_SEED_TAG = 0xA771  # the arrivals' own stream of the run's seed: the mix's draws do not move them

# buckets of the schedule lag (ms) for live counts that workers add up: the upper edge is what a percentile says
LAG_EDGES_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, math.inf)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def problem(
    rate: float, arrival: str, burstiness: float, max_concurrency: int, shape: str, flag=_flag
) -> tuple[str, str] | None:
    """Why these open-loop settings cannot run together: (the setting at fault, one phrase naming settings by
    ``flag(name)``: Locust's flags by default, a campaign file's keys with ``flag=str``), or None. ``rate`` 0
    means closed loop (no rate given)."""
    rate_f, arr, burst, cap, shape_f = (flag(n) for n in ("rate", "arrival", "burstiness", "max_concurrency", "shape"))
    if not rate >= 0 or not math.isfinite(rate):
        return "rate", f"{rate_f} must be more than 0 requests per second, not {rate:g}"
    if arrival not in ARRIVALS:
        return "arrival", f"{arr} must be one of {', '.join(ARRIVALS)}, not {arrival!r}"
    if not burstiness > 0 or not math.isfinite(burstiness):
        return "burstiness", f"{burst} must be more than 0, not {burstiness:g}"
    if max_concurrency < 0:
        return "max_concurrency", f"{cap} must be 0 (sized for the rate) or more, not {max_concurrency}"
    if rate == 0:
        if max_concurrency:
            return "max_concurrency", f"{cap} caps an open-loop run: give {rate_f} too"
        if arrival != "poisson" or burstiness != 1:
            return (
                "arrival" if arrival != "poisson" else "burstiness",
                f"{arr} and {burst} shape the arrivals of {rate_f}: give {rate_f} too",
            )
        return None
    if burstiness != 1 and arrival != "gamma":
        return "burstiness", f"{burst} is the shape of {arr} gamma; with {arr} {arrival} leave it out"
    if shape != "steady":
        return "shape", (
            f"{shape_f} {shape} varies the number of users, which {rate_f} sizes itself: use "
            f"{shape_f} steady with {rate_f} (or leave {rate_f} out)"
        )
    return None


class Lane:
    """This process's arrivals: times in seconds from the run's start, in order (every ``lanes``-th arrival of the
    run's one sequence, from the ``lane``-th)."""

    def __init__(
        self, rate: float, arrival: str, burstiness: float = 1.0, seed: int = 1, lane: int = 0, lanes: int = 1
    ):
        why = problem(rate, arrival, burstiness, 0, "steady")
        if why or rate <= 0:
            raise ValueError(why[1] if why else "a lane needs a rate")
        if not 0 <= lane < lanes:
            raise ValueError(f"lane {lane} of {lanes}")
        self.rate, self.arrival, self.burstiness = rate, arrival, burstiness
        self.lane, self.lanes = lane, lanes
        self.rng = np.random.default_rng([seed, _SEED_TAG])
        self._t = 0.0  # the time of the last arrival drawn (of any lane)
        self._n = 0  # arrivals drawn (of any lane)
        self._mine: list[float] = []
        self._i = 0

    def _gaps(self, n: int) -> np.ndarray:
        if self.arrival == "constant":
            return np.full(n, 1.0 / self.rate)
        if self.arrival == "poisson":
            return self.rng.exponential(1.0 / self.rate, n)
        return self.rng.gamma(self.burstiness, 1.0 / (self.rate * self.burstiness), n)

    def _draw(self) -> None:
        times = self._t + np.cumsum(self._gaps(_BLOCK))
        first = (self.lane - self._n) % self.lanes  # the index in this block of this lane's next arrival
        self._mine = times[first :: self.lanes].tolist()
        self._i = 0
        self._t, self._n = float(times[-1]), self._n + _BLOCK

    def peek(self) -> float:
        while self._i >= len(self._mine):
            self._draw()
        return self._mine[self._i]

    def pop(self) -> float:
        t = self.peek()
        self._i += 1
        return t


class LagCounts:
    """Schedule lags (ms) counted in LAG_EDGES_MS buckets: added up across processes, read as percentiles."""

    def __init__(self, counts: list[int] | None = None):
        self.counts = list(counts) if counts else [0] * len(LAG_EDGES_MS)

    def add(self, lag_ms: float) -> None:
        self.counts[bisect.bisect_left(LAG_EDGES_MS, lag_ms)] += 1

    def merge(self, counts: list[int]) -> None:
        for i, n in enumerate(counts[: len(self.counts)]):
            self.counts[i] += int(n)

    @property
    def total(self) -> int:
        return sum(self.counts)

    def percentile(self, q: float) -> float | None:
        """The upper edge of the bucket holding the q-quantile (at most this many ms), or None when empty."""
        total = self.total
        if not total:
            return None
        seen = 0
        for edge, n in zip(LAG_EDGES_MS, self.counts):
            seen += n
            if seen >= q * total:
                return edge
        return LAG_EDGES_MS[-1]


def behind(backlog: int, rate: float) -> bool:
    """Whether arrivals due and not sent are more than a second of the rate (and a few): the generator is not
    holding it, and says so while it runs, not only at its end."""
    return backlog >= max(BEHIND_S * rate, BEHIND_MIN)


def held(sent: int, due: int) -> float | None:
    """The share of the requests due that were sent (late ones included): achieved rate / asked rate."""
    return min(1.0, sent / due) if due else None


def pool_size(rate: float, latency_s: float | None, current: int, cap: int, backlog: int = 0) -> int:
    """How many Locust users an open-loop run needs (they are its concurrency): by Little's law the requests in
    flight are rate x latency; twice that covers the bursts of a Poisson process. Arrivals already due and not
    sent (``backlog``: every user was busy) need a user each, whatever the latency says (answers that have not come
    yet say nothing). The pool never shrinks (a user stopped mid-request would cut it). Before any answer, enough
    for a tenth of a second of arrivals."""
    want = math.ceil(rate * (latency_s if latency_s is not None else 0.05) * 2) + 4
    if backlog > 0:
        want = max(want, current + backlog)
    return max(current, min(cap, want))
