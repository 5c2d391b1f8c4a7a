"""Faults fired by hand: a small HTTP endpoint on 127.0.0.1, run by the process that owns the server (``mmchaos
serve``, a campaign's trial), which the Locust web UI's fault form talks to (``--fault-control URL``). Locust never
signals a process itself: the endpoint checks each fault with the one rule (mmchaos.faults: ``problem`` and
``Target.refuses``) and fires it through the trial's FaultInjector, at the pids recorded when the server started.

    GET  /faults/offer   what this server can take: kind -> roles, and each kind's parameters
    GET  /faults         every fault so far (scheduled or by hand), with its outcome
    POST /faults         {"kind", "target" (a role: tp_worker:1, engine_core, network, server), "duration",
                          "params"}: fired at once; 400 with one line when the server cannot take it
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mmchaos import faults

from ..servers.processes import LOOPBACK
from .injector import FaultInjector

MAX_BODY = 10_000


class FaultControl:
    def __init__(self, injector: FaultInjector, target: faults.Target, t_start: float | None = None):
        self.injector, self.target = injector, target
        self.lock = threading.Lock()  # the injector is shared with the owner's loop (its tick)
        self.t_start = t_start or time.time()
        self.by_hand = 0
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._httpd is not None, "not started"
        return f"http://{LOOPBACK}:{self._httpd.server_address[1]}"

    def start(self) -> FaultControl:
        control = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # the owner's output is its progress lines
                pass

            def _send(self, status: int, body) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/faults/offer":
                    return self._send(200, control.offer())
                if self.path == "/faults":
                    return self._send(200, control.rows())
                return self._send(404, {"error": "no such route"})

            def do_POST(self):
                if self.path != "/faults":
                    return self._send(404, {"error": "no such route"})
                n = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(min(n, MAX_BODY)))
                    row = control.fire(body)
                except (ValueError, TypeError, KeyError, AttributeError) as e:
                    return self._send(400, {"error": str(e).splitlines()[0] if str(e) else "bad request"})
                return self._send(200, row)

        self._httpd = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, name="mmchaos-fault-control", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def offer(self) -> dict:
        return {
            "kinds": self.target.offers(),
            "params": {
                k: {
                    p: {"help": h, "default": d, "choices": list(faults.CHOICES.get(p, ()))} for p, (h, d) in ps.items()
                }
                for k, ps in faults.PARAMETERS.items()
            },
            "lasting": list(faults.NEEDS_DURATION),
        }

    def fire(self, body: dict) -> dict:
        """Check and fire one fault from the form (ValueError, one line, when it cannot be)."""
        if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
            raise ValueError("say which fault: {'kind': ..., 'target': ...}")
        kind, role = body["kind"], str(body.get("target") or "")
        if kind not in faults.KINDS:
            raise ValueError(f"kind '{kind}' is not a fault; kinds: {', '.join(faults.KINDS)}")
        params = body.get("params") or {}
        if not isinstance(params, dict):
            raise ValueError("params must be an object of parameter: value")
        self.by_hand += 1
        f = faults.from_role(
            kind,
            role,
            duration=float(body.get("duration") or 0),
            params={p: v for p, v in params.items() if v not in ("", None)},
            name=f"{kind} {role} by hand #{self.by_hand}" if role else f"{kind} by hand #{self.by_hand}",
        )
        why = faults.problem(f) or self.target.refuses(f)
        if why:
            self.by_hand -= 1
            raise ValueError(f"{kind} {f.role()}: the server {why}" if not faults.problem(f) else why)
        with self.lock:
            row = self.injector.fire(f, time.time(), source="web_ui")
        return {k: v for k, v in row.items() if k != "id"}

    def tick(self, requests: int = 0) -> list[dict]:
        """The owner's loop: what is due or has lasted its duration (see FaultInjector.tick)."""
        now = time.time()
        with self.lock:
            return self.injector.tick(now, now - self.t_start, requests)

    def rows(self) -> list[dict]:
        with self.lock:  # a row is written once done; until then it waits on an answer or lasts
            rows = [*self.injector.rows, *(c.row for c in self.injector.calls), *(x.row for x in self.injector.lasting)]
            rows = [{k: v for k, v in r.items() if k != "id"} for r in rows]
        for r in rows:
            r.setdefault("outcome", "sent")
        return sorted(rows, key=lambda r: r.get("t_injected") or 0)
