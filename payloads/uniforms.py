"""Uniform random numbers one at a time, drawn from a numpy Generator in blocks.

A user draws a handful of numbers per request (its kind, its images, its text, its format); each call into a
Generator costs ~1-5 us of argument handling, while a block of 256 costs about as much as one. The sequence is
still fixed by the seed alone, so a run stays reproducible.
"""

from __future__ import annotations

import numpy as np

BLOCK = 256


class Uniforms:
    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self._block: list[float] = []

    def random(self) -> float:
        """The next uniform in [0, 1)."""
        if not self._block:
            self._block = self.rng.random(BLOCK).tolist()
            self._block.reverse()  # pop() from the end hands them out in the order drawn
        return self._block.pop()

    def index(self, n: int) -> int:
        """A uniform index in range(n)."""
        return min(int(self.random() * n), n - 1)
