"""How many operator actions a serving pooling server takes before it dies: three clients send requests with new
images without pause, and an action (default `/pause`, then `/resume`) is sent after every few of their requests,
until the server stops answering /health or the count of actions runs out.

    VLLM_SERVER_DEV_MODE=1 .venv/bin/mmchaos serve --engine 0.32.0 --port 8931 &   # in another terminal
    .venv/bin/python bench/pause_under_traffic.py --url http://127.0.0.1:8931 [--action /pause --undo /resume]
        [--actions 40]

Prints the action it died at (or that it survived them all) and the statuses the clients got. The finding it
measures and the engine test that pins it deterministically: docs/findings.md, tests/test_operator_engine.py.
Traffic goes to the URL given only; every loop is bounded by the count of actions.
"""

from __future__ import annotations

import argparse
import base64
import io
import threading
from collections import Counter

import numpy as np
import requests
from PIL import Image

CLIENTS = 3
REQUESTS_BETWEEN = 3  # requests the clients complete between two actions (by count, not by time)


def _body(model: str, rng: np.random.Generator) -> dict:
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "x"}]
    return {"model": model, "messages": [{"role": "user", "content": content}]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--action", default="/pause")
    p.add_argument("--undo", default="/resume", help="sent after each action ('' for none)")
    p.add_argument("--actions", type=int, default=40)
    a = p.parse_args()
    base = a.url.rstrip("/")
    model = requests.get(base + "/v1/models", timeout=10).json()["data"][0]["id"]
    stop, statuses, done = threading.Event(), Counter(), threading.Semaphore(0)

    def client(k: int) -> None:
        rng, http = np.random.default_rng(k), requests.Session()
        while not stop.is_set():
            try:
                got: object = http.post(base + "/v1/embeddings", json=_body(model, rng), timeout=30).status_code
            except requests.RequestException as e:
                got = type(e).__name__
            statuses[got] += 1
            done.release()

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    died = None
    for i in range(1, a.actions + 1):
        for _ in range(REQUESTS_BETWEEN):
            done.acquire(timeout=60)  # the clients' requests between two actions, counted
        try:
            requests.post(base + a.action, timeout=30)
            if a.undo:
                requests.post(base + a.undo, timeout=30)
            requests.get(base + "/health", timeout=5).raise_for_status()
        except requests.RequestException:
            died = i
            break
    stop.set()
    for t in threads:
        t.join(35)
    said = f"died at action {died}" if died else f"up after {a.actions} actions"
    print(f"{a.action}: {said}; statuses {dict(statuses)}")
    return 1 if died else 0


if __name__ == "__main__":
    raise SystemExit(main())
