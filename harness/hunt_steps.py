"""A hunt case's steps, as data, and how one is sent: a request to a pooling route (its body materialised from the
step and the case's image salt), a request the client hangs up on after a chosen delay, or an operator action.
The same step list is what a finding records, what the shrinker cuts and what repro.py replays."""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import requests

from . import hunt_api, hunt_media


@dataclass
class Answer:
    status: int | None  # None: no answer (connection refused or reset, or we hung up)
    text: str
    latency_ms: float
    json: object = None


def build_body(step: dict, route: hunt_api.Route, model: str, salt: int) -> dict:
    url = hunt_media.data_url(salt, step["slot"], step["kind"])
    return hunt_api.body(route, model, url, step.get("text", "a photo"), step.get("params", {}))


def image_of(step: dict) -> tuple | None:
    return (step["slot"], step["kind"]) if "slot" in step else None


def send(base_url: str, headers: dict, path: str, body: dict | None, timeout: float) -> Answer:
    t0 = time.perf_counter()
    try:
        r = requests.post(base_url + path, json=body, headers=headers, timeout=timeout)
    except requests.RequestException as e:
        return Answer(None, type(e).__name__, (time.perf_counter() - t0) * 1000)
    ms = (time.perf_counter() - t0) * 1000
    try:
        doc = r.json()
    except ValueError:
        doc = None
    return Answer(r.status_code, r.text[:300], ms, doc)


def hang_up(base_url: str, headers: dict, path: str, body: dict, after_ms: float) -> Answer:
    """Send the whole body, then hang up ``after_ms`` after the start unless the answer came first."""
    url = urlsplit(base_url)
    conn = http.client.HTTPConnection(url.netloc, timeout=max(after_ms / 1000, 0.001))
    t0 = time.perf_counter()
    try:
        conn.request("POST", path, body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json", **headers})
        conn.sock.settimeout(max(after_ms / 1000 - (time.perf_counter() - t0), 0.001))
        answer = conn.getresponse()
        return Answer(answer.status, answer.read().decode(errors="replace")[:300], (time.perf_counter() - t0) * 1000)
    except TimeoutError:
        return Answer(None, "client hung up", (time.perf_counter() - t0) * 1000)
    except (OSError, http.client.HTTPException) as e:
        return Answer(None, type(e).__name__, (time.perf_counter() - t0) * 1000)
    finally:
        conn.close()


def describe(step: dict) -> str:
    if step["op"] == "operator":
        return f"POST {step['route']}"
    extra = f" params={json.dumps(step['params'], sort_keys=True)}" if step.get("params") else ""
    how = f"hang up after {step['delay_ms']:g} ms" if step["op"] == "hangup" else "send"
    return f"{how}: POST {step['route']} ({step['form']}) image {step['kind']}#{step['slot']}{extra}"
