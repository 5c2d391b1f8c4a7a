"""A hunt case: a short program of requests against the live server, run as a Hypothesis state machine.

Each rule of :class:`CaseMachine` is an action a client or an operator takes, sent as soon as it is drawn, so the
next rule is drawn knowing what the server answered (Hypothesis's stateful testing):

- ``request``: a body of one of the routes the server lists (:mod:`.bodies`), minimal, with a
  parameter or two, or with any, on one of a few keep-alive sessions;
- ``hang_up``: a client that sends a body carrying an image and gives up after a few milliseconds, while the server
  is still processing it (its own connection, closed at the delay);
- ``reuse``: a body carrying an image of an earlier request that did not get its answer (an error status, a
  hang-up, no answer): the images a failure may have left half-known to the server, newest first;
- ``together``: two or three requests at once, on sessions of their own, sharing images;
- ``sweep``: the next points of the API's surface (:mod:`.surface`), text-only, one after the other;
- ``flood``: 9 to 32 text-only bodies at once, each on a connection of its own (the engine queues and chunks);
- ``edge``, ``off_schema``: a burst of text-only bodies at the schema's edges, valid or with one thing made wrong
  (:mod:`.negative`): cheap requests through the validation, tokenizing and refusal code image requests pass by;
- ``operate``: an operator action the server exposes (``/reset_mm_cache``; ``/sleep`` then ``/wake_up``,
  ``/pause`` then ``/resume``, each pair around a request).

Images come from the case, from the server's life (every image it was sent, until it restarts: :class:`Life`) or
are new (:mod:`.media`). What a case cannot know is the server's state: the server is shared
by the cases until one crashes it (its cache then holds what earlier cases sent, as a production server's does),
and a crash restarts it. Shrinking is the minimizer's, on fresh servers (:mod:`.hunt`): Hypothesis's own would
replay steps into a server whose state the first run changed.
"""

from __future__ import annotations

import copy
import functools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import requests
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from mmchaos import faults
from mmchaos.hang_up import hang_up
from mmchaos.payloads.pool import content_hash

from . import bodies, negative
from .media import DATA_URL, Media, media, renew, swap
from .surface import Surface

MAX_STEPS = 8  # rules a case runs at most
SESSIONS = 3  # keep-alive connections a case's requests go out on
HANG_UP_MS = (1.0, 2.0, 5.0, 10.0, 30.0, 100.0)  # short first: while the image is still being processed
TOGETHER = 3  # requests sent at once, at most
RULE_MAX = 2  # times a case runs one rule: Hypothesis repeats a drawn rule, and each repeat teaches less
ROUTE_MAX = 3  # steps of one route in a case, while the case has other routes left
SAME_MAX = 2  # times a case sends the very same request (a poison and its reuse are two requests)
WALKED_FROM = 3  # from this step on, a case does not begin with the shape another case began with (if it can)
EDGE_BURST = 8  # text-only requests an edge or off-schema rule sends one after the other, at most
FLOOD = (TOGETHER * 3, 32)  # text-only requests a flood sends at once, each on a connection of its own: more than the
# engine takes in one step's token budget once some are long, so it queues, chunks and batches them
SWEEP_BURST = 24  # points of the surface a sweep sends one after the other (each a text-only request)
BURST_MAX = max(EDGE_BURST, FLOOD[1], SWEEP_BURST)  # the most requests one rule sends
# an operator action sent with requests lands this long after them: at 0 before they are rendered, later while the
# engine holds them (a /pause then aborts them: measured on 0.32.0, docs/findings.md)
ACTION_DELAY_MS = (0.0, 10.0, 30.0, 60.0)
PAIRS = faults.UNDO  # an operator action and the one that undoes it
CONNECT_S = 5.0
# a request is left unanswered (a hang) once it waited this many times the slowest answer of the server's life, at
# least HANG_FLOOR_S, at most the --request-timeout: each wait costs the search its length (two of 60 s took two
# thirds of a 3-minute hunt on 0.30.0), and an answer that comes is far quicker than that on any model
HANG_FACTOR = 10
HANG_FLOOR_S = 15.0


