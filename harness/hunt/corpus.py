"""The hunt's corpus: the cases that taught it something, and new cases made from them.

A case joins the corpus when it reached lines of vLLM no case had reached (coverage.py), got a sequence of
(route, status) no case had got, or made a finding. Besides the cases Hypothesis draws afresh, the hunt sends a
share (``MUTATE_SHARE``) of *mutants*: a corpus case changed by one operator below, picked by a seeded random. The
operators act on what was sent (JSON bodies and their media), so a mutant keeps what made its parent interesting
and moves one step from it: a corpus of our own over Hypothesis's data rather than ``hypothesis.target()``, whose
score is one number per example, which cannot say "reached what nothing reached before" and which forgets at every
machine run (ours restart at every crash); and a mutant can splice two cases Hypothesis drew in different runs.

Routes are drawn by what they taught lately: a route's *gain* is the new lines of the cases that sent it (shared
among the case's routes), decayed at each case that sent it and taught nothing; a route with the most gain is drawn
up to ``GUIDE + 1`` times as often as one with none (:meth:`Corpus.weighted`), none ever left out.

No case is sent twice: :meth:`Corpus.novel` is asked before a mutant is sent and :meth:`Corpus.sent` records every
case (by the hash of its steps). Each case's *shape* (routes, media per request and which of them were sent before,
hang-ups, requests sent together, operator actions) is counted so a hunt can say how many distinct shapes it tried.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from copy import deepcopy
from dataclasses import replace

from mmchaos.payloads.pool import content_hash

from .cases import HANG_UP_MS, MAX_STEPS, Case, Step
from .media import DATA_URL, swap

MUTATE_SHARE = 0.3  # of the cases sent: mutants of corpus cases (the rest drawn afresh by Hypothesis)
GUIDE = 3  # the most gain weighs a route this many times more than none (below: weighted)
DECAY = 0.7  # a route's gain, each case that sent it and reached nothing new
MAX_ITEMS = 64  # media in one request a mutant grows to at most (the server's own limit refuses more: a finding too)


def case_hash(case: Case) -> str:
    return content_hash(case.to_json().encode())


def shape(case: Case) -> str:
    """What a case is made of, without its bytes: per step its route, how many media it carries (new / sent earlier
    in the case), a hang-up, a request sent together, an operator action."""
    seen: set[str] = set()
    parts = []
    for s in case.steps:
        if s.body is None:
            parts.append(f"op{s.path}")
            continue
        again = sum(1 for h in s.images if h in seen)
        seen.update(s.images)
        n = len(s.images)
        items = str(n) if n <= 8 else "9+" if n < 32 else "32+"
        parts.append(f"{s.path}:{items}m{again}r{'h' if s.hang_up_ms else ''}{'t' if s.together else ''}")
    return " ".join(parts)


class Corpus:
    def __init__(self, state: dict):
        # kept in the hunt's state.json: a re-run goes on with the same corpus and knows what it sent
        self.state = state
        state.setdefault("corpus", [])  # case numbers, in the order they joined
        state.setdefault("sent_hashes", [])
        state.setdefault("shapes", {})  # shape -> cases of it
        state.setdefault("outcomes", [])  # the (route, status) sequences met
        state.setdefault("route_gain", {})  # route -> new lines it brought lately (weighted)
        state.setdefault("retired", [])  # cases that crashed or made a mutant that crashed (parents)
        self._hashes = set(state["sent_hashes"])
        self._prefixes: Counter[str] = Counter()  # the shapes of the cases' beginnings, each length
        for sh, n in state["shapes"].items():
            self._walk(sh, n)
        self._outcomes = set(state["outcomes"])

    def novel(self, case: Case) -> bool:
        return case_hash(case) not in self._hashes

    def sent(self, case: Case) -> bool:
        """Record a case sent; whether it was new (a repeat is counted, never sent on purpose)."""
        h = case_hash(case)
        new = h not in self._hashes
        if new:
            self._hashes.add(h)
            self.state["sent_hashes"].append(h)
        sh = shape(case)
        self.state["shapes"][sh] = self.state["shapes"].get(sh, 0) + 1
        self._walk(sh, 1)
        return new

    def _walk(self, sh: str, n: int) -> None:
        parts = sh.split(" ")
        for k in range(1, len(parts) + 1):
            self._prefixes[" ".join(parts[:k])] += n

    def walked(self, steps: list[Step]) -> int:
        """How many cases sent began with the shape of ``steps``."""
        return self._prefixes[shape(Case(steps))]

    def consider(self, n: int, case: Case, statuses: list[int | None], new_lines: int | None, found: bool) -> bool:
        """Whether case ``n`` joins the corpus (and why it may: new lines, new outcomes, a finding)."""
        outcome = " ".join(f"{s.path}={st}" for s, st in zip(case.steps, statuses))
        fresh = outcome not in self._outcomes
        if fresh:
            self._outcomes.add(outcome)
            self.state["outcomes"].append(outcome)
        joins = bool(new_lines) or fresh or found
        if joins:
            self.state["corpus"].append(n)
        self._gain(case, new_lines or 0)
        return joins

    def _gain(self, case: Case, new_lines: int) -> None:
        gain = self.state["route_gain"]
        routes = {s.path for s in case.steps if s.body is not None}
        for r in routes:
            gain[r] = gain.get(r, 0.0) * (1.0 if new_lines else DECAY) + new_lines / len(routes)

    def weighted(self, where: list) -> list:
        """``where`` (pairs of a route and what to draw for it), each route repeated by its gain: what a uniform
        draw from the result picks as the guide says."""
        gain = self.state["route_gain"]
        best = max((gain.get(path, 0.0) for path, _ in where), default=0.0)
        if best <= 0:
            return where
        return [x for x in where for _ in range(1 + round(GUIDE * gain.get(x[0], 0.0) / best))]

    def retire(self, *cases: int) -> None:
        self.state["retired"].extend(n for n in cases if n not in self.state["retired"])

    def parents(self, crash_known: bool) -> list[int]:
        """The corpus cases a mutant may come from. Once a crash is known (the hunt's ``KNOWN_CRASH``), none that
        crashed or made a mutant that crashed: their mutants kept meeting it (5 restarts in 27 cases, each ~40 s)."""
        if not crash_known:
            return self.state["corpus"]
        retired = set(self.state["retired"])
        return [n for n in self.state["corpus"] if n not in retired]

    def distinct(self) -> tuple[int, int]:
        """(distinct shapes, cases sent)."""
        return len(self.state["shapes"]), sum(self.state["shapes"].values())


# -- mutation ----------------------------------------------------------------------------------------------------
def mutate(parent: Case, other: Case, rng: random.Random) -> tuple[Case, str]:
    """A new case one step from ``parent`` (``other``: a second corpus case, for splicing); and what was done."""
    ops = [_splice, _repeat_step, _hang_up, _swap_media, _together, _grow_items, _drop_step]
    for op in rng.sample(ops, len(ops)):
        got = op(deepcopy(parent), deepcopy(other), rng)
        if got is not None and got[0].steps and got[0].to_json() != parent.to_json():
            steps = got[0].steps[: MAX_STEPS * 3]
            return Case(steps), got[1]
    return Case([*deepcopy(parent.steps), *deepcopy(other.steps)][: MAX_STEPS * 3]), "append"


def _splice(a: Case, b: Case, rng: random.Random):
    if len(a.steps) < 1 or len(b.steps) < 1:
        return None
    i, j = rng.randrange(len(a.steps) + 1), rng.randrange(len(b.steps))
    return Case(_regroup(a.steps[:i] + b.steps[j:])), "splice"


def _repeat_step(a: Case, b: Case, rng: random.Random):
    media = [k for k, s in enumerate(a.steps) if s.body is not None]
    if not media:
        return None
    k = rng.choice(media)
    again = replace(deepcopy(a.steps[k]), hang_up_ms=None, together=None, delay_ms=None)
    return Case([*a.steps[: k + 1], again, *a.steps[k + 1 :]]), f"step {k + 1} sent again at once"


def _hang_up(a: Case, b: Case, rng: random.Random):
    media = [k for k, s in enumerate(a.steps) if s.body is not None and s.images]
    if not media:
        return None
    k = rng.choice(media)
    ms = None if a.steps[k].hang_up_ms is not None and rng.random() < 0.5 else rng.choice(HANG_UP_MS)
    a.steps[k] = replace(a.steps[k], hang_up_ms=ms)
    return a, f"step {k + 1} hung up after {ms} ms" if ms else f"step {k + 1} waited for"


def _swap_media(a: Case, b: Case, rng: random.Random):
    """A medium of one request put into another (of this case or of the other): the same image across routes."""
    donors = [u for s in a.steps + b.steps if s.body is not None for u in DATA_URL.findall(json.dumps(s.body))]
    takers = [k for k, s in enumerate(a.steps) if s.body is not None and DATA_URL.search(json.dumps(s.body))]
    if not donors or not takers:
        return None
    url = rng.choice(donors)
    k = rng.choice(takers)
    text = json.dumps(a.steps[k].body)
    old = rng.choice(DATA_URL.findall(text))
    if old == url:
        return None
    text = swap(text, old, url)
    known = _url_hashes(a, b)
    images = [known[u] for u in dict.fromkeys(DATA_URL.findall(text)) if u in known]
    a.steps[k] = replace(a.steps[k], body=json.loads(text), images=images)
    return a, f"step {k + 1} given a medium of another request"


def _together(a: Case, b: Case, rng: random.Random):
    if len(a.steps) < 2:
        return None
    k = rng.randrange(len(a.steps) - 1)
    group = max([s.together or 0 for s in a.steps]) + 1
    for i in (k, k + 1):
        a.steps[i] = replace(a.steps[i], together=group)
    a.steps = _regroup(a.steps)
    return a, f"steps {k + 1} and {k + 2} sent at once"


def _grow_items(a: Case, b: Case, rng: random.Random):
    """A request's media parts repeated up to many items (its own items again: a conversation that repeats them)."""
    media = [k for k, s in enumerate(a.steps) if s.body is not None and DATA_URL.search(json.dumps(s.body))]
    if not media:
        return None
    k = rng.choice(media)
    n = rng.choice((2, 4, 8, 16, 32, MAX_ITEMS))
    body, grown = _grow(a.steps[k].body, n)
    if not grown:
        return None
    a.steps[k] = replace(a.steps[k], body=body)
    return a, f"step {k + 1}'s media repeated to {grown} items"


def _drop_step(a: Case, b: Case, rng: random.Random):
    if len(a.steps) < 2:
        return None
    k = rng.randrange(len(a.steps))
    return Case(_regroup(a.steps[:k] + a.steps[k + 1 :])), f"step {k + 1} left out"


def _grow(body, n: int):
    """``body`` with the first list of content parts holding a medium grown to ``n`` media parts; (body, items)."""
    if isinstance(body, dict):
        for key, v in body.items():
            if key == "content" and isinstance(v, list):
                parts = [p for p in v if isinstance(p, dict) and DATA_URL.search(json.dumps(p))]
                if parts:
                    grown = [parts[i % len(parts)] for i in range(n)]
                    rest = [p for p in v if p not in parts]
                    return {**body, key: grown + rest}, n
            got, items = _grow(v, n)
            if items:
                return {**body, key: got}, items
    if isinstance(body, list):
        for i, v in enumerate(body):
            got, items = _grow(v, n)
            if items:
                return [*body[:i], got, *body[i + 1 :]], items
    return body, 0


def _url_hashes(*cases: Case) -> dict[str, str]:
    """data URL -> the hash a step recorded for it, from the steps that carry one medium (unambiguous)."""
    out: dict[str, str] = {}
    for c in cases:
        for s in c.steps:
            urls = set(DATA_URL.findall(json.dumps(s.body))) if s.body is not None else set()
            if len(urls) == 1 and len(s.images) == 1:
                out[urls.pop()] = s.images[0]
    return out


def _regroup(steps: list[Step]) -> list[Step]:
    """Groups sent together only where their steps still stand side by side (replay sends a run of one group at
    once), numbered afresh."""
    out: list[Step] = []
    n = 0
    for i, s in enumerate(steps):
        if s.together is None:
            out.append(s)
            continue
        if i == 0 or steps[i - 1].together != s.together:
            n += 1
        out.append(replace(s, together=n))
    return out
