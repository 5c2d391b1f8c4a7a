"""The wrong-answer oracle under load: a repeated input must get the answer it got the first time.

A sample of the inputs (``--consistency-sample``, by input key, so an input sampled once is sampled every time it
comes back) has its first answer kept; each later answer to it is compared with that one by the rules of
mmchaos/sameness.py (same input key; cosine at least ``sameness.COSINE_MIN``). The row of every checked answer
says so in its ``consistent`` column (null: not checked, or the input's first answer), and a wrong answer is a
failure in Locust's stats. One oracle per Locust process and run (its run state's: run_state.py); the first
answers kept are bounded (the oldest forgotten first).
"""

from __future__ import annotations

import json
from collections import OrderedDict

import numpy as np

from mmchaos import sameness

MAX_INPUTS = 4096  # first answers kept per process (an embedding each)
ANSWERED_PATHS = ("/v1/embeddings",)  # routes whose answers are embeddings (tokenize answers tokens)


class Oracle:
    def __init__(self, sample: float):
        self.sample = sample
        self.first: OrderedDict[str, np.ndarray] = OrderedDict()
        self.checked = self.wrong = 0

    def sampled(self, key: str) -> bool:
        """Whether ``key``'s answers are checked: the same answer for every request of that input."""
        return self.sample > 0 and int(key[:8], 16) < self.sample * 0x1_0000_0000

    def check(self, path: str, template: bytes, image_hashes, answer: str) -> tuple[bool | None, str | None]:
        """(consistent, why not) of an answer to the body ``template`` (its image slots named by their content
        ``image_hashes``): None when not checked or when it is its input's first answer."""
        if path not in ANSWERED_PATHS or self.sample <= 0:
            return None, None
        try:
            body = json.loads(template)
            keys = sameness.input_keys(path, body, image_hashes)
        except ValueError:
            return None, None
        picked = [i for i, k in enumerate(keys) if self.sampled(k)]
        if not picked:
            return None, None
        try:
            vectors = sameness.vectors(json.loads(answer), body)
        except (ValueError, TypeError, AttributeError):
            vectors = []
        if len(vectors) != len(keys):
            self.checked += 1
            self.wrong += 1
            return False, f"wrong answer: {len(vectors)} embeddings for {len(keys)} inputs"
        verdict = None
        why = None
        for i in picked:
            key, v = keys[i], vectors[i]
            first = self.first.get(key)
            if first is None:
                self.first[key] = v
                if len(self.first) > MAX_INPUTS:
                    self.first.popitem(last=False)
                continue
            self.first.move_to_end(key)
            if sameness.agree(first, v):
                verdict = True if verdict is None else verdict
            else:
                verdict = False
                why = (
                    why
                    or f"wrong answer: cosine {sameness.cosine(first, v):.4f} with this input's first answer "
                    f"(at least {sameness.COSINE_MIN} is the same answer)"
                )
        if verdict is not None:
            self.checked += 1
            self.wrong += verdict is False
        return verdict, why
