"""A finding's reproducer: a standalone, standard-library script of the finding's steps (bodies written out, images
as data URLs) that sends them to --url in order and then watches /health. It speaks the minimizer's candidate
protocol (--url, --json, --settle, --timeout; a last JSON line with crashed/statuses/why), so
harness/candidate_run.py runs it on fresh servers unchanged."""

from __future__ import annotations

import json

from . import hunt_api, hunt_steps

_SCRIPT = '''#!/usr/bin/env python3
"""{title}

    python3 repro.py --url http://127.0.0.1:8000 [--model NAME] [--api-key KEY]

Sends the {n} steps below in order, then watches /health for --settle seconds: prints "crashed" and exits 1 when
the server stopped answering, "survived" and exits 0 when it did not. Standard library only.
"""

import argparse
import http.client
import json
import os
import sys
import time
import urllib.parse

# (what, endpoint, hang up after ms (None: wait for the answer), JSON body or None)
STEPS = json.loads(r"""{steps}""")


def post(url, path, body, headers, timeout, hang_up_ms):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.netloc, timeout=(hang_up_ms / 1000) if hang_up_ms else timeout)
    try:
        data = json.dumps(body).encode() if body is not None else b""
        conn.request("POST", path, body=data, headers={{"Content-Type": "application/json", **headers}})
        r = conn.getresponse()
        return r.status, r.read()[:300].decode(errors="replace")
    except TimeoutError:
        return None, "hung up" if hang_up_ms else "timeout"
    except (OSError, http.client.HTTPException) as e:
        return None, type(e).__name__
    finally:
        conn.close()


def healthy(url, headers):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.netloc, timeout=2)
    try:
        conn.request("GET", "/health", headers=headers)
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", help="the served model name (default: the recorded one, {model!r})")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY") or None)
    p.add_argument("--settle", type=float, default=10.0)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    url = a.url.rstrip("/")
    headers = {{"Authorization": "Bearer " + a.api_key}} if a.api_key else {{}}
    if not healthy(url, headers):
        print("the server at " + url + " is not healthy: nothing sent", file=sys.stderr)
        sys.exit(2)
    statuses = []
    for what, path, hang_up_ms, body in STEPS:
        if body is not None and a.model:
            body = dict(body, model=a.model)
        status, text = post(url, path, body, headers, a.timeout, hang_up_ms)
        statuses.append(status)
        print(f"{{what:60.60}} -> {{status if status is not None else '-'}} {{text[:100]}}")
    end, down = time.time() + a.settle, False
    while time.time() < end:
        if not healthy(url, headers):
            down = True
            break
        time.sleep(0.2)
    print("crashed" if down else "survived")
    if a.json:
        print(json.dumps({{"crashed": down, "statuses": statuses, "why": "/health failed" if down else None}}))
    sys.exit(1 if down else 0)


if __name__ == "__main__":
    main()
'''


def materialise(steps: list[dict], routes: list[hunt_api.Route], model: str, salt: int) -> list[tuple]:
    out = []
    for s in steps:
        if s["op"] == "operator":
            out.append((hunt_steps.describe(s), s["route"], None, None))
            continue
        route = next(r for r in routes if r.path == s["route"] and r.form == s["form"])
        out.append((hunt_steps.describe(s), s["route"], s.get("delay_ms") if s["op"] == "hangup" else None,
                    hunt_steps.build_body(s, route, model, salt)))
    return out


def render(title: str, steps: list[dict], routes: list[hunt_api.Route], model: str, salt: int) -> str:
    rows = materialise(steps, routes, model, salt)
    text = "[\n" + ",\n".join(json.dumps(list(r)) for r in rows) + "\n]"
    return _SCRIPT.format(title=title.replace('"', "'"), n=len(rows), steps=text,
                          model=model)


def minimal_jsonl(steps: list[dict], routes, model: str, salt: int) -> str:
    return "".join(json.dumps({"what": w, "endpoint": p, "hang_up_ms": h, "body": b}) + "\n"
                   for w, p, h, b in materialise(steps, routes, model, salt))
