"""The malformed-case catalogue against real vLLM: every case gets its expected status, and its stage is right —
a case that fails after rendering leaves P0's cache ahead of P1's (on the fixed version the next request with
the same image gets the retryable 503), a case that fails before rendering does not."""

from __future__ import annotations

import pytest
import requests

from mmchaos.payloads import bodies as build
from mmchaos.payloads import catalogue, fresh, generated, malformed

pytestmark = pytest.mark.engine
MAX_MODEL_LEN = 4096  # the embedded engine's default


def _post(server, req) -> requests.Response:
    return requests.post(
        server.base_url + req.path, data=req.payload(), headers={"Content-Type": "application/json"}, timeout=60
    )


def _check_catalogue(server, reuse_expectation) -> list[str]:
    model = server.model_name()
    pool = generated.generate_pool(4, seed=11, preset="small")
    problems = []
    for i, case in enumerate(catalogue.load_cases().values()):
        image = fresh.fresh_image(pool[i % len(pool)], f"catalogue-{server.port}-{i}")  # never seen: no earlier poison
        got = _post(server, malformed.build_malformed_request(case, image, model, max_model_len=MAX_MODEL_LEN))
        if got.status_code != case.expected_status:
            problems.append(f"{case.name}: expected {case.expected_status}, got {got.status_code}: {got.text[:120]}")
        if case.carries_image:
            reuse = _post(server, build.image_request(model, image, "reuse")).status_code
            want = reuse_expectation(case)
            if reuse != want:
                problems.append(f"{case.name} ({case.stage}): the same image next got {reuse}, expected {want}")
    return problems


def test_catalogue_statuses_and_stages_on_the_fixed_version(fixed_server):
    problems = _check_catalogue(fixed_server, lambda case: 503 if case.poisons else 200)
    assert fixed_server.health()[0]
    assert not problems, "\n".join(problems)


def test_catalogue_statuses_on_the_report_version_with_cache_off(workaround_server):
    problems = _check_catalogue(workaround_server, lambda case: 200)  # no cache, no drift
    assert workaround_server.health()[0]
    assert not problems, "\n".join(problems)
