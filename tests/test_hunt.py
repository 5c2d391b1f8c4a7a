"""The hunt's parts without a real server: the API read from a schema, bodies drawn from it, the log oracles, the
wrong-answer oracle, and its one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict

import pytest
from cli_inprocess import mmchaos
from conftest import TESTS, standin_server
from hypothesis import given, settings
from hypothesis import strategies as st
from standin_server import OPENAPI as STANDIN_OPENAPI

from mmchaos.harness.hunt import api_schema
from mmchaos.harness.hunt import bodies as hunt_bodies
from mmchaos.harness.hunt import cases as hunt_cases
from mmchaos.harness.hunt import media as hunt_media
from mmchaos.harness.hunt import oracles as hunt_oracles
from mmchaos.harness.hunt import versions as hunt_versions
from mmchaos.signatures import Signatures

# the stand-in's schema (the chat form of /v1/embeddings), with an operator action and a route the hunt never sends
OPENAPI = {
    **STANDIN_OPENAPI,
    "paths": {
        **STANDIN_OPENAPI["paths"],
        "/reset_mm_cache": {"post": {}},
        "/v1/chat/completions": {"post": {}},  # not a pooling route: never sent
    },
}


def test_routes_come_from_the_servers_schema_with_references_resolved():
    api = api_schema.routes(OPENAPI)
    assert list(api) == ["/v1/embeddings"]
    form = api_schema.variants(api["/v1/embeddings"].request)[0]
    assert form["title"] == "EmbeddingChatRequest" and "dimensions" in form["properties"]
    assert api["/v1/embeddings"].response["required"] == ["data"]
    assert api_schema.operator_routes(OPENAPI) == ["/reset_mm_cache"]


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_bodies_follow_the_schema_and_carry_images(data):
    form = api_schema.variants(api_schema.routes(OPENAPI)["/v1/embeddings"].request)[0]
    body = data.draw(hunt_bodies.form(form, "m").bodies(hunt_media.media()))
    assert body["model"] == "m" and isinstance(body["messages"], list)
    assert set(body) <= {"model", "messages", "dimensions", "encoding_format"}
    if "encoding_format" in body:
        assert body["encoding_format"] in ("float", "base64")
    if body.get("dimensions") is not None:
        assert isinstance(body["dimensions"], int)


class _Server:
    """A client that answers as a server might, without one: a hang-up gets no answer, a body with ``dimensions``
    a 400, anything else a 200."""

    def __init__(self):
        self.sent: list[hunt_cases.Step] = []

    def send(self, i, step):
        self.sent.append(step)
        if step.hang_up_ms is not None:
            return hunt_cases.Sent(i, None, "client hung up", 1.0)
        status = 400 if step.body and step.body.get("dimensions") is not None else 200
        return hunt_cases.Sent(i, status, "", 1.0)

    def send_together(self, indexed):
        return [self.send(i, step) for i, step in indexed]


def _machine_run(examples: int, seed: int = 0, operators=("/reset_mm_cache",)):
    from hypothesis import seed as seed_of

    from mmchaos.harness.hunt.search import run_cases

    server, cases, life = _Server(), [], hunt_cases.Life()
    forms = [("/v1/embeddings", hunt_bodies.form(f, "m")) for f in api_schema.variants(OPENAPI_ROUTES.request)]
    hooks = hunt_cases.Hooks(server, life, lambda sent: None, lambda case, sent: cases.append((case, sent)))
    machine = seed_of(seed)(hunt_cases.machine(forms, list(operators), hooks))
    run_cases(machine, examples)  # the hunt's own settings, not a copy
    return server, cases, life


OPENAPI_ROUTES = api_schema.routes(OPENAPI)["/v1/embeddings"]


def test_cases_are_programs_of_the_servers_routes_and_its_operator_actions():
    server, cases, _ = _machine_run(30)
    assert len(cases) >= 30 and server.sent  # examples Hypothesis ran: at least those asked for
    for case, sent in cases:
        assert 1 <= len(case.steps) <= hunt_cases.MAX_STEPS * hunt_cases.BURST_MAX  # a rule sends a burst at most
        assert all(s.path in ("/v1/embeddings", "/reset_mm_cache") for s in case.steps)
        assert [x.step for x in sent] == list(range(len(case.steps)))
        assert hunt_cases.Case.from_json(case.to_json()).to_json() == case.to_json()
    # a client that hangs up always sends an image (it is what a hang-up can leave half-known to the server)
    hang_ups = [s for c, _ in cases for s in c.steps if s.hang_up_ms is not None]
    assert hang_ups and all(s.images for s in hang_ups)


def test_an_operator_acts_while_requests_are_in_flight_and_undoes_a_pause():
    """Measured on 0.32.0 (docs/findings.md): a /pause that lands while a pooling request is in the engine kills
    the server. So an operator action is also sent together with requests that carry images, and a /pause or
    /sleep is always followed by its undo (a request sent into a pause hangs up rather than wait for it)."""
    _, cases, _ = _machine_run(60, operators=api_schema.OPERATOR_ROUTES)
    beside = [  # per case: a case numbers its groups of steps sent together
        s
        for c, _ in cases
        for s in c.steps
        if s.body is not None and any(a.body is None and a.together == s.together is not None for a in c.steps)
    ]
    assert beside and all(s.images for s in beside)
    for c, _ in cases:
        actions = [s.path for s in c.steps if s.body is None]
        for held, undo in hunt_cases.PAIRS.items():
            assert actions.count(held) == actions.count(undo), actions
        for s in c.steps:  # a request sent with a /pause or /sleep in flight does not wait for its undo
            if s.together is not None and any(a.path in hunt_cases.PAIRS and a.together == s.together for a in c.steps):
                assert s.body is None or s.hang_up_ms is not None


def test_an_image_whose_request_failed_is_sent_again_in_the_servers_life():
    """The search follows its own failures: an image of a request that got no answer or an error status comes back
    in a later request of the same server, across cases."""
    server, _cases, life = _machine_run(30)
    failed: set[str] = set()
    followed = 0
    for step in server.sent:
        if failed & set(step.images) and step.hang_up_ms is None:
            followed += 1
        if step.hang_up_ms is not None or (step.body and step.body.get("dimensions") is not None):
            failed |= set(step.images)
    assert life.suspects and followed >= 3, (len(life.suspects), followed)


ASSERT_LOG = """\
(APIServer pid=1) ERROR 12-03 11:43:23 [a.py:1] Traceback (most recent call last):
(APIServer pid=1) ERROR 12-03 11:43:23 [a.py:1]   File "/s/vllm/v1/engine/async_llm.py", line 800, in output_handler
(APIServer pid=1) ERROR 12-03 11:43:23 [a.py:1]     assert req_state.detokenizer is not None
(APIServer pid=1) ERROR 12-03 11:43:23 [a.py:1] AssertionError
"""
UNKNOWN_LOG = """\
(APIServer pid=1) ERROR:    Exception in ASGI application
(APIServer pid=1) Traceback (most recent call last):
(APIServer pid=1)   File "/s/vllm/multimodal/processing/processor.py", line 1589, in _matched_updates_from_result
(APIServer pid=1)     assert update_idx is not None, (
(APIServer pid=1) AssertionError: Failed to apply prompt replacement for mm_items['image'][0]
(EngineCore pid=7) ERROR 12-03 11:43:23 [c.py:1] Traceback (most recent call last):
(EngineCore pid=7) ERROR 12-03 11:43:23 [c.py:1]   File "/s/vllm/v1/engine/core.py", line 10, in step
(EngineCore pid=7) ERROR 12-03 11:43:23 [c.py:1]     self.run()
(EngineCore pid=7) ERROR 12-03 11:43:23 [c.py:1]   File "/s/vllm/multimodal/cache/shm.py", line 99, in get
(EngineCore pid=7) ERROR 12-03 11:43:23 [c.py:1]     assert addr is not None
(EngineCore pid=7) ERROR 12-03 11:43:23 [c.py:1] KeyError: 'abc'
(APIServer pid=1) INFO 12-03 11:43:24 [api_server.py:1] 127.0.0.1 - "POST /v1/embeddings HTTP/1.1" 200 OK
"""


def test_an_error_the_table_names_is_no_unknown_signature():
    assert hunt_oracles.log_errors(ASSERT_LOG.splitlines(), Signatures.load()) == []


def test_an_unknown_traceback_is_named_by_its_exception_process_and_innermost_vllm_frame():
    asgi, e = hunt_oracles.log_errors(UNKNOWN_LOG.splitlines(), Signatures.load())
    # the error line heading a traceback is part of it, not an error of its own
    assert asgi.exception == "AssertionError" and asgi.lines[0].endswith("Exception in ASGI application")
    assert (
        asgi.fingerprint == "unknown_signature|APIServer|AssertionError|"
        "vllm/multimodal/processing/processor.py:_matched_updates_from_result"
    )
    assert e.exception == "KeyError" and e.process == "EngineCore"
    assert e.frames[-1] == "vllm/multimodal/cache/shm.py:get"
    assert e.fingerprint == (
        "unknown_signature|EngineCore|KeyError|vllm/v1/engine/core.py:step|vllm/multimodal/cache/shm.py:get"
    )


# vLLM 0.32.0 with VLLM_SERVER_DEV_MODE=1 (--log-error-stack on): every refused request is logged at ERROR, a
# validation error with its traceback, each of whose lines is an ERROR line of its own (blank ones too)
P = "(APIServer pid=30487) ERROR 12-06 05:33:03"
REFUSALS_LOG = f"""\
{P} [exception.py:16] Exception caught. Request id: None
INFO:     127.0.0.1:60930 - "POST /v1/score HTTP/1.1" 400 Bad Request
{P} [validation.py:151] RequestValidationError caught. Request id: None
{P} [validation.py:151] Traceback (most recent call last):
{P} [validation.py:151]   File "/x/site-packages/fastapi/routing.py", line 723, in app
{P} [validation.py:151]     raise validation_error
{P} [validation.py:151]                ^^^^^^^^^^^^^^^^
{P} [validation.py:151] fastapi.exceptions.RequestValidationError: 1 validation error:
{P} [validation.py:151]   {{'type': 'list_type', 'loc': ('body', 'inputs'), 'msg': 'Input should be a valid list'}}
{P} [validation.py:151]{" "}
{P} [validation.py:151]   File "/x/vllm/entrypoints/serve/utils/api_utils.py", line 46, in create_cohere_embedding
{P} [validation.py:151]     POST /v2/embed
{P} [http.py:18] HTTPException caught. Request id: None
"""


def test_a_servers_logged_refusals_and_their_traceback_lines_are_no_unknown_signature():
    assert hunt_oracles.log_errors(REFUSALS_LOG.splitlines(), Signatures.load()) == []
    # and a traceback of its own after them is still found, once
    [e] = hunt_oracles.log_errors((REFUSALS_LOG + UNKNOWN_LOG).splitlines(), Signatures.load())[:1]
    assert e.exception == "AssertionError"


def test_five_hundreds_are_findings_and_the_drift_answer_is_the_lower_class():
    sigs = Signatures.load()
    assert hunt_oracles.status_finding("/score", 400, "bad", sigs) is None
    oracle, fp, _ = hunt_oracles.status_finding("/score", 500, '{"error":{"type":"InternalServerError"}}', sigs)
    assert (oracle, fp) == ("server_error", "server_error|500|InternalServerError|")
    # one bug met on two routes is one finding: the answer's error, its numbers left out, is the fingerprint
    bomb = '{"error":{"message":"Image size (%d pixels) exceeds limit","type":"InternalServerError"}}'
    a = hunt_oracles.status_finding("/pooling", 500, bomb % 3600000000, sigs)
    b = hunt_oracles.status_finding("/v1/embeddings", 500, bomb % 40000, sigs)
    assert a[1] == b[1] == "server_error|500|InternalServerError|Image size (N pixels) exceeds limit"
    drift = '{"error":{"message":"Multi-modal cache miss ... P0/P1 cache drift; returning a retryable response"}}'
    assert hunt_oracles.status_finding("/v1/embeddings", 503, drift, sigs)[0] == "drift"


def test_a_huge_header_png_claims_its_size_with_a_valid_checksum():
    import base64
    import io

    from PIL import Image

    m = hunt_media.make("PNG", 16, 16, 1, "huge_header")
    data = base64.b64decode(m.url.split(",", 1)[1])
    Image.MAX_IMAGE_PIXELS, saved = None, Image.MAX_IMAGE_PIXELS
    try:
        assert Image.open(io.BytesIO(data)).size == (hunt_media.HUGE_SIDE, hunt_media.HUGE_SIDE)
    finally:
        Image.MAX_IMAGE_PIXELS = saved


def test_the_wrong_answer_oracle_sees_a_changed_answer_and_a_collapse():
    img = hunt_media.make("PNG", 16, 16, 1, "none").url
    other = hunt_media.make("PNG", 16, 16, 2, "none").url
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": img}}]}]}
    body2 = json.loads(json.dumps(body).replace(img, other))
    answers = hunt_oracles.Answers()
    assert answers.check("/v1/embeddings", body, {"data": [{"index": 0, "embedding": [1.0, 0.0, 0.0]}]}) == []
    assert answers.check("/v1/embeddings", body, {"data": [{"index": 0, "embedding": [1.0, 0.001, 0.0]}]}) == []
    assert answers.check("/v1/embeddings", body, {"data": [{"index": 0, "embedding": [0.0, 1.0, 0.0]}]})
    score = {"model": "m", "text_1": "a", "text_2": "b"}
    for _ in range(2):  # a score is no vector: never "answered differently"
        assert answers.check("/v1/score", score, {"data": [{"index": 0, "object": "score", "score": 0.5}]}) == []
    assert answers.check("/v1/embeddings", body2, {"data": [{"index": 0, "embedding": [1.0, 0.0, 0.0]}]})


def test_a_response_that_does_not_match_its_schema_is_a_finding():
    schema = api_schema.routes(OPENAPI)["/v1/embeddings"].response
    assert hunt_oracles.bad_response({"data": []}, schema) is None
    assert "data" in hunt_oracles.bad_response({"object": "list"}, schema)


def _hunt(*args):
    return subprocess.run(
        [sys.executable, "-m", "mmchaos.harness.cli", "hunt", *args], capture_output=True, text=True, timeout=300
    )


def test_a_versions_spec_without_a_version_is_one_line_and_exit_2(tmp_path):
    r = mmchaos("hunt", "--engine", "0.30.0", "--versions", "--mm-processor-cache-gb 0", "--out", str(tmp_path / "h"))
    said = r.stdout + r.stderr
    assert r.returncode == 2 and "give a version first" in said and "Traceback" not in said
    assert hunt_versions.parse("0.30.0 --mm-processor-cache-gb 0") == ("0.30.0", ["--mm-processor-cache-gb", "0"])


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    r = mmchaos("hunt", "--url", "http://127.0.0.1:9", "--max-starts", "0", "--out", str(tmp_path / "h"))
    assert r.returncode == 2 and "--max-starts must be positive" in r.stdout + r.stderr
    r = mmchaos("hunt", "--out", str(tmp_path / "h"))
    assert r.returncode == 2 and "give one target" in r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr


@pytest.mark.integration
def test_a_target_without_openapi_json_cannot_be_hunted(tmp_path):
    with standin_server(tmp_path / "standin.log") as s:
        r = _hunt("--url", s.base_url, "--out", str(tmp_path / "h"), "--max-cases", "1")
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "/openapi.json" in out and "Traceback" not in out
    assert len([x for x in out.splitlines() if x.startswith("mmchaos:")]) == 1


@pytest.mark.integration
def test_the_hunt_does_not_import_the_lists_it_must_not_need():
    # the search may not lean on what we already know fails: the malformed catalogue, the probes, the mix's kinds
    code = (
        "import sys, mmchaos.harness.hunt.search, mmchaos.harness.commands.hunt; "
        "print([m for m in sys.modules if any(x in m for x in "
        "('malformed', 'catalogue', 'mutations', 'probes', 'locustfiles', 'repro_script_cases'))])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=TESTS.parent, check=True)
    assert r.stdout.strip() == "[]"


def test_what_the_minimizer_gets_keeps_no_key_of_the_target():
    from mmchaos.harness.hunt import reproducers
    from mmchaos.harness.servers.server import Target

    key = "sekret-key-123456"
    target = Target(mode="engine", engine="0.30.0", flags=["--api-key", key], env={"VLLM_API_KEY": key})
    shown = reproducers.masked(target)
    assert key not in " ".join(shown.flags) and key not in " ".join(shown.env.values())
    assert shown.flags[0] == "--api-key" and shown.engine == "0.30.0"


def test_a_crash_is_shrunk_from_a_life_naming_a_whole_request_first_and_a_hang_up_answered_is_plain(tmp_path):
    from mmchaos.harness.hunt import lives as hunt_lives

    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}
    hang_up = hunt_cases.Step(0, "/pooling", body, hang_up_ms=1.0, images=["h1"])
    long_life = [
        {"steps": [asdict(hang_up)] * 5, "answers": [{"step": i, "status": None, "text": ""} for i in range(5)]}
    ]
    short = [
        {
            "steps": [asdict(hang_up), asdict(hang_up)],
            "answers": [{"step": 0, "status": None, "text": ""}, {"step": 1, "status": 500, "text": "answered first"}],
        }
    ]
    folder = tmp_path / "findings" / "2"
    (folder / "lives").mkdir(parents=True)
    (folder / "lives" / "2.json").write_text(json.dumps(long_life))
    (folder / "lives" / "10.json").write_text(json.dumps(short))
    shortest = [{"steps": [asdict(hang_up)], "answers": [{"step": 0, "status": None, "text": ""}]}]
    (folder / "lives" / "7.json").write_text(json.dumps(shortest))
    lives = hunt_lives.lives(folder)
    # a life whose crash names a request sent whole first (hang-ups alone are a race), then fewest requests first
    assert [name for name, _ in lives] == ["10", "7", "2"]
    life = lives[0][1]
    assert [len(c.steps) for c, _ in life] == [2]
    trace, named = hunt_lives.shrink_input(life)
    rows = trace.requests
    assert rows["outcome"].tolist()[0] == "aborted" and rows["abort_after_ms"].tolist()[0] == 1.0
    assert rows["status"].tolist()[1] == 500 and pd_isna(rows["abort_after_ms"].tolist()[1])
    assert named == [rows["request_id"].tolist()[1]]  # the minimizer's first guess: the answered one after the poison


def pd_isna(x) -> bool:
    return x is None or x != x


@pytest.mark.integration
def test_a_server_that_does_not_start_again_ends_the_search_with_its_reason(tmp_path):
    from mmchaos.harness.hunt import search as hunt
    from mmchaos.harness.servers.server import Target

    said: list[str] = []
    dies = f"{sys.executable} -c 'import sys; sys.exit(3)' {{host}} {{port}}"
    h = hunt.Hunt(Target(mode="command", command=dies), tmp_path / "h", hunt.Budget(5, 5, 100, 10), say=said.append)
    with pytest.raises(hunt._Spent) as spent:  # what ends the search (findings kept, shrunk, reported), no traceback
        h._start_again()
    assert "did not start again" in spent.value.why and "code 3" in spent.value.why
    assert h.state["starts"] == 2 and len(said) == 2 and h.server is None  # one more try, counted as a start


def test_an_error_of_the_hunts_own_mid_search_still_reports_what_was_found_then_fails_in_one_line(tmp_path):
    from mmchaos.harness.hunt import search as hunt
    from mmchaos.harness.hunt.findings import Finding
    from mmchaos.harness.servers.server import Target

    class Broken(hunt.Hunt):  # the server and the search replaced: what run() does around them is under test
        def _start(self) -> None:
            self.model = "m"

        def _api(self):
            return api_schema.routes(OPENAPI), []

        def _search(self, forms, operators, api) -> None:
            self.findings["server_error|500|x"] = Finding("server_error", "server_error|500|x", "a 500", first_case=1)
            raise RuntimeError("a bug of ours")

    said: list[str] = []
    h = Broken(Target(mode="engine", engine="0.30.0"), tmp_path / "h", hunt.Budget(1, 1, 1, 1), say=said.append)
    with pytest.raises(hunt.HuntError, match=r"error of the hunt's own \(RuntimeError: a bug of ours"):
        h.run()
    assert any("Traceback" in line and "a bug of ours" in line for line in said)
    assert "a 500" in (tmp_path / "h" / "findings.md").read_text()
    assert json.loads((tmp_path / "h" / "state.json").read_text())["findings"][0]["title"] == "a 500"


def test_a_budget_spent_as_a_case_begins_ends_the_search_as_itself_not_as_hypothesis_flakiness():
    from hypothesis.stateful import RuleBasedStateMachine, rule

    from mmchaos.harness.hunt import search as hunt

    begun = []

    class Cases(RuleBasedStateMachine):
        def __init__(self) -> None:
            begun.append(1)
            if len(begun) > 5:  # the hunt's begin_case: its budget checked before any draw
                raise hunt._Spent("5 case(s)")
            super().__init__()

        @rule(x=st.integers(0, 10))
        def one(self, x):
            pass

        @rule(y=st.text())
        def other(self, y):
            pass

    with pytest.raises(hunt._Spent) as spent:  # Hypothesis alone turns it into FlakyStrategyDefinition
        hunt.run_cases(Cases, max_examples=50)
    assert spent.value.why == "5 case(s)" and len(begun) == 6


@pytest.mark.integration
@pytest.mark.parametrize("wrong", [True, False], ids=["answers-a-repeat-wrongly", "answers-right"])
def test_the_hunts_wrong_answer_oracle_catches_a_server_that_answers_a_repeat_wrongly(tmp_path, wrong):
    """The stand-in with its /openapi.json: with --wrong-on-repeat an image it answered before gets another vector,
    and the hunt reports the same input answered differently; a stand-in that answers right gets no such finding
    (nor a collapse: distinct inputs get distinct vectors), whatever forms and batches the hunt sent."""
    flags = "--openapi" + (" --wrong-on-repeat" if wrong else "")
    cmd = f"{sys.executable} {TESTS / 'standin_server.py'} --port {{port}} {flags}"
    out = tmp_path / "h"
    r = _hunt("--command", cmd, "--out", str(out), "--max-cases", "25", "--max-starts", "1", "--settle", "0")
    said = r.stdout + r.stderr
    assert "Traceback" not in said, said[-3000:]
    findings = json.loads((out / "state.json").read_text())["findings"]
    wrong_answers = [f for f in findings if "the same input answered differently" in f["title"]]
    if wrong:
        assert r.returncode == 1 and wrong_answers, said[-3000:]
        assert "the same input answered differently" in (out / "findings.md").read_text()
        # its reproducer (standard library only) sends the request twice: it says so of a server that answers a
        # repeat wrongly, and not of one that answers right
        f = wrong_answers[0]
        assert f["reproducer"] and f["confirmed"] is True, f
        script = out / f["reproducer"]
        for server_flags, code, said_by in ((["--wrong-on-repeat"], 1, "reproduced"), ([], 0, "not reproduced")):
            with standin_server(tmp_path / f"s{code}.log", "--openapi", *server_flags) as s:
                rr = subprocess.run(
                    [sys.executable, str(script), "--url", s.base_url, "--settle", "0"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
            assert rr.returncode == code and said_by in rr.stdout and "cosine" in rr.stdout, rr.stdout[-1500:]
    else:
        assert not wrong_answers and not [f for f in findings if "answered one vector" in f["title"]], findings


@pytest.mark.integration
@pytest.mark.parametrize("salt", ["other-model", ""], ids=["reference-disagrees", "reference-agrees"])
def test_a_reference_server_that_answers_otherwise_is_a_finding(tmp_path, salt):
    """--reference URL: every answer with vectors is sent to a second server and compared; a reference with other
    vectors is reported (per route), one with the same vectors is not."""
    stand = f"{sys.executable} {TESTS / 'standin_server.py'} --openapi"
    with standin_server(tmp_path / "ref.log", "--openapi", *(["--vector-salt", salt] if salt else [])) as ref:
        out = tmp_path / "h"
        r = _hunt(
            "--command", stand + " --port {port}", "--reference", ref.base_url, "--out", str(out),
            "--max-cases", "10", "--max-starts", "1", "--settle", "0",
        )  # fmt: skip
    said = r.stdout + r.stderr
    assert "Traceback" not in said and f"hunt: reference {ref.base_url}" in said, said[-3000:]
    findings = json.loads((out / "state.json").read_text())["findings"]
    differ = [f for f in findings if f["fingerprint"].startswith("wrong_answer|the reference answered otherwise")]
    if salt:
        assert r.returncode == 1 and differ and "cosine" in differ[0]["title"], findings
    else:
        assert not differ, findings


def test_only_answers_with_vectors_are_compared():
    """A score's answer reads as nan vectors: no embedding to compare (seen: --reference called a /score answer
    otherwise, "cosine nan", on 0.30.0); an embedding's answer is compared, by both oracles alike."""
    body = {"model": "m", "input": ["a", "b"]}
    score = {"data": [{"index": 0, "object": "score", "score": 0.5}]}
    assert hunt_oracles.embeddings(score, {"model": "m", "text_1": "a", "text_2": "b"}) is None
    vectors = hunt_oracles.embeddings(
        {"data": [{"index": 1, "embedding": [0, 1]}, {"index": 0, "embedding": [1, 0]}]}, body
    )
    assert [v.tolist() for v in vectors] == [[1.0, 0.0], [0.0, 1.0]]


