"""The reuse model: which image the next request carries.

A share ``fresh_fraction`` of draws is a never-repeated image (the caller turns the drawn pool index into
``pool.fresh(index, token)``); the rest pick a pool image with Zipf popularity: pool index ``k`` (0-based)
has weight ``1 / (k + 1) ** zipf_s``. So index 0 is the hottest image, ``zipf_s = 0`` is uniform, and larger
``zipf_s`` concentrates traffic on a smaller hot set.

Why it matters: the P0/P1 multimodal caches are LRUs, so whether a poisoned entry is hit again, and whether
the two caches' eviction orders drift apart, depends on how many distinct images the traffic touches
compared with what the cache holds. :meth:`ReuseModel.expected_distinct` gives that number for N draws.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np


class Draw(NamedTuple):
    pool_index: int  # for a fresh draw: the pool image the fresh one is derived from
    fresh: bool


@dataclass(frozen=True)
class ReuseModel:
    pool_size: int
    zipf_s: float = 1.0
    fresh_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {self.pool_size}")
        if not self.zipf_s >= 0:
            raise ValueError(f"zipf_s must be >= 0 (0 = uniform), got {self.zipf_s}")
        if not 0.0 <= self.fresh_fraction <= 1.0:
            raise ValueError(f"fresh_fraction must be in [0, 1], got {self.fresh_fraction}")

    @cached_property
    def probabilities(self) -> np.ndarray:
        """P(pool index k | not fresh), decreasing in k."""
        w = 1.0 / np.arange(1, self.pool_size + 1, dtype=np.float64) ** self.zipf_s
        return w / w.sum()

    @cached_property
    def _cdf(self) -> np.ndarray:
        cdf = np.cumsum(self.probabilities)
        cdf[-1] = 1.0  # guard the last bucket against rounding
        return cdf

    @cached_property
    def _cdf_list(self) -> list[float]:
        return self._cdf.tolist()

    def top_share(self, k: int) -> float:
        """Share of pool (non-fresh) draws that land on the ``k`` hottest images."""
        return float(self.probabilities[: max(0, k)].sum())

    def expected_distinct(self, n_draws: int) -> float:
        """Expected number of distinct images among ``n_draws`` independent draws (fresh ones included: each
        is distinct). Exact: sum_k 1 - (1 - q_k)^N over pool images, plus fresh_fraction * N."""
        if n_draws <= 0:
            return 0.0
        q = (1.0 - self.fresh_fraction) * self.probabilities
        # log1p/expm1 keep precision when q is tiny and N is large
        pool_part = -np.expm1(n_draws * np.log1p(-np.minimum(q, 1.0 - 1e-16))).sum()
        return float(pool_part + self.fresh_fraction * n_draws)

    def sampler(self, seed: int | np.random.SeedSequence | None = None) -> ReuseSampler:
        return ReuseSampler(self, seed)

    def simulate_distinct(self, n_draws: int, trials: int = 20, seed: int = 0) -> tuple[float, float]:
        """(mean, std) of the distinct-image count over ``trials`` simulated runs of ``n_draws``."""
        counts = []
        for t in range(trials):
            idx, fresh = self.sampler(np.random.SeedSequence([seed, t])).draw_many(n_draws)
            counts.append(len(np.unique(idx[~fresh])) + int(fresh.sum()))
        return float(np.mean(counts)), float(np.std(counts))


class ReuseSampler:
    """Draws from a :class:`ReuseModel` with its own numpy Generator (one per Locust user: seed it from the
    run seed and the user id so runs are reproducible)."""

    def __init__(self, model: ReuseModel, seed: int | np.random.SeedSequence | None = None):
        self.model = model
        self.rng = np.random.default_rng(seed)

    def draw(self) -> Draw:
        m = self.model
        # always consume the same number of random values, so a run's sequence does not depend on outcomes
        u_fresh, u_pick = self.rng.random(2).tolist()
        fresh = u_fresh < m.fresh_fraction
        if fresh:
            return Draw(int(u_pick * m.pool_size), True)  # fresh images inherit a uniform base
        # bisect on a list: np.searchsorted(side="right")'s answer without numpy's per-call cost
        return Draw(min(bisect.bisect_right(m._cdf_list, u_pick), m.pool_size - 1), False)

    def draw_many(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` draws at once: (pool indices, fresh mask). Same distribution as :meth:`draw`."""
        m = self.model
        u = self.rng.random((n, 2))
        fresh = u[:, 0] < m.fresh_fraction
        idx = np.searchsorted(m._cdf, u[:, 1], side="right")
        idx[fresh] = (u[fresh, 1] * m.pool_size).astype(np.int64)
        return np.minimum(idx, m.pool_size - 1), fresh
