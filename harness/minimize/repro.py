"""The deterministic probes (mmchaos/probe_sequences.py), as plain HTTP: a step that leaves P0's cache holding a
never-seen image without P1 having it, then a valid request with the same image (retried on a 503 cache miss). On
an affected server the reuse finds P0's cache entry with no P1 twin."""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import requests
from PIL import Image

from mmchaos import probe_sequences
from mmchaos.auth import auth_headers
from mmchaos.hang_up import HUNG_UP, hang_up

# The probe hangs up while the server renders the image, which is early and short: measured on 0.32.0 (tiny
# model, 2 cores, loaded), a hang-up after 1 ms left P0 ahead of P1 2 times in 2, after 5 ms 1 in 2, after
# 10-100 ms never (the request had reached the engine, which drops it cleanly); on 0.30.0 one hang-up after 1 ms
# did not. Again on 0.32.0 with 16 realistic images (bodies of 4-89 KB, the whole body sent in time in every case):
# 13 of 16 hang-ups after 1 ms poisoned; on an idle 0.30.0, 20 of 20 small images sent whole and hung up on at
# once or after 1 ms; on a loaded 0.30.0 (CI, two test lanes) four replays of 2-4 requests in four did not. The
# timing moves with the machine's load, so the probe tries a short ladder of delays, each with an image of its
# own. (The mix's aborts, 40 ms, are realistic timing, not a trigger.)
ABORT_LADDER_MS = (1, 2, 4, 8, 16)
# dimensions on a model without Matryoshka support fails after rendering (measured on 0.30.0 and 0.32.0), and so
# does Cohere's output_dimension on /v2/embed (payloads/malformed_cases.toml v2_embed_output_dimension)
POISON_FIELDS: dict[str, Any] = {"dimensions": 5}
ROUTE_POISON_PATH, ROUTE_POISON_FIELDS = "/v2/embed", {"output_dimension": 5, "embedding_types": ["float"]}

_FIRST = {name: s.first_step for name, s in probe_sequences.SEQUENCES.items()}  # each probe's first step