@pytest.mark.integration
def test_a_hunt_stopped_by_sigterm_stops_its_server_and_keeps_its_state(tmp_path):
    """A CI job's or a supervisor's SIGTERM ends a hunt as Ctrl-C does: the server it launched is stopped (it is in
    a session of its own: nobody else would stop it), what it found is kept, and a re-run resumes from it."""
    import psutil
    from test_webui import wait_for

    out = tmp_path / "h"
    cmd = f"{sys.executable} {TESTS / 'standin_server.py'} --port {{port}} --openapi"
    argv = [sys.executable, "-m", "mmchaos.harness.cli", "hunt", "--command", cmd, "--out", str(out)]
    p = subprocess.Popen([*argv, "--max-cases", "10000", "--max-starts", "1"], stdout=subprocess.PIPE, text=True)
    server: list = []
    try:
        cases = out / "cases.jsonl"
        wait_for(lambda: cases.exists() and len(cases.read_text().splitlines()) >= 2, 120, "two cases sent")
        server = [
            c for c in psutil.Process(p.pid).children(recursive=True) if "standin_server.py" in " ".join(c.cmdline())
        ]
        assert server, "the hunt's stand-in"
        p.terminate()
        assert p.wait(timeout=60) == 130
        _, alive = psutil.wait_procs(server, timeout=30)
        assert not alive, f"left behind: {[c.pid for c in alive]}"
    finally:
        if p.poll() is None:
            p.kill()
        for c in server:  # the hunt's server, in a session of its own (its group): a failed test stops that group
            if c.is_running():
                os.killpg(os.getpgid(c.pid), signal.SIGKILL)
    assert json.loads((out / "state.json").read_text())["cases"] >= 2


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_media_are_images_and_now_and_then_a_video_each_in_its_own_part(data):
    m = data.draw(hunt_media.media())
    part = m.part
    if m.kind == "video":
        assert part["type"] == "video_url" and part["video_url"]["url"].startswith(
            ("data:video/mp4", "data:video/webm")
        )
    else:
        assert part["type"] == "image_url" and part["image_url"]["url"].startswith("data:image/")


