"""Open-loop arrivals, in the test process: the arrival processes (statistical tests with a fixed seed, bounded by
counts), their lanes, what contradicts a rate, the lag counts, the pool sizing and the rate gate."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from mmchaos import arrivals
from mmchaos.locustfiles.plugin import gates
from mmchaos.verdict_rule import Counts

N = 20_000  # arrivals per statistical test


def times(rate, arrival, burstiness=1.0, seed=7, lane=0, lanes=1, n=N):
    lane_ = arrivals.Lane(rate, arrival, burstiness, seed, lane, lanes)
    return np.array([lane_.pop() for _ in range(n)])


def test_poisson_gaps_are_exponential_at_the_rate():
    gaps = np.diff(times(50.0, "poisson"), prepend=0.0)
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.03)
    assert stats.kstest(gaps, "expon", args=(0, 1 / 50)).pvalue > 0.01


def test_constant_gaps_are_exactly_one_over_the_rate():
    t = times(40.0, "constant", n=1000)
    assert np.allclose(np.diff(t), 1 / 40) and t[0] == pytest.approx(1 / 40)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_gaps_have_the_rate_and_the_burstiness_as_shape(burstiness):
    gaps = np.diff(times(20.0, "gamma", burstiness), prepend=0.0)
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.05)
    # the coefficient of variation of gamma gaps is 1 / sqrt(shape): burstier below 1, smoother above
    assert gaps.std() / gaps.mean() == pytest.approx(burstiness**-0.5, rel=0.06)
    assert stats.kstest(gaps, "gamma", args=(burstiness, 0, 1 / (20 * burstiness))).pvalue > 0.01


@pytest.mark.parametrize("arrival", arrivals.ARRIVALS)
def test_lanes_together_are_exactly_the_one_sequence(arrival):
    whole = times(30.0, arrival, 0.5 if arrival == "gamma" else 1.0, n=3000)
    lanes = [times(30.0, arrival, 0.5 if arrival == "gamma" else 1.0, lane=i, lanes=3, n=1000) for i in range(3)]
    assert np.array_equal(np.sort(np.concatenate(lanes)), whole)


def test_the_seed_decides_the_schedule():
    assert np.array_equal(times(10.0, "poisson", seed=3, n=50), times(10.0, "poisson", seed=3, n=50))
    assert not np.array_equal(times(10.0, "poisson", seed=3, n=50), times(10.0, "poisson", seed=4, n=50))


@pytest.mark.parametrize(
    "args, at_fault, phrase",
    [
        ((-1.0, "poisson", 1.0, 0, "steady"), "rate", "--rate must be more than 0"),
        ((float("inf"), "poisson", 1.0, 0, "steady"), "rate", "--rate must be more than 0"),
        ((5.0, "zipf", 1.0, 0, "steady"), "arrival", "--arrival must be one of poisson, constant, gamma"),
        ((5.0, "gamma", 0.0, 0, "steady"), "burstiness", "--burstiness must be more than 0"),
        ((5.0, "poisson", 0.5, 0, "steady"), "burstiness", "--burstiness is the shape of --arrival gamma"),
        ((5.0, "poisson", 1.0, -1, "steady"), "max_concurrency", "--max-concurrency must be 0"),
        ((5.0, "poisson", 1.0, 0, "ramp"), "shape", "--shape ramp varies the number of users"),
        ((0.0, "poisson", 1.0, 4, "steady"), "max_concurrency", "--max-concurrency caps an open-loop run"),
        ((0.0, "constant", 1.0, 0, "steady"), "arrival", "give --rate too"),
    ],
)
def test_what_contradicts_a_rate(args, at_fault, phrase):
    key, why = arrivals.problem(*args)
    assert key == at_fault and phrase in why and "\n" not in why


def test_good_settings_have_no_problem_and_files_get_their_own_words():
    assert arrivals.problem(5.0, "gamma", 0.5, 8, "steady") is None
    assert arrivals.problem(0.0, "poisson", 1.0, 0, "spike") is None  # closed loop: any shape
    assert arrivals.problem(5.0, "poisson", 1.0, 0, "soak", flag=str)[1].startswith("shape soak varies")


def test_lag_counts_add_up_across_processes_and_read_as_percentiles():
    a, b = arrivals.LagCounts(), arrivals.LagCounts()
    for lag in [0.3] * 98 + [40.0]:
        a.add(lag)
    b.add(3000.0)
    a.merge(b.counts)
    assert a.total == 100
    assert a.percentile(0.5) == 1 and a.percentile(0.99) == 50 and a.percentile(1.0) == 5000
    assert arrivals.LagCounts().percentile(0.5) is None


def test_held_is_the_share_sent_of_those_due():
    assert arrivals.held(95, 100) == 0.95 and arrivals.held(0, 0) is None and arrivals.held(3, 2) == 1.0


def test_behind_is_more_than_a_second_of_arrivals_due_and_not_sent():
    assert not arrivals.behind(49, 50) and arrivals.behind(50, 50)
    assert not arrivals.behind(4, 0.5) and arrivals.behind(5, 0.5)  # a slow rate: a few arrivals, not a fraction


def test_the_pool_is_sized_by_littles_law_and_never_shrinks():
    assert arrivals.pool_size(100.0, None, 0, 1000) == 14  # before any answer: a tenth of a second of arrivals
    assert arrivals.pool_size(100.0, 0.5, 14, 1000) == 104  # 100/s x 0.5 s in flight, twice for bursts, + 4
    assert arrivals.pool_size(100.0, 0.01, 104, 1000) == 104
    assert arrivals.pool_size(1000.0, 5.0, 0, 300) == 300


def test_the_rate_gate_fails_when_too_few_of_the_requests_due_were_sent():
    o = SimpleNamespace(max_crashes=0, max_server_error_ratio=1, max_p95_ms=0, rate=50.0, min_rate_ratio=0.95)
    [_, held] = gates.evaluate(o, Counts(), 0, None, rate_held=0.62)
    assert held.state == gates.FAILED and held.text == (
        "requests sent of those due at --rate 50 62.0% < --min-rate-ratio 95.0%"
    )
    assert gates.evaluate(o, Counts(), 0, None, rate_held=0.99)[1].state == gates.PASSED
    assert gates.evaluate(o, Counts(), 0, None, rate_held=None)[1].state == gates.NOT_CHECKED
    closed = SimpleNamespace(**{**vars(o), "rate": 0.0})
    assert len(gates.evaluate(closed, Counts(), 0, None)) == 1  # closed loop: no rate gate


def test_arrivals_waiting_for_a_user_each_get_one():
    assert arrivals.pool_size(10.0, None, 5, 1000, backlog=30) == 35  # no answer yet: the backlog says it all
    assert arrivals.pool_size(10.0, 0.05, 995, 1000, backlog=30) == 1000
