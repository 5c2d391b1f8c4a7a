"""The Locust user base of mmchaos: FastHttpUser whose every request becomes exactly one recorded row."""

from __future__ import annotations

import http.client
import time
from types import SimpleNamespace
from urllib.parse import urlsplit

import gevent
from gevent import GreenletExit
from locust import FastHttpUser
from mmchaos.payloads.bodies import BuiltRequest

from mmchaos.auth import auth_headers
from mmchaos.outcomes import StoppedByLocust

from . import plugin

# vLLM takes X-Request-Id as the request's id and names it in its log lines (drift warnings included), so a
# log event can be joined to the exact request row
REQUEST_ID_PREFIX = "mmc-"


class ChaosUser(FastHttpUser):
    abstract = True

    def __init__(self, environment):
        o = environment.parsed_options
        self.network_timeout = self.connection_timeout = o.request_timeout
        super().__init__(environment)
        self.user_id = plugin.next_user_id()
        self.worker_index = getattr(environment.runner, "worker_index", 0) or 0
        self.seq = 0
        self.run_id = o.run_id
        self.headers = {"Content-Type": "application/json", **auth_headers()}
        # aborts use a plain connection of their own (see _abort), so the main pool never holds a dropped one
        self.abort_after = o.abort_after_ms / 1000
        url = urlsplit(self.host)
        self._conn_class = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        self._netloc, self._base_path = url.netloc, url.path.rstrip("/")

    def _post(self, payload: bytes, headers: dict, name: str, ctx: dict, req: BuiltRequest):
        with self.client.request("POST", req.path, data=payload, headers=headers, name=name, context=ctx,
                                 catch_response=True) as resp:
            status = resp.status_code or None
            expected = req.meta.expected_status
            if expected is not None:
                resp.success() if status == expected else resp.failure(f"expected {expected}, got {status}")
            elif status is not None and 200 <= status < 300:
                resp.success()
            else:
                resp.failure(f"HTTP {status}" if status else str(getattr(resp, "error", "no answer")))
        return status, resp

    def _abort(self, payload: bytes, headers: dict, name: str, ctx: dict, path: str, t0: float):
        """Send on a connection of its own and hang up after --abort-after-ms: the server sees the client
        disconnect mid-request, as when a caller times out. A server that answers first is recorded as such."""
        p0 = time.perf_counter()
        conn = self._conn_class(self._netloc, timeout=self.abort_after)
        resp = SimpleNamespace(status_code=0, text="", error=None)
        body = b""
        try:
            with gevent.Timeout(self.abort_after):  # a hard deadline: socket timeouts are per operation
                conn.request("POST", self._base_path + path, body=payload, headers=headers)
                answer = conn.getresponse()
                body = answer.read()
                resp.status_code, resp.text = answer.status, body.decode(errors="replace")
        except (gevent.Timeout, TimeoutError):
            # the abort is what was asked for: recorded as aborted, not a failure in Locust's stats
            resp.error = TimeoutError(f"client gave up after {self.abort_after * 1000:.0f} ms")
        except (OSError, http.client.HTTPException) as e:
            resp.error = e
        finally:
            conn.close()
        failed = resp.error is not None and not isinstance(resp.error, TimeoutError)
        self.environment.events.request.fire(
            request_type="POST", name=name, response_time=(time.perf_counter() - p0) * 1000,
            response_length=len(body), response=resp, context=ctx, exception=resp.error if failed else None,
            start_time=t0, url=path)
        return resp.status_code or None, resp

    def send(self, req: BuiltRequest, *, abort: bool = False, **ctx_extra) -> tuple[int | None, object]:
        """POST ``req``; returns (status or None, response). Locust's stats count the request as a success
        when it got what it was built to get (a malformed case's expected status, an abort's disconnect)."""
        plugin.take_budget(self.environment)
        self.seq += 1
        payload = req.payload()
        request_id = f"{REQUEST_ID_PREFIX}{self.run_id}-{self.worker_index}-{self.user_id}-{self.seq}"
        ctx = {**req.meta.columns(), "endpoint": req.path, "request_bytes": len(payload), "user_id": self.user_id,
               "seq": self.seq, "request_id": request_id, "abort": abort, **ctx_extra}
        headers = {**self.headers, "X-Request-Id": request_id}
        name = f"{req.path} [{ctx.get('case') or req.meta.kind}]"
        t0 = time.time()
        try:
            if abort:
                status, resp = self._abort(payload, headers, name, ctx, req.path, t0)
            else:
                status, resp = self._post(payload, headers, name, ctx, req)
        except GreenletExit:
            # Locust is stopping this user mid-request: the request still gets its row
            self.environment.events.request.fire(
                request_type="POST", name=name, response_time=(time.time() - t0) * 1000, response_length=0,
                response=None, context=ctx, exception=StoppedByLocust("stopped by Locust"), start_time=t0,
                url=req.path)
            raise
        if status is None and not abort:
            # nobody answering (refused, reset, timed out): back off as a real client would, instead of
            # spinning thousands of refused requests per second while the server is down
            gevent.sleep(self.environment.parsed_options.refused_backoff_ms / 1000)
        return status, resp