@dataclass
class Step:
    session: int
    path: str
    body: dict | None  # None: an operator action
    hang_up_ms: float | None = None
    images: list[str] = field(default_factory=list)  # the hashes of the media it carries
    together: int | None = None  # steps with the same number were sent at once
    delay_ms: float | None = None  # of a step sent at once with others: sent this long after them (its schedule)
    swept: dict | None = None  # a point of the API's surface (the sweep rule's): what it sets on the simplest body


@dataclass
class Sent:
    step: int
    status: int | None
    text: str
    ms: float
    answer: object = None
    t: float = 0.0  # when it was sent: seconds since the server's life began (the hunt's clock)
    timed_out: bool = False  # no answer within the client's timeout (not a hang-up of ours)
    # sent after another request of this server's life went unanswered: it may be waiting behind that one, whatever
    # it carries, so its own silence says nothing of it
    behind: bool = False


@dataclass
class Case:
    steps: list[Step]

    def to_json(self) -> str:
        return json.dumps([asdict(s) for s in self.steps], separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Case:
        return cls([Step(**s) for s in json.loads(text)])


@dataclass
class Life:
    """What one server was sent, across cases, until it restarts: every image it saw, and the *suspects* (images
    of requests that did not get their answer: a failure after the image was processed leaves it half-known to the
    server), newest last."""

    seen: dict[str, Media] = field(default_factory=dict)
    suspects: list[str] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)
    # a crash met KNOWN_CRASH times already: no suspect is sent again (every one would cost a restart to meet it once
    # more); images the server answered stay to be sent again
    avoid_suspects: bool = False

    def saw(self, images: list[Media], answered: bool) -> None:
        for m in images:
            self.seen[m.hash] = m
            if not answered and m.damage == "none":  # a damaged image fails by itself: it says nothing of the cache
                if m.hash in self.suspects:
                    self.suspects.remove(m.hash)
                self.suspects.append(m.hash)


def _carried(body: object, images: dict[str, Media]) -> list[Media]:
    text = json.dumps(body)
    return [m for m in images.values() if m.url in text or m.uuid in text]