def test_a_medium_by_its_id_alone_means_that_medium_to_the_oracles_and_moves_with_it():
    """A part naming a medium by its id alone (``uuid_only``) is compared as the medium it names: its answer must be
    the data form's, and one answer for it and for its data is no collapse of distinct inputs. Swapping a medium
    for another swaps its id too, so an id never names two media."""
    a, b = hunt_media.make("PNG", 16, 16, 1, "none"), hunt_media.make("PNG", 16, 16, 2, "none")
    seen = {a.hash: a, b.hash: b}

    def body(part):
        return {"model": "m", "messages": [{"role": "user", "content": [part, {"type": "text", "text": "x"}]}]}

    by_id = body(a.as_part("uuid_only"))
    assert by_id["messages"][0]["content"][0] == {"type": "image_url", "image_url": None, "uuid": a.uuid}
    assert hunt_media.meant(by_id, seen) == body(a.part)
    assert hunt_media.meant(body(a.as_part("uuid_only")), {}) == by_id  # a medium we never drew: left as sent
    answers = hunt_oracles.Answers()
    one = {"data": [{"index": 0, "embedding": [1.0, 0.0, 0.0]}]}
    assert answers.check("/v1/embeddings", hunt_media.meant(body(a.part), seen), one) == []
    assert answers.check("/v1/embeddings", hunt_media.meant(by_id, seen), one) == []  # no collapse: the same input
    other = {"data": [{"index": 0, "embedding": [0.0, 1.0, 0.0]}]}
    assert answers.check("/v1/embeddings", hunt_media.meant(by_id, seen), other)  # the cache gave another item

    text = json.dumps(body(a.as_part("uuid")))
    swapped = json.loads(hunt_media.swap(text, a.url, b.url))
    assert swapped == body(b.as_part("uuid"))
    assert {hunt_media.make("PNG", 16, 16, 1, "none").as_part(f)["type"] for f in ("input_image",)} == {"input_image"}
    assert "type" not in a.as_part("untyped") and a.as_part("untyped")["image_url"] == {"url": a.url}


