"""A hunt case: a short program of requests, drawn by Hypothesis, and how it is sent.

A case is a few steps over a few sessions. Each step is a request to one of the pooling routes the server lists
(its body from the route's schema, :mod:`mmchaos.payloads.hunt_bodies`), a client that hangs up after a chosen
delay, or an operator action the server exposes. Images are drawn from the case's own bundle: a step sends a new
image or one an earlier step sent, on any route, so reuse across requests, forms and routes is what the search
explores. Sessions run at once, each on its own keep-alive connection (``requests``, urllib3 underneath, as a
user's client); a hang-up gets a connection of its own, closed after its delay.

Why data-driven generation rather than a RuleBasedStateMachine: a machine runs each rule as it is drawn, one after
the other, and the concurrency of sessions is part of what a case is; so a case is drawn whole (each step seeing
what the earlier ones drew), then sent. Shrinking is the minimizer's, on fresh servers (:mod:`.hunt`).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field

import requests
from hypothesis import strategies as st

from mmchaos.payloads import api_schema, hunt_bodies
from mmchaos.payloads.hunt_media import Media, media

MAX_STEPS = 6
SESSIONS = 3
HANG_UP_MS = (1.0, 5.0, 20.0, 80.0, 300.0)  # while the image is fetched, rendered, encoded, or answered


@dataclass
class Step:
    session: int
    path: str
    body: dict | None  # None: an operator action
    hang_up_ms: float | None = None
    images: list[str] = field(default_factory=list)  # the hashes of the media it carries


@dataclass
class Sent:
    step: int
    status: int | None
    text: str
    ms: float
    answer: object = None


@dataclass
class Case:
    steps: list[Step]

    def to_json(self) -> str:
        return json.dumps([asdict(s) for s in self.steps], separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Case:
        return cls([Step(**s) for s in json.loads(text)])


def _carried(body: object, images: dict[str, Media]) -> list[str]:
    text = json.dumps(body)
    return [h for h, m in images.items() if m.url in text]


def cases(
    api: dict[str, api_schema.Route], model: str, operators: list[str], skipped=lambda route, name: None
) -> st.SearchStrategy[Case]:
    """Cases against a server whose API is ``api`` (its pooling routes) and ``operators`` (its operator actions)."""
    forms = [
        (path, hunt_bodies.form(f, model, lambda name, p=path: skipped(p, name)))
        for path, route in sorted(api.items())
        for f in api_schema.variants(route.request)
    ]

    @st.composite
    def draw(take) -> Case:
        bundle: dict[str, Media] = {}

        @st.composite
        def image(take2) -> Media:  # one sent before in this case, or a new one
            if bundle and take2(st.booleans()):
                return bundle[take2(st.sampled_from(sorted(bundle)))]
            m = take2(media())
            bundle[m.hash] = m
            return m

        steps = []
        for _ in range(take(st.integers(1, MAX_STEPS))):
            session = take(st.integers(0, SESSIONS - 1))
            if operators and take(st.integers(0, 9)) == 9:  # Hypothesis starts from 0: requests first
                steps.append(Step(session, take(st.sampled_from(operators)), None))
                continue
            path, f = take(st.sampled_from(forms))
            body = take(f.bodies(image()))
            hang_up = take(st.none() | st.none() | st.none() | st.sampled_from(HANG_UP_MS))
            steps.append(Step(session, path, body, hang_up, _carried(body, bundle)))
        return Case(steps)

    return draw()


def send(case: Case, base_url: str, headers: dict[str, str], timeout: float) -> list[Sent]:
    """Send ``case``: its sessions at once, each step of a session after the one before."""
    results: list[Sent | None] = [None] * len(case.steps)
    by_session: dict[int, list[int]] = {}
    for i, s in enumerate(case.steps):
        by_session.setdefault(s.session, []).append(i)

    def session(indices: list[int]) -> None:
        with requests.Session() as http:
            for i in indices:
                results[i] = _send_one(http, i, case.steps[i], base_url, headers, timeout)

    threads = [threading.Thread(target=session, args=(ix,), daemon=True) for ix in by_session.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout * len(case.steps) + 5)
    return [r or Sent(i, None, "not sent: the session did not finish", 0.0) for i, r in enumerate(results)]


def _send_one(
    http: requests.Session, i: int, step: Step, base_url: str, headers: dict[str, str], timeout: float
) -> Sent:
    url = base_url.rstrip("/") + step.path
    t0 = time.monotonic()
    data = json.dumps(step.body if step.body is not None else {}, separators=(",", ":"), ensure_ascii=False)
    hdrs = {**headers, "Content-Type": "application/json", "X-Request-Id": f"hunt-{i + 1}"}
    try:
        if step.hang_up_ms is not None:  # a client that gives up: its own connection, closed at the delay
            with requests.Session() as own:
                own.post(url, data=data.encode(), headers=hdrs, timeout=step.hang_up_ms / 1000)
            r = None
        else:
            r = http.post(url, data=data.encode(), headers=hdrs, timeout=timeout)
    except requests.Timeout:
        return Sent(i, None, f"client hung up after {step.hang_up_ms or timeout} ms", _ms(t0))
    except requests.RequestException as e:
        return Sent(i, None, f"no answer: {type(e).__name__}", _ms(t0))
    if r is None:
        return Sent(i, None, "answered before the hang-up", _ms(t0))
    answer = None
    if r.status_code == 200:
        try:
            answer = r.json()
        except ValueError:
            answer = r.text
    return Sent(i, r.status_code, r.text[:2000], _ms(t0), answer)


def _ms(t0: float) -> float:
    return (time.monotonic() - t0) * 1000
