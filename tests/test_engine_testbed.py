"""The real-engine test bed (issue 2): provisioning, serving, and the report's deterministic trigger."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import requests
from conftest import REPORT_VERSION, require_engine_and_model, vllm_server
from helpers import wait_until

from mmchaos.harness.minimize import repro
from mmchaos.harness.servers import engines
from mmchaos.signatures import Signatures

pytestmark = pytest.mark.engine
SIGS = Signatures.load()
MODEL_DIM = 64  # hidden size of the tiny model


def _log_signatures(server) -> set[str]:
    return {m.signature.name for m in SIGS.scan(server.log_path.read_text(errors="replace"))}


def _repro_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mmchaos.harness.cli", "repro", *args], capture_output=True, text=True, timeout=600
    )


class TestFixedVersion:
    def test_valid_image_embedding_has_model_dimension(self, fixed_server):
        model = fixed_server.model_name()
        r = requests.post(
            fixed_server.base_url + "/v1/embeddings",
            json=repro.image_request(model, repro.probe_image(nonce=101)),
            timeout=60,
        )
        assert r.status_code == 200, r.text
        vec = r.json()["data"][0]["embedding"]
        assert len(vec) == MODEL_DIM
        assert abs(sum(x * x for x in vec) - 1.0) < 1e-2  # pooled embeddings are normalised

    def test_drift_becomes_a_retryable_503_and_the_server_stays_up(self, fixed_server):
        res = repro.poison_then_reuse(fixed_server.base_url, fixed_server.model_name(), nonce=102)
        assert res.statuses() == [400, 503, 200]
        assert res.steps[-1].dim == MODEL_DIM
        assert fixed_server.health()[0]
        assert fixed_server.exit_code() is None
        assert "cache_drift" in _log_signatures(fixed_server)

    def test_repro_exits_0_when_the_server_survives(self, fixed_server):
        r = _repro_cli("--url", fixed_server.base_url)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "survived (with a retryable cache miss)" in r.stdout and "503" in r.stdout


def test_report_version_dies_on_poison_then_reuse_and_repro_exits_1(tmp_path):
    """`mmchaos repro --engine 0.30.0`: the report's trigger on a server it launches."""
    require_engine_and_model(REPORT_VERSION)
    log = tmp_path / "server.log"
    r = _repro_cli("--engine", REPORT_VERSION, "--log", str(log))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("poison    400") and not lines[1].startswith("reuse     200")
    assert "server DOWN" in r.stdout and "crashed: detokenizer_assert" in r.stdout
    seen = {m.signature.name for m in SIGS.scan(log.read_text(errors="replace"))}
    assert {"cache_drift", "detokenizer_assert"} <= seen, seen


def test_report_version_with_cache_off_survives(workaround_server):
    server = workaround_server
    res = repro.poison_then_reuse(server.base_url, server.model_name(), nonce=104)
    assert res.statuses() == [400, 200]
    assert res.steps[1].dim == MODEL_DIM
    assert server.health() == (True, 200, None)
    assert not {"cache_drift", "detokenizer_assert"} & _log_signatures(server)


def test_repro_cannot_run_without_a_server():
    r = _repro_cli("--engine", "9.9.9")
    assert r.returncode == 2 and "vLLM 9.9.9 is not installed" in r.stderr


def test_provisioning_again_is_a_fast_noop():
    before = engines.require(REPORT_VERSION).manifest()
    log = engines.require(REPORT_VERSION).root / "install.log"
    t0 = time.time()
    r = subprocess.run(
        [sys.executable, "-m", "mmchaos.harness.cli", "engine", "install", REPORT_VERSION],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "already installed" in r.stderr
    # a no-op: nothing was installed (the install log was not written to), the manifest is as it was
    assert not (log.exists() and log.stat().st_mtime > t0), "the no-op install ran pip"
    assert engines.require(REPORT_VERSION).manifest() == before


def test_tensor_parallel_2_serves_and_reproduces(tmp_path):
    flags = ["--tensor-parallel-size", "2"]
    with vllm_server(REPORT_VERSION, flags, tmp_path / "server.log") as server:
        model = server.model_name()
        ok = requests.post(
            server.base_url + "/v1/embeddings",
            json=repro.image_request(model, repro.probe_image(nonce=105)),
            timeout=60,
        )
        assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == MODEL_DIM
        res = repro.poison_then_reuse(server.base_url, model, nonce=106)
        assert res.statuses()[0] == 400
        wait_until(lambda: server.exit_code() is not None, "the server to exit after the reuse", interval=0.2)
        assert "detokenizer_assert" in _log_signatures(server)
