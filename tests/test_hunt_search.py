"""The hunt's compass and corpus without vLLM: coverage measured in another interpreter by the engines' own
sitecustomize (a stand-in `vllm` package), read back case by case; mutants of corpus cases; shapes and repeats."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap

import pytest

from mmchaos.harness.hunt import corpus as hunt_corpus
from mmchaos.harness.hunt.cases import Case, Step
from mmchaos.harness.hunt.coverage import EngineCoverage
from mmchaos.harness.servers.server import ENGINE_SITE

pytestmark = pytest.mark.integration


def _package(root):
    """A stand-in `vllm` with a module per area, each function its own lines."""
    for area in ("multimodal", "entrypoints"):
        (root / "vllm" / area).mkdir(parents=True)
        (root / "vllm" / area / "__init__.py").write_text("")
        (root / "vllm" / area / "work.py").write_text(
            textwrap.dedent(
                """
                def one():
                    x = 1
                    return x

                def two():
                    y = 2
                    y += 1
                    return y
                """
            )
        )
    (root / "vllm" / "__init__.py").write_text("")


SERVER = """
import sys
import vllm.multimodal.work as m, vllm.entrypoints.work as e
for line in sys.stdin:
    {"m1": m.one, "m2": m.two, "e1": e.one}[line.strip()]()
    print("done", flush=True)
"""


def test_coverage_is_measured_in_the_engines_interpreter_and_read_case_by_case(tmp_path):
    _package(tmp_path / "pkg")
    cov = EngineCoverage(tmp_path / "cov")
    env = {**os.environ, **cov.env(), "PYTHONPATH": os.pathsep.join([str(ENGINE_SITE), str(tmp_path / "pkg")])}
    p = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:

        def case(n: int, call: str) -> int:
            p.stdin.write(call + "\n")
            p.stdin.flush()
            assert p.stdout.readline().strip() == "done"
            return cov.new_lines(n, [p.pid])

        assert cov.started([p.pid])  # the process answered: imports and module lines are the start's
        startup = len(cov.startup)
        assert case(1, "m1") == 2  # the body of one(): its two lines
        assert case(2, "m1") == 0  # nothing new the second time
        assert case(3, "m2") == 3
        assert case(4, "e1") == 2
    finally:
        p.stdin.close()
        p.wait(timeout=30)
    areas = cov.by_area()
    assert areas["multimodal/"]["by_cases"] == 5 and areas["entrypoints/ (pooling, serving, OpenAI)"]["by_cases"] == 2
    assert areas["all of vLLM"]["in_all"] == startup + 7
    assert cov.curve == [(1, 2), (2, 2), (3, 5), (4, 7)]
    assert not cov.unavailable()


def test_a_server_that_does_not_measure_leaves_the_hunt_blind(tmp_path):
    cov = EngineCoverage(tmp_path / "cov")
    cov.env()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # no sitecustomize of ours
    try:
        assert not cov.started([p.pid])
    finally:
        p.kill()
        p.wait()


IMG = "data:image/png;base64,QUFB"
IMG2 = "data:image/png;base64,QkJC"


def _step(url=IMG, path="/v1/embeddings", **kw) -> Step:
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}
    return Step(0, path, body, images=["h1" if url == IMG else "h2"], **kw)


def test_mutants_differ_from_their_parent_and_each_says_how():
    a = Case([_step(), _step(IMG2, "/pooling"), Step(0, "/reset_mm_cache", None)])
    b = Case([_step(IMG2, "/v2/embed", hang_up_ms=2.0)])
    rng = random.Random(0)
    hows = set()
    for _ in range(60):
        m, how = hunt_corpus.mutate(a, b, rng)
        assert m.to_json() != a.to_json() and m.steps, how
        hows.add(how.split(" ")[0])
        groups = [s.together for s in m.steps if s.together is not None]
        assert groups == sorted(groups)  # sent-together groups numbered in order, each a run of neighbours
    assert {"splice", "step"} <= hows  # several operators were drawn


def test_growing_a_requests_media_repeats_its_items():
    body, n = hunt_corpus._grow(_step().body, 16)
    parts = body["messages"][0]["content"]
    assert n == 16 and len(parts) == 16 and all(p["image_url"]["url"] == IMG for p in parts)


def test_shapes_and_repeats_are_counted():
    state: dict = {}
    c = hunt_corpus.Corpus(state)
    one, two = Case([_step(), _step()]), Case([_step(), _step(IMG2)])
    assert c.sent(one) and not c.sent(one) and c.sent(two)
    assert hunt_corpus.shape(one) == "/v1/embeddings:1m0r /v1/embeddings:1m1r"
    assert c.distinct() == (2, 3)
    assert c.consider(1, one, [200, 200], 5, False) and not c.consider(2, one, [200, 200], 0, False)
    assert c.consider(3, one, [200, 503], 0, False)  # a new outcome joins
    assert json.loads(json.dumps(state))["corpus"] == [1, 3]  # what state.json keeps


def test_routes_that_reached_new_lines_are_drawn_more_and_none_is_left_out():
    c = hunt_corpus.Corpus({})
    where = [("/v1/embeddings", "f1"), ("/pooling", "f2"), ("/score", "f3")]
    assert c.weighted(where) == where  # nothing learnt yet: uniform
    c.consider(1, Case([_step(), _step(IMG2, "/pooling")]), [200, 200], 40, False)
    c.consider(2, Case([_step(IMG2, "/pooling")]), [200], 60, False)
    weights = {path: sum(1 for p, _ in c.weighted(where) if p == path) for path, _ in where}
    assert weights["/pooling"] == 1 + hunt_corpus.GUIDE and 1 < weights["/v1/embeddings"] < weights["/pooling"]
    assert weights["/score"] == 1  # never drawn yet: still drawn
    for n in range(3, 8):  # cases on /pooling that teach nothing: its weight falls below /v1/embeddings's
        c.consider(n, Case([_step(IMG2, "/pooling"), _step(IMG2, "/pooling")]), [200, 400], 0, False)
    weights = {path: sum(1 for p, _ in c.weighted(where) if p == path) for path, _ in where}
    assert weights["/v1/embeddings"] == 1 + hunt_corpus.GUIDE > weights["/pooling"]


def test_off_schema_bodies_change_one_thing_and_stay_small():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from mmchaos.harness.hunt import bodies, negative

    schema = {
        "type": "object",
        "properties": {
            "model": {"type": "string"},
            "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "dimensions": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        },
        "required": ["input"],
    }
    form = bodies.form(schema, "m")
    changed: list[str] = []

    @settings(max_examples=80, database=None, deadline=None)
    @given(st.data())
    def check(data):
        body = data.draw(form.text_bodies())
        assert "input" in body and "data:" not in json.dumps(body)  # text only
        off = data.draw(negative.off_schema(body, form.required))
        diff = {k for k in body.keys() | off.keys() if body.get(k, ...) != off.get(k, ...)}
        assert len(diff) <= 1 and len(json.dumps(off)) < 2_000_000, diff
        changed.extend(diff)

    check()
    assert {"input", "model"} <= set(changed)  # dropped or retyped prompts, other models' names


def _drawn_from(life) -> list[str]:
    """The images 40 draws of a suspect and of a seen image take from ``life``."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from mmchaos.harness.hunt import cases

    got: list[str] = []

    @settings(max_examples=40, database=None, deadline=None)
    @given(st.data())
    def draw(data):
        got.append(data.draw(cases._from_life(life, "suspects")).hash)
        got.append(data.draw(cases._from_life(life, "seen")).hash)

    draw()
    return got


