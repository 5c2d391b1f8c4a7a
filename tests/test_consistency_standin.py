"""The wrong-answer oracle under load (issue 25 item 6), on the stand-in: a server that answers a repeated image
with another embedding is caught (rows, the gate, the verdict); one that answers the same is not. The real
engines' answers are checked in test_ground_truth_engine.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import standin_server
from locust_run import locust, only, rows
from test_campaign_standin import run, write_campaign

from mmchaos import sameness
from mmchaos.analysis.results import load_results
from mmchaos.analysis.verdict import verdicts
from mmchaos.locustfiles.plugin.consistency import Oracle

MIX = [
    *only(valid_image=4, multi_image=1, text=1),
    "--fresh-fraction",
    "0",
    "--consistency-sample",
    "1",
    "--max-requests",
    "150",
]


@pytest.mark.integration
def test_a_server_that_answers_a_repeated_image_wrongly_fails_the_gate(tmp_path):
    with standin_server(tmp_path / "s.log", "--wrong-on-repeat") as s:
        r = locust("locustfiles/embeddings.py", s.base_url, tmp_path, *MIX, users=2, seconds=60)
    df = rows(tmp_path)
    checked = df["consistent"].dropna()
    assert r.returncode == 1 and "gate failed: wrong answers to repeated inputs" in r.stdout, r.stdout[-2000:]
    assert (~checked.astype(bool)).sum() > 10, df["consistent"].value_counts(dropna=False)
    wrong = df[df["consistent"] == False]  # noqa: E712  (a nullable column)
    assert (wrong["outcome"] == "ok").all() and wrong["error"].str.startswith("wrong answer: cosine").all()
    assert set(wrong["kind"]) <= {"valid_image", "multi_image", "batch", "document"}  # texts it answers the same
    locust_stats = json.loads((tmp_path / "locust.json").read_text())
    assert sum(e["num_failures"] for e in locust_stats) >= len(wrong)  # a failure in Locust's stats too


@pytest.mark.integration
def test_a_server_that_answers_the_same_passes(tmp_path):
    with standin_server(tmp_path / "s.log") as s:
        r = locust("locustfiles/embeddings.py", s.base_url, tmp_path, *MIX, users=2, seconds=60)
    df = rows(tmp_path)
    assert r.returncode == 0, r.stdout[-2000:]
    assert df["consistent"].dropna().astype(bool).all() and df["consistent"].notna().sum() > 50


@pytest.mark.integration
def test_a_wrong_answer_makes_the_configuration_fail(tmp_path):
    f = write_campaign(
        tmp_path,
        duration=120,  # only a hung trial reaches it: each ends at its budget
        max_requests=150,
        configs=[{"name": "same"}, {"name": "wrong", "flags": ["--wrong-on-repeat"]}],
        options={"pool_size": 4, "fresh_fraction": 0.0, "consistency_sample": 1.0},
        mix={"malformed_pre": 0, "malformed_post": 0, "abort": 0},
    )
    run(f, tmp_path / "results")
    v = verdicts(load_results(tmp_path / "results" / "standin")).set_index("config")
    assert v.loc["wrong", "verdict"] == "fails" and v.loc["wrong", "same_answer"] == "failed", v.loc[
        "wrong", "evidence"
    ]
    assert v.loc["same", "same_answer"] == "ok" and v.loc["same", "verdict"] != "fails", v.loc["same", "evidence"]


def _answer(*vectors):
    return json.dumps({"data": [{"index": i, "embedding": list(map(float, v))} for i, v in enumerate(vectors)]})


def test_the_oracle_compares_each_input_with_its_first_answer():
    o = Oracle(1.0)
    body = json.dumps({"model": "m", "input": ["a", "b"]}).encode()
    a, b = np.eye(4)[0], np.eye(4)[1]
    assert o.check("/v1/embeddings", body, [], _answer(a, b)) == (None, None)  # first answers: kept
    assert o.check("/v1/embeddings", body, [], _answer(a, b * 1.0001)) == (True, None)
    ok, why = o.check("/v1/embeddings", body, [], _answer(a, a))  # b's answer is a's: wrong
    assert ok is False and "cosine 0.0000" in why
    # the same input alone, in another request, is compared with the same first answer
    assert o.check("/v1/embeddings", json.dumps({"model": "m", "input": "b"}).encode(), [], _answer(b))[0] is True
    assert o.check("/v1/embeddings", body, [], _answer(a))[0] is False  # one answer for two inputs
    assert o.check("/tokenize", body, [], "{}") == (None, None)  # not an embedding
    assert (o.checked, o.wrong) == (4, 2)


def test_inputs_are_sampled_by_input_so_a_sampled_input_is_checked_every_time():
    o = Oracle(0.25)
    keys = [sameness.input_key("/v1/embeddings", {"model": "m", "input": f"t{i}"}) for i in range(2000)]
    picked = [o.sampled(k) for k in keys]
    assert 0.2 < np.mean(picked) < 0.3 and picked == [o.sampled(k) for k in keys]
    assert not any(Oracle(0).sampled(k) for k in keys)
