"""The report's deterministic trigger, as plain HTTP: a request whose image renders and then fails validation
(400), then a valid request with the same image. On an affected server the second request finds P0's cache
entry with no P1 twin."""

from __future__ import annotations

import base64
import io
import time
from dataclasses import dataclass, field

import numpy as np
import requests
from PIL import Image

from mmchaos.auth import auth_headers

# dimensions on a model without Matryoshka support fails after rendering (measured on 0.30.0 and 0.32.0)
POISON_FIELDS = {"dimensions": 5}


def probe_image(nonce: int = 0, size: int = 256) -> str:
    """A small PNG as a data URL; a different ``nonce`` gives different bytes, so a different mm_hash."""
    rng = np.random.default_rng(nonce)
    y, x = np.mgrid[0:size, 0:size]
    base = np.stack([x * 255 // size, y * 255 // size, (x + y) * 127 // size], axis=-1).astype(np.uint8)
    base[:4, :4] = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)  # the nonce lives in the corner
    buf = io.BytesIO()
    Image.fromarray(base).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def image_request(model: str, image_url: str, text: str = "a photo", **extra) -> dict:
    content = [{"type": "image_url", "image_url": {"url": image_url}}, {"type": "text", "text": text}]
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


def _post(base_url: str, name: str, body: dict, timeout: float) -> Step:
    t0 = time.perf_counter()
    try:
        r = requests.post(base_url + "/v1/embeddings", json=body, timeout=timeout, headers=auth_headers())
    except requests.RequestException as e:
        return Step(name, None, type(e).__name__, (time.perf_counter() - t0) * 1000)
    ms = (time.perf_counter() - t0) * 1000
    if r.status_code == 200:
        return Step(name, 200, None, ms, len(r.json()["data"][0]["embedding"]))
    return Step(name, r.status_code, r.text[:200], ms)


def poison_then_reuse(
    base_url: str, model: str, *, nonce: int = 0, retries: int = 2, timeout: float = 30.0
) -> ReproResult:
    """poison (expect 400) → reuse with the same image → on 503 (retryable) retry up to ``retries`` times."""
    image = probe_image(nonce)
    res = ReproResult()
    res.steps.append(_post(base_url, "poison", image_request(model, image, **POISON_FIELDS), timeout))
    step = _post(base_url, "reuse", image_request(model, image), timeout)
    res.steps.append(step)
    for i in range(retries):
        if step.status != 503:
            break
        step = _post(base_url, f"retry{i + 1}", image_request(model, image), timeout)
        res.steps.append(step)
    return res