def test_a_conversation_draws_the_message_kinds_its_schema_lists():
    """The kinds are built with the form, not in a draw: built there, the schema library's trial draws are refused
    and no kind would ever be drawn."""
    from hypothesis import find

    messages = {
        "type": "array",
        "items": {
            "anyOf": [
                {"type": "object", "properties": {"role": {"const": "user"}, "content": {"type": "string"}},
                 "required": ["role", "content"]},
                {"type": "object", "properties": {"role": {"const": "tool"}, "tool_call_id": {"type": "string"},
                 "content": {"type": "string"}}, "required": ["role", "tool_call_id", "content"]},
            ]
        },
    }  # fmt: skip
    form = hunt_bodies.form({"properties": {"messages": messages}, "required": ["messages"]}, "m")
    got = find(form.text_bodies(), lambda b: any(m.get("role") == "tool" for m in b["messages"]))
    assert all("tool_call_id" in m for m in got["messages"] if m.get("role") == "tool"), got


def test_every_use_of_a_medium_is_keyed_alike_whatever_form_was_drawn():
    """A failure leaves the cache an entry under the medium's key; a later use must meet that key to find it."""
    media = [hunt_media.make("PNG", 16, 16, seed, "none") for seed in range(30)]
    assert any(m.by_id for m in media) and not all(m.by_id for m in media)
    for m in media:
        keys = {"uuid" in m.as_part(m.keyed_form(f)) for f in hunt_media.FORMS}
        assert keys == {m.by_id}, m.describe()