def probe_image(nonce: int = 0, size: int = 256, variant: int = 0) -> str:
    """A small PNG as a data URL; a different ``nonce`` (or ``variant``) gives different bytes, so a different
    mm_hash."""
    rng = np.random.default_rng([nonce, variant] if variant else nonce)
    y, x = np.mgrid[0:size, 0:size]
    base = np.stack([x * 255 // size, y * 255 // size, (x + y) * 127 // size], axis=-1).astype(np.uint8)
    base[:4, :4] = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)  # the nonce lives in the corner
    buf = io.BytesIO()
    Image.fromarray(base).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


PROBE_TEXT = "a photo"  # beside the image; None for a model that takes an image alone (CLIP: model.Recipe)


def image_request(model: str, image_url: str, text: str | None = PROBE_TEXT, **extra) -> dict:
    content = [{"type": "image_url", "image_url": {"url": image_url}}]
    if text is not None:
        content.append({"type": "text", "text": text})
    return {"model": model, "messages": [{"role": "user", "content": content}], "encoding_format": "float", **extra}


@dataclass
class Step:
    name: str
    status: int | None
    error: str | None
    latency_ms: float
    dim: int | None = None  # embedding length on success


@dataclass
class ReproResult:
    steps: list[Step] = field(default_factory=list)

    def statuses(self) -> list[int | None]:
        return [s.status for s in self.steps]


def _post(base_url: str, name: str, body: dict, timeout: float, path: str = "/v1/embeddings") -> Step:
    t0 = time.perf_counter()
    try:
        r = requests.post(base_url + path, json=body, timeout=timeout, headers=auth_headers())
    except requests.RequestException as e:
        return Step(name, None, type(e).__name__, (time.perf_counter() - t0) * 1000)
    ms = (time.perf_counter() - t0) * 1000
    if r.status_code == 200:
        return Step(name, 200, None, ms, len(r.json()["data"][0]["embedding"]) if "data" in r.json() else None)
    return Step(name, r.status_code, r.text[:200], ms)


def embed_image(base_url: str, model: str, *, nonce: int, timeout: float = 60.0, text: str | None = PROBE_TEXT) -> Step:
    """One valid image request (a server must serve one before a probe on it means anything)."""
    return _post(base_url, "valid", image_request(model, probe_image(nonce), text), timeout)


def _reuse(res: ReproResult, base_url: str, body: dict, retries: int, timeout: float) -> ReproResult:
    """The same image in a valid request; on a 503 (retryable) it is sent again, up to ``retries`` times."""
    step = _post(base_url, "reuse", body, timeout)
    res.steps.append(step)
    for i in range(retries):
        if step.status != 503:
            break
        step = _post(base_url, f"retry{i + 1}", body, timeout)
        res.steps.append(step)
    return res


def poison_then_reuse(
    base_url: str,
    model: str,
    *,
    nonce: int = 0,
    retries: int = 2,
    timeout: float = 30.0,
    text: str | None = PROBE_TEXT,
) -> ReproResult:
    """poison (expect 400) → reuse with the same image → on 503 (retryable) retry up to ``retries`` times."""
    image = probe_image(nonce)
    res = ReproResult()
    poison = image_request(model, image, text, **POISON_FIELDS)
    res.steps.append(_post(base_url, _FIRST["poison_reuse"], poison, timeout))
    return _reuse(res, base_url, image_request(model, image, text), retries, timeout)


def route_poison_then_reuse(
    base_url: str,
    model: str,
    *,
    nonce: int = 0,
    retries: int = 2,
    timeout: float = 30.0,
    text: str | None = PROBE_TEXT,
) -> ReproResult:
    """A post-render 400 on Cohere's /v2/embed (expect 400) → reuse on /v1/embeddings → retries on 503: a poison on
    one route is a poison for all (the multimodal cache is the server's, not the route's)."""
    image = probe_image(nonce)
    content = image_request(model, image, text)["messages"][0]["content"]
    body = {"model": model, "inputs": [{"content": content}], **ROUTE_POISON_FIELDS}
    res = ReproResult()
    res.steps.append(_post(base_url, _FIRST["route_poison_reuse"], body, timeout, path=ROUTE_POISON_PATH))
    return _reuse(res, base_url, image_request(model, image, text), retries, timeout)


def tokenize_then_reuse(
    base_url: str,
    model: str,
    *,
    nonce: int = 0,
    retries: int = 2,
    timeout: float = 30.0,
    text: str | None = PROBE_TEXT,
) -> ReproResult:
    """/tokenize of the image (expect 200; it renders and never runs) → reuse → retries on 503."""
    image = probe_image(nonce)
    body = image_request(model, image, text)
    # the embedding request renders without a generation prompt; /tokenize adds one unless told not to
    tok = {"model": model, "messages": body["messages"], "add_generation_prompt": False}
    res = ReproResult()
    res.steps.append(_post(base_url, _FIRST["tokenize_reuse"], tok, timeout, path="/tokenize"))
    return _reuse(res, base_url, body, retries, timeout)


def abort_then_reuse(
    base_url: str,
    model: str,
    *,
    nonce: int = 0,
    retries: int = 2,
    timeout: float = 30.0,
    abort_after_ms: float | None = None,
    text: str | None = PROBE_TEXT,
) -> ReproResult:
    """For each hang-up delay in turn (``abort_after_ms``, else the ABORT_LADDER_MS), a never-seen image: a valid
    request the client hangs up on (as a caller that times out) → reuse → retries on 503. It stops at the first
    reuse not answered 200 at once. A server that answers before the hang-up is recorded as such."""
    res = ReproResult()
    for i, ms in enumerate((abort_after_ms,) if abort_after_ms else ABORT_LADDER_MS):
        body = image_request(model, probe_image(nonce, variant=i), text)
        res.steps.append(_hang_up(base_url, body, ms))
        _reuse(res, base_url, body, retries, timeout)
        if res.steps[-1].name != "reuse" or res.steps[-1].status != 200:
            break
    return res


def _hang_up(base_url: str, body: dict, after_ms: float) -> Step:
    headers = {"Content-Type": "application/json", **auth_headers()}
    got = hang_up(base_url, "/v1/embeddings", json.dumps(body).encode(), headers, after_ms / 1000)
    error = None if got.status == 200 else got.text if got.status is None else got.text[:200]
    return Step(f"{_FIRST['abort_reuse']}@{after_ms:g}ms", got.status, error, got.ms)


ABORTED = HUNG_UP  # the error of an abort step that hung up before any answer, as it was asked to

_SENDERS: dict[str, Callable[..., ReproResult]] = {
    "poison_reuse": poison_then_reuse,
    "tokenize_reuse": tokenize_then_reuse,
    "abort_reuse": abort_then_reuse,
    "route_poison_reuse": route_poison_then_reuse,
}
# name -> (sequence, the first step's status when the trigger applied: None = hung up before any answer)
SEQUENCES: dict[str, tuple[Callable[..., ReproResult], int | None]] = {
    name: (_SENDERS[name], s.trigger_status) for name, s in probe_sequences.SEQUENCES.items()
}