class Client:
    """Sends steps as a user's client would (``requests``, urllib3 underneath): a keep-alive connection per
    session; a hang-up on a connection of its own, closed at its delay."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float, life: Life):
        self.base_url, self.headers, self.timeout, self.life = base_url.rstrip("/"), headers, timeout, life
        self._sessions: dict[int, requests.Session] = {}
        self.slowest_s = 0.0  # the slowest answer of this server's life (a Client lives as long as its server)

    def wait_s(self) -> float:
        """How long a request may wait for its answer before it is left unanswered (a hang): HANG_FACTOR times the
        slowest answer so far, within [HANG_FLOOR_S, the client's timeout]."""
        return min(self.timeout, max(HANG_FLOOR_S, HANG_FACTOR * self.slowest_s))

    def close(self) -> None:
        for s in self._sessions.values():
            s.close()
        self._sessions.clear()

    def send(self, i: int, step: Step) -> Sent:
        t = time.monotonic() - self.life.t0
        t0 = time.monotonic()
        data = json.dumps(step.body if step.body is not None else {}, separators=(",", ":"), ensure_ascii=False)
        hdrs = {**self.headers, "Content-Type": "application/json", "X-Request-Id": f"hunt-{i + 1}"}
        if step.hang_up_ms is not None:
            status, text = self._hang_up(step.path, data.encode(), hdrs, step.hang_up_ms / 1000)
            return Sent(i, status, text, _ms(t0), None, t)
        http = self._sessions.setdefault(step.session, requests.Session())
        wait = self.wait_s()
        try:
            r = http.post(self.base_url + step.path, data=data.encode(), headers=hdrs, timeout=wait)
        except requests.RequestException as e:
            timed_out = isinstance(e, requests.Timeout) and not isinstance(e, requests.ConnectTimeout)
            why = f"no answer in {wait:g} s" if timed_out else f"no answer: {type(e).__name__}"
            return Sent(i, None, why, _ms(t0), None, t, timed_out)
        self.slowest_s = max(self.slowest_s, time.monotonic() - t0)
        answer = None
        if r.status_code == 200:
            try:
                answer = r.json()
            except ValueError:
                answer = r.text
        return Sent(i, r.status_code, r.text[:2000], _ms(t0), answer, t)

    def _hang_up(self, path: str, data: bytes, headers: dict, after: float) -> tuple[int | None, str]:
        """Send the whole request, wait ``after`` seconds for an answer, hang up: the server sees the client
        disconnect. An answer that came first is recorded as such."""
        got = hang_up(self.base_url, path, data, headers, after, connect_s=CONNECT_S)
        if got.status is not None:
            return got.status, f"answered before the hang-up: {got.text[:500]}"
        return None, f"client hung up after {after * 1000:g} ms" if got.hung_up else f"no answer: {got.text}"

    def send_together(self, indexed: list[tuple[int, Step]]) -> list[Sent]:
        out: dict[int, Sent] = {}

        def one(i: int, step: Step) -> None:
            if step.delay_ms:
                time.sleep(step.delay_ms / 1000)  # the step's schedule, not a synchronisation
            out[i] = self.send(i, step)

        threads = [threading.Thread(target=one, args=x, daemon=True) for x in indexed]
        for th in threads:
            th.start()
        for th in threads:
            th.join(self.timeout + CONNECT_S)
        return [out.get(i) or Sent(i, None, "not sent: its thread did not finish", 0.0) for i, _ in indexed]


class CaseOver(BaseException):
    """The server died during the case: its remaining steps are not sent. A BaseException, so that Hypothesis lets
    it through instead of replaying the case against a dead server."""


@dataclass
class Hooks:
    """What the hunt gives the machine: its client, the server's life, what a step may do afterwards (raise
    CaseOver when the server died), and what is done with a finished case."""

    client: Client
    life: Life
    after_step: Callable[[Sent], None]
    end_case: Callable[[Case, list[Sent]], object]  # what it returns is the hunt's own
    begin_case: Callable[[], None] = lambda: None  # may raise to stop the search (a spent budget)
    # what requests are sent as, given the case's earlier steps: the drawn ones, or (when a case began so before, or
    # they repeat a request the case sent SAME_MAX times) a variation of them; never a rejection, which Hypothesis
    # would see as the same choices drawing otherwise
    vary: Callable[[list[Step], list[Step]], list[Step]] = lambda steps, earlier: steps
    drawn: dict[str, int] = field(default_factory=dict)  # media drawn, by where from: fresh, seen, suspect
    # the routes to draw from, weighted by what each taught lately (corpus.Corpus.weighted); uniform by default
    weigh: Callable[[list], list] = lambda where: where
    surface: Surface = field(default_factory=Surface)  # the API's surface, swept by the cases in turn


def machine(forms: list[tuple[str, bodies.Form]], operators: list[str], hooks: Hooks) -> type[RuleBasedStateMachine]:
    """The state machine class of a hunt against a server whose API gives ``forms`` and ``operators``."""
    image_forms = [(p, f) for p, f in forms if f.takes_media] or forms
    singles = [p for p in operators if p not in PAIRS.values()]
    if not forms:
        raise ValueError("no body form to draw from")

    class CaseMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            hooks.begin_case()
            super().__init__()
            self.steps: list[Step] = []
            self.sent: list[Sent] = []
            self.groups = 0
            self.drawn: dict[str, Media] = {}  # the images drawn for the step being built
            self.rules_run: Counter[str] = Counter()

        # -- drawing ------------------------------------------------------------------------------------------
        def _images(self) -> st.SearchStrategy[Media]:
            """An image: new, or one this server was sent before (a suspect likelier)."""
            suspect, seen = _from_life(hooks.life, "suspects", hooks.drawn), _from_life(hooks.life, "seen", hooks.drawn)
            fresh = media().map(functools.partial(_count, hooks.drawn, "fresh"))
            # fresh first: the branch Hypothesis leans to when it draws simply (its first examples) is a new image
            return st.one_of(fresh, seen, suspect)

        def _body(self, data, where, images, depth, media_only=False) -> tuple[str, dict]:
            path, form = data.draw(_weighted(hooks, where, self.steps), label="route")
            return path, data.draw(form.bodies(images, depth, media_only), label="body")

        def _step(self, session: int, path: str, body: dict | None, **kw: Any) -> Step:
            carried = _carried(body, self.drawn) if body is not None else []
            self.drawn = {}
            return Step(session, path, body, images=[m.hash for m in carried], **kw)

        def _remember(self, images: st.SearchStrategy[Media]) -> st.SearchStrategy[Media]:
            """``images``, each drawn one kept for the step (its ``images``) and the server's life."""

            def keep(m: Media) -> Media:
                m = _unsuspected(hooks.life, m)
                self.drawn[m.hash] = m
                hooks.life.seen.setdefault(m.hash, m)
                return m

            return images.map(keep)

        # -- sending ------------------------------------------------------------------------------------------
        def _send(self, steps: list[Step]) -> None:
            first = len(self.steps)
            steps = hooks.vary(steps, self.steps)
            self.steps += steps
            indexed = list(enumerate(steps, first))
            sent = [hooks.client.send(*indexed[0])] if len(steps) == 1 else hooks.client.send_together(indexed)
            for step, s in zip(steps, sent):
                self.sent.append(s)
                carried = [hooks.life.seen[h] for h in step.images if h in hooks.life.seen]
                hooks.life.saw(carried, answered=s.status is not None and s.status < 400)
            for s in sent:
                hooks.after_step(s)

        # -- the rules ----------------------------------------------------------------------------------------
        @precondition(_left("request"))
        @rule(data=st.data(), depth=st.sampled_from(bodies.DEPTHS), session=st.integers(0, SESSIONS - 1))
        def request(self, data, depth, session):
            self.rules_run["request"] += 1
            path, body = self._body(data, forms, self._remember(self._images()), depth)
            self._send([self._step(session, path, body)])

        @precondition(_left("hang_up"))
        @rule(data=st.data(), ms=st.sampled_from(HANG_UP_MS))
        def hang_up(self, data, ms):
            self.rules_run["hang_up"] += 1
            images = self._remember(st.one_of(media(damaged=False), _from_life(hooks.life, "seen", hooks.drawn)))
            path, body = self._body(data, image_forms, images, bodies.MINIMAL, media_only=True)
            self._send([self._step(0, path, body, hang_up_ms=ms)])

        @precondition(_left("reuse"))
        @rule(data=st.data(), session=st.integers(0, SESSIONS - 1))
        def reuse(self, data, session):
            self.rules_run["reuse"] += 1
            images = self._remember(_from_life(hooks.life, "suspects", hooks.drawn))
            path, body = self._body(data, image_forms, images, bodies.MINIMAL, media_only=True)
            self._send([self._step(session, path, body)])

        @precondition(_left("together"))
        @rule(data=st.data(), n=st.integers(2, TOGETHER))
        def together(self, data, n):
            self.rules_run["together"] += 1
            self.groups += 1
            steps = []
            for k in range(n):
                path, body = self._body(data, forms, self._remember(self._images()), bodies.MINIMAL)
                steps.append(self._step(k % SESSIONS, path, body, together=self.groups))
            self._send(steps)

        def _edge_burst(self, data, n: int, session: int, off: bool, at_once: bool) -> None:
            """``n`` text-only bodies one after the other, or (``at_once``) all sent together: the engine then
            batches them, which one request at a time never makes it do."""
            group = None
            if at_once and n > 1:
                self.groups += 1
                group = self.groups
            steps: list[Step] = []
            for k in range(n):
                path, form = data.draw(_weighted(hooks, forms, self.steps + steps), label="route")
                body = data.draw(form.text_bodies(), label="body")
                if off:
                    body = data.draw(negative.off_schema(body, form.required), label="change")
                step = self._step(SESSIONS + k if group else session, path, body, together=group)
                if group is None:
                    self._send([step])
                else:
                    steps.append(step)
            if steps:
                self._send(steps)

        @precondition(lambda self: hooks.surface.left > 0 and _left("sweep")(self))
        @rule(session=st.integers(0, SESSIONS - 1))
        def sweep(self, session):
            self.rules_run["sweep"] += 1
            for point in hooks.surface.take(SWEEP_BURST):
                self._send([self._step(session, point.path, copy.deepcopy(point.body), swept=point.sets)])

        @precondition(_left("edge"))
        @rule(data=st.data(), n=st.integers(1, EDGE_BURST), session=st.integers(0, SESSIONS - 1), at_once=st.booleans())
        def edge(self, data, n, session, at_once):
            self.rules_run["edge"] += 1
            self._edge_burst(data, n, session, off=False, at_once=at_once)

        @precondition(_left("off_schema"))
        @rule(data=st.data(), n=st.integers(1, EDGE_BURST), session=st.integers(0, SESSIONS - 1), at_once=st.booleans())
        def off_schema(self, data, n, session, at_once):
            self.rules_run["off_schema"] += 1
            self._edge_burst(data, n, session, off=True, at_once=at_once)

        @precondition(_left("flood"))
        @rule(data=st.data(), n=st.integers(*FLOOD))
        def flood(self, data, n):
            self.rules_run["flood"] += 1
            self._edge_burst(data, n, 0, off=False, at_once=True)

        @precondition(lambda self: bool(singles) and _left("operate")(self))
        @rule(data=st.data(), alongside=st.integers(0, TOGETHER - 1), delay=st.sampled_from(ACTION_DELAY_MS))
        def operate(self, data, alongside, delay):
            self.rules_run["operate"] += 1
            action = data.draw(st.sampled_from(singles), label="operator action")
            if alongside:  # an operator acts on a server that is serving: requests in flight as the action lands
                self.groups += 1
                steps = [self._step(0, action, None, together=self.groups, delay_ms=delay or None)]
                # a request that lands after a /pause or /sleep waits for its undo: it hangs up as the one below does
                wait = HANG_UP_MS[-1] if action in PAIRS else None
                for k in range(alongside):
                    images = self._remember(self._images())
                    path, body = self._body(data, image_forms, images, bodies.MINIMAL, media_only=True)
                    steps.append(self._step(1 + k % (SESSIONS - 1), path, body, hang_up_ms=wait, together=self.groups))
                self._send(steps)
            else:
                self._send([self._step(0, action, None)])
            if action in PAIRS:  # a request while it holds, then the action that undoes it
                path, body = self._body(data, forms, self._remember(self._images()), bodies.MINIMAL)
                self._send([self._step(1, path, body, hang_up_ms=HANG_UP_MS[-1])])
                self._send([self._step(0, PAIRS[action], None)])

        def teardown(self) -> None:
            # an action left held (its rule cut short: Hypothesis ends an example whose draws ran past its budget)
            # is undone, or every later case would meet a paused or sleeping server
            actions = [s.path for s in self.steps if s.body is None]
            for held, undo in PAIRS.items():
                for _ in range(actions.count(held) - actions.count(undo)):
                    self._send([self._step(0, undo, None)])
            if self.steps:
                hooks.end_case(Case(self.steps), self.sent)

    return CaseMachine


def _left(rule: str) -> Callable[[Any], bool]:
    """A rule's precondition: the case ran it fewer than RULE_MAX times."""
    return lambda machine: machine.rules_run[rule] < RULE_MAX


def _count(drawn: dict[str, int], source: str, m: Media) -> Media:
    drawn[source] = drawn.get(source, 0) + 1
    return m


def _weighted(hooks: Hooks, where: list, earlier: list[Step]) -> st.SearchStrategy:
    """A route of ``where`` as the corpus weighs it now, but none the case sent ROUTE_MAX times already while
    another is left (Hypothesis copies a drawn step over the next ones, and the route that taught most early
    would keep drawing them). Drawn as the same choice whatever the weights (Hypothesis replays choices and
    insists they draw alike: a list whose length changed with the weights made it raise FlakyStrategyDefinition),
    then mapped onto the weighted list."""

    def pick(k: int):
        used = Counter(s.path for s in earlier)
        weighted = hooks.weigh([x for x in where if used[x[0]] < ROUTE_MAX] or where)
        return weighted[k % len(weighted)]

    return st.integers(0, 2**16).map(pick)


def _unsuspected(life: Life, m: Media) -> Media:
    """``m``; but once suspects are avoided, a new image in place of a suspect drawn as "new": Hypothesis draws its
    simplest image again and again (four hang-ups and a request of one image crashed a server avoiding suspects)."""
    if not life.avoid_suspects or m.hash not in life.suspects:
        return m
    return renew(m, len(life.seen))


def without_suspects(steps: list[Step], life: Life) -> list[Step]:
    """``steps``; but once suspects are avoided, each image a step carries that is a suspect of the server's life,
    or that a step before it in ``steps`` hung up on, swapped for an image the server never saw: mutations splice,
    repeat and move media (a hang-up, then its step sent again, met the known crash on such a server)."""
    if not life.avoid_suspects:
        return steps
    bad, out = set(life.suspects), []
    for s in steps:
        if s.body is not None and bad.intersection(s.images):
            text, images = json.dumps(s.body), list(s.images)
            urls = {content_hash(u.encode()): u for u in DATA_URL.findall(text)}  # a Media's hash is its URL's
            for h in [h for h in dict.fromkeys(images) if h in bad]:  # in order: a seed draws alike
                old = life.seen.get(h)
                url = urls.get(h) or (old.url if old else None)  # its data, or (a by-id part) the life's record
                if url is None:
                    continue
                new = renew(old, len(life.seen))
                life.seen[new.hash] = new
                text, images[images.index(h)] = swap(text, url, new.url), new.hash
            s = replace(s, body=json.loads(text), images=images)
        if s.hang_up_ms is not None:
            bad.update(s.images)
        out.append(s)
    return out


def _from_life(life: Life, which: str, drawn: dict[str, int] | None = None) -> st.SearchStrategy[Media]:
    """An image the server's life holds: a suspect (the newest in half the draws) or any image it was sent; a new
    one while it holds none. Drawn as the same choices whatever the life holds (Hypothesis replays choices and
    insists that they draw alike), then mapped onto what it holds now."""

    def pick(x: tuple[bool, int, Media]) -> Media:
        newest, k, new = x
        if life.avoid_suspects:
            hashes = [] if which == "suspects" else [h for h in life.seen if h not in set(life.suspects)]
        else:
            hashes = [h for h in life.suspects if h in life.seen] if which == "suspects" else list(life.seen)
        source = which if hashes else "fresh"
        if drawn is not None:
            drawn[source] = drawn.get(source, 0) + 1
        return life.seen[hashes[-1 if newest else k % len(hashes)]] if hashes else new

    return st.tuples(st.booleans(), st.integers(0, 2**16), media()).map(pick)


def replay(case: Case, client: Client) -> list[Sent]:
    """Send ``case`` again as it was sent: its steps in order, those sent together at once."""
    out: list[Sent] = []
    i = 0
    while i < len(case.steps):
        group = case.steps[i].together
        j = i + 1
        while group is not None and j < len(case.steps) and case.steps[j].together == group:
            j += 1
        indexed = list(enumerate(case.steps[i:j], i))
        out += [client.send(*indexed[0])] if len(indexed) == 1 else client.send_together(indexed)
        i = j
    return out


def _ms(t0: float) -> float:
    return (time.monotonic() - t0) * 1000