def test_a_suspect_named_by_its_id_alone_is_swapped_once_suspects_are_avoided():
    a = hunt_media.make("PNG", 16, 16, 1, "none")
    life = hunt_cases.Life(avoid_suspects=True)
    life.saw([a], answered=False)
    step = hunt_cases.Step(
        0,
        "/v1/embeddings",
        {"model": "m", "messages": [{"role": "user", "content": [a.as_part("uuid_only")]}]},
        images=[a.hash],
    )
    (out,) = hunt_cases.without_suspects([step], life)
    assert a.uuid not in json.dumps(out.body) and out.images != [a.hash]
    new = life.seen[out.images[0]]
    assert out.body["messages"][0]["content"][0]["uuid"] == new.uuid


def test_a_video_is_drawn_about_one_time_in_eight():
    from hypothesis import HealthCheck

    kinds: list[str] = []

    @settings(max_examples=240, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(hunt_media.media())
    def draw(m):
        kinds.append(m.kind)

    draw()
    assert 0.02 < kinds.count("video") / len(kinds) < 0.3, kinds.count("video")


@pytest.mark.integration
def test_a_5xx_finding_gets_a_reproducer_confirmed_on_the_server_that_answered_it(tmp_path):
    """A stand-in that answers `dimensions` with a 500: the finding carries repro.py, the one request that got it,
    confirmed when it was found; the script says "reproduced" (exit 1) on such a server and "not reproduced" (exit
    0) on one that answers 400."""
    cmd = f"{sys.executable} {TESTS / 'standin_server.py'} --port {{port}} --openapi --dimensions-status 500"
    out = tmp_path / "h"
    r = _hunt("--command", cmd, "--out", str(out), "--max-cases", "20", "--max-starts", "1", "--settle", "0")
    errors = [f for f in json.loads((out / "state.json").read_text())["findings"] if f["oracle"] == "server_error"]
    assert r.returncode == 1 and errors, r.stdout[-3000:] + r.stderr[-2000:]
    assert "(confirmed on the server that answered it)" in errors[0]["detail"], errors[0]
    script = out / errors[0]["reproducer"]
    for status, code, says in ((500, 1, "reproduced: request(s) 1 answered 5xx"), (400, 0, "not reproduced")):
        with standin_server(tmp_path / f"s{status}.log", "--dimensions-status", str(status)) as s:
            p = subprocess.run(
                [sys.executable, str(script), "--url", s.base_url, "--settle", "0"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        assert p.returncode == code and p.stdout.strip().splitlines()[-1] == says, p.stdout


@pytest.mark.integration
def test_the_hunt_sweeps_the_servers_surface_each_point_once(tmp_path):
    """The stand-in's schema names 6 values (dimensions 0, 1, -1, null; encoding_format float, base64): each is sent,
    alone on a text body, within a few cases (the sweep sends it once; a mutant of its case may again)."""
    from mmchaos.harness.hunt import surface

    cmd = f"{sys.executable} {TESTS / 'standin_server.py'} --port {{port}} --openapi"
    out = tmp_path / "h"
    r = _hunt("--command", cmd, "--out", str(out), "--max-cases", "12", "--max-starts", "1", "--settle", "0")
    state = json.loads((out / "state.json").read_text())
    assert state["surface"] == {"points": 6, "swept": 6}, r.stdout[-3000:] + r.stderr[-2000:]
    sent = [json.dumps(s["body"], sort_keys=True) for line in (out / "cases.jsonl").read_text().splitlines()
            for s in json.loads(line)["steps"] if s["body"] is not None]  # fmt: skip
    api = api_schema.routes(STANDIN_OPENAPI)
    routes = [(p, f) for p, route in api.items() for f in api_schema.variants(route.request)]
    for point in surface.points(routes, "standin"):
        assert point.body["messages"] == [{"role": "user", "content": "a photo"}]
        assert json.dumps(point.body, sort_keys=True) in sent, point.label
    # the corpus keeps no point: a mutant sends what the search drew, not the sweep again
    kept = [json.loads(f.read_text()) for f in (out / "corpus").glob("*.json")]
    assert kept and not any(step["swept"] for steps in kept for step in steps)


@pytest.mark.integration
def test_a_request_left_unanswered_is_a_hang_whose_reproducer_is_it_and_what_such_requests_share_is_spared(
    tmp_path,
):
    """A stand-in that leaves base64 requests unanswered (as 0.30.0 does `padding: max_length` on a short input):
    each is a hang finding of its route whose reproducer is the one request (reproduced on such a server, not on one
    that answers); once two were left unanswered, the field they shared is sent no more."""
    cmd = f"{sys.executable} {TESTS / 'standin_server.py'} --port {{port}} --openapi --stall-format base64"
    out = tmp_path / "h"
    args = ("--out", str(out), "--max-cases", "20", "--max-starts", "1", "--settle", "0", "--request-timeout", "2")
    r = _hunt("--command", cmd, *args)
    state = json.loads((out / "state.json").read_text())
    [hang] = [f for f in state["findings"] if f["oracle"] == "hang"] or [None]
    assert hang and hang["fingerprint"] == "hang|no answer|/v1/embeddings", r.stdout[-3000:] + r.stderr[-2000:]
    # spared once two were left unanswered, or at once when the surface's point of it (it alone on the simplest
    # body) was
    spared = [x for x in (state.get("spared"), state.get("spared_points")) if x]
    assert any(x["fields"].get("encoding_format") == "base64" for x in spared), spared
    since = min(x["case"] for x in spared if x["fields"].get("encoding_format") == "base64")
    later = [json.loads(x) for x in (out / "cases.jsonl").read_text().splitlines()][since:]
    assert later and not any((s["body"] or {}).get("encoding_format") == "base64" for c in later for s in c["steps"])
    assert "no request carried" in (out / "findings.md").read_text()
    script = out / hang["reproducer"]
    assert len(json.loads((out / "findings" / str(hang["first_case"]) / "case.json").read_text())) >= 1
    for stall, code, says in (("base64", 1, "reproduced"), ("", 0, "not reproduced")):
        with standin_server(
            tmp_path / f"s{stall}.log", "--openapi", *(["--stall-format", stall] if stall else [])
        ) as s:
            p = subprocess.run(
                [sys.executable, str(script), "--url", s.base_url, "--settle", "0", "--timeout", "2"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        assert p.returncode == code and p.stdout.strip().splitlines()[-1].startswith(says), p.stdout


def test_findings_say_the_target_reference_and_versions_with_their_keys_masked(tmp_path):
    """A key given with the target's flags, --reference or --versions reaches neither the findings' words (their
    affected-versions line, a reproducer's docstring, the reference's name) nor the report."""
    from mmchaos.harness.hunt import report as hunt_report
    from mmchaos.harness.hunt import search as hunt
    from mmchaos.harness.servers.server import Target

    keys = ["sekret-key-123456", "other-key-654321"]
    h = hunt.Hunt(
        Target(mode="engine", engine="0.30.0", flags=["--api-key", keys[0]]), tmp_path / "h", hunt.Budget(1, 1, 1, 1)
    )
    said = [
        h._found_on(),
        h.shown(f"--mm-processor-cache-gb 0 --api-key {keys[1]}"),
        h.shown(f"0.32.0 --api-key={keys[1]}"),
    ]
    assert said[0].startswith("0.30.0 --api-key ") and "--mm-processor-cache-gb 0 --api-key" in said[1]
    (tmp_path / "h").mkdir()
    files = hunt_report.write(h)
    text = "\n".join([*said, *(p.read_text() for p in files.values())])
    assert not [k for k in keys if k in text], text


@pytest.mark.integration
def test_a_flags_axis_hunts_each_flag_set_and_a_refused_one_is_one_line(tmp_path):
    cmd = f"{sys.executable} {TESTS / 'standin_server.py'} --port {{port}} --openapi"
    out = tmp_path / "h"
    r = _hunt(
        "--command", cmd, "--out", str(out), "--max-cases", "4", "--max-starts", "4", "--settle", "0",
        "--timeout", "20", "--flags-axis", "--delay-ms 1", "--flags-axis", "--no-such-flag 1", "--no-minimize",
    )  # fmt: skip
    said = r.stdout + r.stderr
    assert r.returncode in (0, 1) and "Traceback" not in said, said[-3000:]
    assert "--delay-ms 1: " in said and "distinct finding(s)" in said
    assert "--no-such-flag 1: vLLM refused it at start-up" in said, said[-2000:]
    state = json.loads((out / "flags-delay-ms-1" / "state.json").read_text())
    assert state["cases"] == 2  # its half of the cases
    assert all(f["flags"] == ["--delay-ms", "1"] for f in state["findings"])


@pytest.mark.integration
def test_a_case_with_an_unknown_log_line_and_a_hang_keeps_both(tmp_path):
    """The unknown line's one-step tries skip the request the server left unanswered: sent again, it waited past the
    try's bound, and the error that raised lost the case's hang (seen when a stand-in logged a reset under load)."""
    flags = "--openapi --error-text boom-unlisted --stall-format base64"
    stand = f"{sys.executable} {TESTS / 'standin_server.py'} {flags} --port {{port}}"
    out = tmp_path / "h"
    args = ("--out", str(out), "--max-cases", "3", "--max-starts", "1", "--settle", "0", "--request-timeout", "2")
    r = _hunt("--command", stand, *args)
    oracles = {f["oracle"] for f in json.loads((out / "state.json").read_text())["findings"]}
    assert {"hang", "unknown_signature"} <= oracles, r.stdout[-3000:] + r.stderr[-2000:]


@pytest.mark.integration
def test_an_unknown_log_line_gets_a_one_request_reproducer_when_one_request_logs_it(tmp_path):
    """A server that logs an error no signature names for one kind of request (the stand-in's --error-text: a body
    with ``dimensions``): the finding's reproducer is that one request, not its whole case, and it makes a fresh
    server of the same flags log the line again, and one without them not."""
    stand = f"{sys.executable} {TESTS / 'standin_server.py'} --openapi --error-text boom-unlisted"
    out = tmp_path / "h"
    r = _hunt("--command", stand + " --port {port}", "--out", str(out), "--max-cases", "25", "--max-starts", "1")
    findings = json.loads((out / "state.json").read_text())["findings"]
    [f] = [f for f in findings if f["oracle"] == "unknown_signature" and "boom-unlisted" in f["title"]] or [None]
    assert f is not None and r.returncode == 1, (findings, r.stderr[-2000:])
    assert f["confirmed"] is True and "alone" in f["detail"], f
    script = out / f["reproducer"]
    sent = [ln for ln in script.read_text().splitlines() if '"path":' in ln or "'path':" in ln]
    for flags, code in ((["--error-text", "boom-unlisted"], 1), ([], 0)):
        with standin_server(tmp_path / f"s{code}.log", "--openapi", *flags) as s:
            rr = subprocess.run(
                [sys.executable, str(script), "--url", s.base_url, "--settle", "0", "--log", str(s.log_path)],
                capture_output=True,
                text=True,
                timeout=60,
            )
        assert rr.returncode == code, (flags, rr.stdout[-1500:], sent)


def test_the_surface_names_each_value_of_each_field_each_enum_pair_and_each_kind_once():
    from mmchaos.harness.hunt import surface

    messages = {
        "type": "array",
        "items": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "role": {"const": "user"},
                        "content": {
                            "anyOf": [
                                {"type": "string"},
                                {
                                    "type": "array",
                                    "items": {
                                        "anyOf": [
                                            {
                                                "type": "object",
                                                "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                                                "required": ["type", "text"],
                                            },
                                            {
                                                "type": "object",
                                                "properties": {
                                                    "type": {"const": "input_audio"},
                                                    "input_audio": {
                                                        "type": "object",
                                                        "properties": {
                                                            "data": {"type": "string"},
                                                            "format": {"enum": ["wav", "mp3"]},
                                                        },
                                                        "required": ["data", "format"],
                                                    },
                                                },
                                                "required": ["type", "input_audio"],
                                            },
                                        ]
                                    },
                                },
                            ]
                        },
                    },
                    "required": ["role", "content"],
                },
                {
                    "type": "object",
                    "properties": {
                        "role": {"const": "tool"},
                        "tool_call_id": {"type": "string"},
                        "content": {"type": "string"},
                    },
                    "required": ["role", "tool_call_id", "content"],
                },
            ]
        },
    }
    form = {"properties": {
        "messages": messages,
        "model": {"type": "string"},
        "encoding_format": {"enum": ["float", "base64", "bytes"]},
        "endianness": {"anyOf": [{"enum": ["big", "little"]}, {"type": "null"}]},
        "dimensions": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]},
        "normalize": {"type": "boolean"},
        "priority": {"type": "integer"},
    }, "required": ["messages"]}  # fmt: skip
    points = surface.points([("/v1/embeddings", form)], "m")
    labels = [p.label for p in points]
    assert len(labels) == len(set(labels))
    singles = [p for p in points if not p.pair]
    assert points[: len(singles)] == singles  # every single value before any pair
    assert {p.label for p in singles} == {
        'encoding_format="float"',
        'encoding_format="base64"',
        'encoding_format="bytes"',
        'endianness="big"',
        'endianness="little"',
        "endianness=null",
        "dimensions=1",
        "dimensions=null",  # 0 and -1 are under its minimum
        "normalize=true",
        "normalize=false",
        "message kind user",
        "message kind tool",
        "part kind text",
        "part kind input_audio",
    }  # fmt: skip (priority is the scheduler's: never sent)
    assert len([p for p in points if p.pair]) == 3 * 3  # encoding_format x endianness (null included)
    by = {p.label: p.body for p in points}
    assert by['encoding_format="base64" endianness="big"'] == {
        "model": "m", "messages": [{"role": "user", "content": "a photo"}], "encoding_format": "base64",
        "endianness": "big",
    }  # fmt: skip
    assert by["message kind tool"]["messages"][0] == {"role": "tool", "tool_call_id": "x", "content": "a photo"}
    audio = by["part kind input_audio"]["messages"][0]["content"][0]
    assert audio == {"type": "input_audio", "input_audio": {"data": "x", "format": "wav"}}


