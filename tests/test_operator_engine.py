"""An operator's /pause kills a pooling server, on the release that survives the drift and with the cache off.

Found by the hunt's operator actions (docs/findings.md): `/pause` (VLLM_SERVER_DEV_MODE=1; mode ``abort``, the
default) aborts the requests the engine holds, and the engine answers each aborted pooling request with an output
that has no pooling result; the API server's output handler then asserts ``req_state.detokenizer is not None``
(a pooling request has none) and the server dies. 0.32.0 special-cases only the cache miss, so it dies too, and
the cache does not matter. Pinned here with the deterministic sequence: ``/pause?mode=keep`` (requests wait in the
engine), a request, ``/pause`` (abort), ``/resume``. A pause that keeps and then resumes is harmless.
"""

from __future__ import annotations

import base64
import io
import subprocess
import threading

import numpy as np
import pytest
import requests
from conftest import FIXED_VERSION, REPORT_VERSION, vllm_server
from PIL import Image

from mmchaos.signatures import Signatures

pytestmark = pytest.mark.engine
DEV = {"VLLM_SERVER_DEV_MODE": "1"}  # exposes /pause and /resume
WAITS_S = (0.5, 1, 2, 4, 8)  # how long a round lets its request reach the paused engine: longer each round


def _body(model: str, seed: int) -> dict:
    pixels = np.random.default_rng(seed).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "a photo"}]
    return {"model": model, "messages": [{"role": "user", "content": content}]}


def _held_request(server, seed: int, wait_s: float) -> tuple[threading.Thread, dict]:
    """A request sent into a keep-pause: it waits in the engine (``wait_s`` bounds how long we give it to get
    there; it is not answered while the pause holds)."""
    got: dict = {}

    def send():
        try:
            got["status"] = requests.post(
                server.base_url + "/v1/embeddings", json=_body(server.model_name(), seed), timeout=120
            ).status_code
        except requests.RequestException as e:
            got["status"] = type(e).__name__

    assert requests.post(server.base_url + "/pause?mode=keep", timeout=60).status_code == 200
    t = threading.Thread(target=send, daemon=True)
    t.start()
    t.join(wait_s)
    assert t.is_alive(), f"answered during a keep-pause: {got}"
    return t, got


def _dying_lines(server) -> list:
    sigs = Signatures.load()
    return [m for m in map(sigs.match, server.log_path.read_text(errors="replace").splitlines()) if m]


@pytest.mark.parametrize(
    "version, flags",
    [
        (FIXED_VERSION, []),
        (FIXED_VERSION, ["--mm-processor-cache-gb", "0"]),
        (REPORT_VERSION, ["--mm-processor-cache-gb", "0"]),
    ],
    ids=["0.32.0-default", "0.32.0-cache-off", "0.30.0-cache-off"],
)
def test_a_pause_that_aborts_a_pooling_request_kills_the_server(tmp_path, version, flags):
    with vllm_server(version, flags, tmp_path / "server.log", env=DEV) as server:
        # a pause that keeps its requests, then resumes: the request is answered, the server stays up
        t, got = _held_request(server, 0, WAITS_S[0])
        assert requests.post(server.base_url + "/resume", timeout=60).status_code == 200
        t.join(120)
        assert got["status"] == 200 and server.health()[0]
        # the same with an aborting pause in between: the held request is aborted by the engine, the server dies
        for k, wait_s in enumerate(WAITS_S):  # bounded: one more round, with longer to arrive, while it survives
            t, got = _held_request(server, 1 + k, wait_s)
            requests.post(server.base_url + "/pause", timeout=60)
            try:
                requests.post(server.base_url + "/resume", timeout=60)
            except requests.RequestException:
                pass  # already dying
            t.join(120)
            if got.get("status") != 200:  # aborted in the engine (one answered had not got there: next round)
                break
        assert got.get("status") != 200, f"every held request answered after {len(WAITS_S)} aborting pauses"
        try:
            server.proc.wait(timeout=120)  # the death that follows (event: the process exits)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the request failed ({got}) and the server stayed up")
        lines = _dying_lines(server)
        assert Signatures.load().classify_crash(lines) == "detokenizer_assert", [m.line for m in lines][-5:]
        assert not [m for m in lines if m.signature.drift], "a drift line: another mechanism than the abort"
