"""Fast tests of `mmchaos hunt` (no vLLM): what it may import, its oracles on real log text, its requests from a
schema, its reproducer script, and its one-line errors on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings

from mmchaos.harness import hunt_api, hunt_media, hunt_oracles, hunt_repro, hunt_triage
from mmchaos.signatures import Signatures

# The lists we wrote: the hunt must find what it finds without them
LISTS = ("mmchaos.payloads.malformed", "mmchaos.payloads.catalogue", "mmchaos.payloads.mutations",
         "mmchaos.harness.repro", "mmchaos.locustfiles")


@pytest.mark.integration
def test_hunt_imports_neither_the_catalogue_nor_the_probes_nor_the_mix():
    probe = ("import sys, mmchaos.harness.hunt, mmchaos.harness.cli_hunt; "
             "print('\\n'.join(m for m in sys.modules if m.startswith('mmchaos')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    loaded = out.stdout.split()
    assert "mmchaos.harness.hunt" in loaded
    assert not [m for m in loaded if m in LISTS or m.startswith(tuple(x + '.' for x in LISTS))], loaded


TRACEBACK = """\
(EngineCore_DP0 pid=123) ERROR 12-03 11:00:00 [core.py:900] EngineCore encountered an issue
(EngineCore_DP0 pid=123) Traceback (most recent call last):
(EngineCore_DP0 pid=123)   File "/x/site-packages/vllm/v1/engine/core.py", line 10, in run_busy_loop
(EngineCore_DP0 pid=123)     self._process()
(EngineCore_DP0 pid=123)   File "/x/site-packages/vllm/multimodal/cache/shm.py", line 77, in get_item
(EngineCore_DP0 pid=123)     assert addr is not None
(EngineCore_DP0 pid=123) KeyError: 'abc'
INFO 12-03 11:00:01 [api_server.py:1] fine
"""


def test_an_unknown_traceback_becomes_a_signature_named_by_exception_and_innermost_vllm_frame():
    found = hunt_oracles.unknown_signatures(TRACEBACK.splitlines(), Signatures.default())
    assert [(n, p) for n, p, _ in found] == [("KeyError@multimodal/cache/shm.py:get_item", "EngineCore_DP")]


def test_a_known_signature_is_no_new_finding():
    lines = ["ERROR 12-03 [x.py:1] AssertionError: assert req_state.detokenizer is not None"]
    assert hunt_oracles.unknown_signatures(lines, Signatures.default()) == []


def test_fingerprint_splits_by_process_and_route():
    a = hunt_oracles.Finding("crash", "cache_drift → detokenizer_assert", "", "/v1/embeddings", "APIServer")
    b = hunt_oracles.Finding("crash", "cache_drift → detokenizer_assert", "", "/v1/embeddings", "EngineCore")
    assert a.fingerprint != b.fingerprint
    assert a.fingerprint == hunt_oracles.Finding(**{**a.__dict__, "detail": "other"}).fingerprint


SPEC = {
    "paths": {
        "/v1/embeddings": {"post": {
            "requestBody": {"content": {"application/json": {"schema": {"anyOf": [
                {"$ref": "#/components/schemas/Completion"}, {"$ref": "#/components/schemas/Chat"}]}}}},
            "responses": {"200": {"content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Answer"}}}}}}},
        "/v2/embed": {"post": {"requestBody": {"content": {"application/json": {
            "schema": {"type": "object", "properties": {"images": {"type": "array"},
                                                        "output_dimension": {"type": "integer"}}}}}}}},
        "/health": {"get": {}},
        "/reset_mm_cache": {"post": {}},
    },
    "components": {"schemas": {
        "Completion": {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]},
        "Chat": {"type": "object", "required": ["messages"], "properties": {
            "messages": {"type": "array"}, "model": {"type": "string"},
            "dimensions": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "encoding_format": {"enum": ["float", "base64"]}}},
        "Answer": {"type": "object", "required": ["data"], "properties": {"data": {"type": "array"}}},
    }},
}


def test_routes_and_forms_come_from_the_servers_schema():
    routes = hunt_api.routes(SPEC)
    assert [(r.path, r.form) for r in routes] == [("/v1/embeddings", "chat"), ("/v2/embed", "cohere")]
    assert set(routes[0].params["properties"]) == {"dimensions", "encoding_format"}  # media and model are ours
    assert hunt_api.operator_routes(SPEC) == ["/reset_mm_cache"]
    assert hunt_api.schema_error(routes[0], {"data": []}) is None
    assert "data" in hunt_api.schema_error(routes[0], {"object": "list"})


@settings(max_examples=40, deadline=None)
@given(hunt_api.params_strategy(hunt_api.routes(SPEC)[0]))
def test_drawn_parameters_are_ones_the_schema_names(params):
    assert set(params) <= {"dimensions", "encoding_format"}
    assert params.get("encoding_format", "float") in ("float", "base64")


def test_pool_images_are_the_same_bytes_for_the_same_draw_and_new_for_another_case():
    assert hunt_media.data_url(1, 0, "png64") == hunt_media.data_url(1, 0, "png64")
    assert hunt_media.data_url(1, 0, "png64") != hunt_media.data_url(2, 0, "png64")
    assert len({hunt_media.image_bytes(1, 0, k)[0] for k in hunt_media.KINDS}) == len(hunt_media.KINDS)


def test_the_cut_keeps_the_dying_requests_image_and_the_operator_actions():
    steps = [{"op": "send", "slot": 0, "kind": "png64"}, {"op": "send", "slot": 1, "kind": "png64"},
             {"op": "operator", "route": "/reset_mm_cache"}, {"op": "hangup", "slot": 0, "kind": "png64"},
             {"op": "send", "slot": 0, "kind": "png64"}, {"op": "send", "slot": 0, "kind": "png64"}]
    kept = hunt_triage.cut({"steps": steps, "at_step": 4})
    assert kept == [steps[0], steps[2], steps[3], steps[4]]


class _Echo(BaseHTTPRequestHandler):
    got: list = []

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self):
        _Echo.got.append((self.path, self.rfile.read(int(self.headers["Content-Length"] or 0))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_):
        pass


def _echo_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.mark.integration
def test_the_reproducer_sends_its_steps_in_order_and_says_survived(tmp_path):
    routes = hunt_api.routes(SPEC)
    steps = [{"op": "send", "route": "/v1/embeddings", "form": "chat", "slot": 0, "kind": "png64",
              "params": {"dimensions": 5}},
             {"op": "operator", "route": "/reset_mm_cache"},
             {"op": "send", "route": "/v2/embed", "form": "cohere", "slot": 0, "kind": "png64", "params": {}}]
    script = tmp_path / "repro.py"
    script.write_text(hunt_repro.render("t", steps, routes, "m", 7))
    srv = _echo_server()
    _Echo.got = []
    try:
        out = subprocess.run([sys.executable, str(script), "--url", f"http://127.0.0.1:{srv.server_port}",
                              "--settle", "0.5", "--json"], capture_output=True, text=True, timeout=60)
    finally:
        srv.shutdown()
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout.splitlines()[-1])["crashed"] is False
    assert [p for p, _ in _Echo.got] == ["/v1/embeddings", "/reset_mm_cache", "/v2/embed"]
    first = json.loads(_Echo.got[0][1])
    assert first["dimensions"] == 5
    assert first["messages"][0]["content"][0]["image_url"]["url"] == hunt_media.data_url(7, 0, "png64")


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "mmchaos.harness.cli", "hunt", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ})


@pytest.mark.integration
def test_bad_input_is_one_line_and_exit_2(tmp_path):
    srv = _echo_server()  # answers /health, has no /openapi.json
    try:
        cases = [("--max-starts", "0", "--url", "http://127.0.0.1:1"), (),
                 ("--url", f"http://127.0.0.1:{srv.server_port}", "--out", str(tmp_path / "o"))]
        for args in cases:
            r = _cli(*args)
            assert r.returncode == 2, (args, r.stdout, r.stderr)
            assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 2, r.stderr
        assert "openapi.json" in r.stderr
    finally:
        srv.shutdown()