def test_the_sweep_sends_each_point_once_across_cases_and_a_rerun_resumes():
    from mmchaos.harness.hunt import surface

    s = surface.Surface([surface.Point("/p", str(i), {"i": i}, {"i": i}) for i in range(5)], swept=1)
    assert [p.label for p in s.take(3)] == ["1", "2", "3"] and s.left == 1
    assert [p.label for p in s.take(3)] == ["4"] and s.left == 0 and s.take(3) == []


def test_two_api_servers_interleaved_in_one_log_leave_each_refusal_known():
    """--api-server-count 2: ApiServer_0's refusal heading, then a line of ApiServer_1 and an access line, then
    ApiServer_0's traceback of it (seen on 0.31.0): still a refusal, no unknown error."""
    a, b = "(ApiServer_0 pid=1) ERROR 12-06 19:25:51 [validation.py:151]", "(ApiServer_1 pid=2) INFO 12-06 [x.py:1]"
    log = [
        f"{a} RequestValidationError caught. Request id: None",
        f"{b} Started.",
        'INFO:     127.0.0.1:46704 - "POST /v2/embed HTTP/1.1" 400 Bad Request',
        f"{a} Traceback (most recent call last):",
        f'{a}   File "/x/site-packages/starlette/_exception_handler.py", line 42, in wrapped_app',
        f"{a}     await app(scope, receive, sender)",
        f"{a} fastapi.exceptions.RequestValidationError: 1 validation error:",
    ]
    assert hunt_oracles.log_errors(log, Signatures.load()) == []
    [e] = hunt_oracles.log_errors([*log[:3], *log[4:]], Signatures.load())  # a traceback with no heading: unknown
    assert e.exception == "RequestValidationError" and e.process == "ApiServer"