def test_once_a_crash_is_known_no_suspect_is_drawn_and_answered_images_still_are():
    from mmchaos.harness.hunt import cases
    from mmchaos.harness.hunt.media import Media

    ok, failed = (Media(f"data:image/png;base64,{x}", x, "none", "PNG", 1, 1, "image") for x in ("b2s=", "ZmFpbA=="))
    lives = []
    for avoid in (False, True):
        life = cases.Life(avoid_suspects=avoid)
        life.saw([ok], answered=True)
        life.saw([failed], answered=False)
        lives.append(_drawn_from(life))
    assert failed.hash in lives[0]
    assert failed.hash not in lives[1] and ok.hash in lives[1]


def test_once_a_crash_is_known_no_mutant_comes_from_a_case_that_crashed_or_made_one_that_did():
    state: dict = {}
    c = hunt_corpus.Corpus(state)
    for n in (1, 2, 3, 4):
        c.consider(n, Case([Step(0, f"/r{n}", {"input": "x"})]), [200], 10, False)
    c.retire(2)  # it crashed
    c.retire(3, 2)  # a mutant of 3 and 2 crashed
    assert c.parents(crash_known=False) == [1, 2, 3, 4]
    assert c.parents(crash_known=True) == [1, 4]
    assert hunt_corpus.Corpus(state).parents(crash_known=True) == [1, 4]  # kept in the hunt's state


def test_once_a_crash_is_known_a_suspect_drawn_as_new_is_replaced_by_an_image_the_server_never_saw():
    from mmchaos.harness.hunt import cases
    from mmchaos.harness.hunt.media import make

    simplest = make("PNG", 16, 16, 0, "none")  # what Hypothesis draws first, again and again
    for avoid in (False, True):
        life = cases.Life(avoid_suspects=avoid)
        life.saw([simplest], answered=False)
        got = cases._unsuspected(life, simplest)
        if not avoid:
            assert got is simplest
        else:
            assert got.hash not in life.seen and (got.format, got.width, got.height) == ("PNG", 16, 16)


def test_once_a_crash_is_known_no_step_carries_a_suspect_nor_an_image_a_step_before_it_hung_up_on():
    """Mutations splice, repeat and move media: a hang-up then its step sent again met the known crash."""
    from mmchaos.harness.hunt import cases
    from mmchaos.harness.hunt.media import make

    old, kept = make("PNG", 16, 16, 1, "none"), make("PNG", 16, 16, 2, "none")

    def step(m, hang_up=None):
        body = {"model": "m", "messages": [{"role": "user", "content": [m.part]}]}
        return Step(0, "/pooling", body, hang_up_ms=hang_up, images=[m.hash])

    fresh = make("PNG", 16, 16, 3, "none")
    steps = [step(old), step(fresh, hang_up=1.0), step(fresh), step(kept)]
    for avoid in (False, True):
        life = cases.Life(avoid_suspects=avoid)
        life.saw([old], answered=False)
        life.saw([kept], answered=True)
        got = cases.without_suspects(steps, life)
        if not avoid:
            assert got == steps
            continue
        assert got[0].images != [old.hash] and old.url not in json.dumps(got[0].body)  # a suspect of the life
        assert got[1] == steps[1] and got[2].images != [fresh.hash]  # the image a step before hung up on
        assert got[3] == steps[3]  # an image the server answered
        assert all(life.seen[h].url in json.dumps(s.body) for s in (got[0], got[2]) for h in s.images)
