"""The Locust user base of mmchaos: a FastHttpUser that behaves like the clients users run, and whose every request
attempt becomes exactly one recorded row.

- Connections: a pooled connection the server closed is not reused, and a request that got no byte back on one
  is sent again on a fresh connection (connections.py): a failure we would cause ourselves is never recorded as
  the server's.
- Retries: ``--retry-policy`` (mmchaos.retry_policy): ``openai`` retries as the OpenAI Python SDK does by
  default. Each attempt is its own row, linked to the first by ``request_group``.
- A request still in flight when Locust stops the user (the end of the run) keeps its row, as ``cut``: it is
  not a Locust failure and counts in no verdict.
"""

from __future__ import annotations

import http.client
import time
from types import SimpleNamespace
from urllib.parse import urlsplit

import gevent
import numpy as np
from gevent import GreenletExit
from locust import FastHttpUser

from mmchaos import retry_policy, schema
from mmchaos.auth import auth_headers
from mmchaos.outcomes import as_built, outcome_of
from mmchaos.payloads.bodies import BuiltRequest, fill_template, slot_hashes

from . import connections
from . import listeners as plugin

# vLLM takes X-Request-Id as the request's id and names it in its log lines (drift warnings included), so a
# log event can be joined to the exact request row
REQUEST_ID_PREFIX = "mmc-"
RETRY_HEADERS = ("retry-after-ms", "retry-after", "x-should-retry")


def _retry_headers(resp) -> dict[str, str]:
    headers = getattr(resp, "headers", None) or {}
    return {h: v for h in RETRY_HEADERS if (v := headers.get(h)) is not None}


class ChaosUser(FastHttpUser):
    abstract = True

    def __init__(self, environment):
        o = environment.parsed_options
        self.network_timeout = self.connection_timeout = o.request_timeout
        super().__init__(environment)
        state = environment.mmchaos  # this process's run state (run_state.py)
        self.user_id = state.next_user_id()
        self.worker_index = getattr(environment.runner, "worker_index", 0) or 0
        self.seq = 0
        self.run_id = o.run_id
        self.headers = {"Content-Type": "application/json", **auth_headers()}
        self.retry_policy = o.retry_policy
        self.oracle = state.oracle_for(o.consistency_sample)
        self.refused_backoff = o.refused_backoff_ms / 1000
        # the jitter of retry delays: its own stream, so the requests a seed gives do not depend on outcomes
        self.jitter = np.random.default_rng([o.seed, self.worker_index, self.user_id, 0x7E7])
        self.connection = connections.install(self.client, self.host)
        # aborts use a plain connection of their own (see _abort), so the main pool never holds a dropped one
        self.abort_after = o.abort_after_ms / 1000
        url = urlsplit(self.host)
        self._conn_class = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        self._netloc, self._base_path = url.netloc, url.path.rstrip("/")
        self._abort_connect = connections.LookedUpOnce()

    def _decide_retry(self, status: int | None, outcome: str, resp, retries: int, policy: str) -> dict | None:
        """Whether the client sends this request again: the retry-relevant headers if so, else None."""
        headers = _retry_headers(resp)
        return headers if retry_policy.should_retry(policy, retries, status, outcome, headers) else None

    def _post(
        self,
        payload: bytes,
        headers: dict,
        name: str,
        ctx: dict,
        req: BuiltRequest,
        retries: int,
        policy: str,
        last: bool,
        template: bytes,
        hashes: list[str],
    ):
        self.connection.reconnects = 0
        # data: bytes, as Locust's docstring says (its annotation leaves them out)
        with self.client.request(
            "POST",
            req.path,
            data=payload,  # type: ignore[arg-type]
            headers=headers,
            name=name,
            context=ctx,
            catch_response=True,
        ) as resp:
            status = resp.status_code or None
            error = getattr(resp, "error", None)
            outcome = outcome_of(status, error, False)
            retry = self._decide_retry(status, outcome, resp, retries, policy)
            # what the row says beyond Locust's own: the request event fires with this context when the block ends
            resp.request_meta["context"].update(reconnects=self.connection.reconnects, final=retry is None and last)
            expected = req.meta.expected_status
            consistent, wrong = None, None
            if status == 200 and expected is None and req.meta.kind in schema.VALID_KINDS:
                consistent, wrong = self.oracle.check(req.path, template, hashes, resp.text)
                resp.request_meta["context"].update(consistent=consistent, wrong_answer=wrong)
            if wrong:
                resp.failure(wrong)  # answered, and wrongly: a failure in Locust's stats, its row's outcome ok
            elif as_built(status, outcome, expected):
                resp.success()
            elif status is None:
                resp.failure(error or "no answer")  # the network error itself: its row says timeout or refused
            elif expected is not None:
                resp.failure(f"expected {expected}, got {status}")
            else:
                resp.failure(f"HTTP {status}")
        return status, resp, retry

    def _abort(
        self,
        payload: bytes,
        headers: dict,
        name: str,
        ctx: dict,
        path: str,
        t0: float,
        retries: int,
        after: float,
        policy: str,
        last: bool,
    ):
        """Send on a connection of its own and hang up after --abort-after-ms: the server sees the client
        disconnect mid-request, as when a caller times out. A server that answers first is recorded as such,
        and a retryable answer is retried as any other (the caller's timeout is per attempt, as the SDK's)."""
        p0 = time.perf_counter()
        conn = self._conn_class(self._netloc, timeout=after)
        conn._create_connection = self._abort_connect  # http.client's own hook for how it connects
        resp = SimpleNamespace(status_code=0, text="", error=None, headers={})
        body = b""
        try:
            with gevent.Timeout(after):  # a hard deadline: socket timeouts are per operation
                conn.request("POST", self._base_path + path, body=payload, headers=headers)
                answer = conn.getresponse()
                body = answer.read()
                resp.status_code, resp.text = answer.status, body.decode(errors="replace")
                resp.headers = answer.headers
        except (gevent.Timeout, TimeoutError):
            # the abort is what was asked for: recorded as aborted, not a failure in Locust's stats
            resp.error = TimeoutError(f"client gave up after {after * 1000:.0f} ms")
        except (OSError, http.client.HTTPException) as e:
            resp.error = e
        finally:
            conn.close()
        failed = resp.error is not None and not isinstance(resp.error, TimeoutError)
        status = resp.status_code or None
        # only an answer is retried: the hang-up itself is what was asked for
        retry = self._decide_retry(status, outcome_of(status, None, False), resp, retries, policy) if status else None
        ctx["final"] = retry is None and last
        self.environment.events.request.fire(
            request_type="POST",
            name=name,
            response_time=(time.perf_counter() - p0) * 1000,
            response_length=len(body),
            response=resp,
            context=ctx,
            exception=resp.error if failed else None,
            start_time=t0,
            url=path,
        )
        return status, resp, retry

    def send(
        self,
        req: BuiltRequest,
        *,
        abort: bool = False,
        abort_after_ms: float | None = None,
        t_sched: float | None = None,
        recorded: tuple[str, int, bool] | None = None,
        **ctx_extra,
    ) -> tuple[int | None, object]:
        """POST ``req`` as the client would, retries included; returns the last attempt's (status or None,
        response). Locust's stats count an attempt as a success when it got what it was built to get (a
        malformed case's expected status, an abort's disconnect). An abort hangs up after ``abort_after_ms``
        (default ``--abort-after-ms``). With ``--trace``, each attempt is traced as it goes out. ``t_sched``: the
        epoch time an open-loop arrival was due; the first attempt's row says it and how late it went out.
        ``recorded``: one attempt of a recorded request and its retries, sent as recorded (a replay): (the
        ``request_group`` of its rows, its attempt number, whether a recorded attempt follows); no retry is added.
        Returns then at once: the recording, not this client, decides what is sent next."""
        template, urls = req.template()
        payload = fill_template(template, urls)
        # the content hash of each image slot, in order (what makes two inputs the same: mmchaos.sameness)
        hashes = slot_hashes(urls)
        after = self.abort_after if abort_after_ms is None else abort_after_ms / 1000
        kind = req.meta.kind
        name = f"{req.path} [{kind}]" if req.meta.case is None else f"{req.path} [{kind}/{req.meta.case}]"
        group, retries, policy, last = None, 0, self.retry_policy, True
        if recorded is not None:
            group, attempt, more = recorded
            retries, policy, last = attempt - 1, retry_policy.NONE, not more
        while True:
            plugin.take_budget(self.environment)
            self.seq += 1
            request_id = f"{REQUEST_ID_PREFIX}{self.run_id}-{self.worker_index}-{self.user_id}-{self.seq}"
            group = group or request_id
            ctx = {
                **req.meta.columns(),
                "endpoint": req.path,
                "request_bytes": len(payload),
                "user_id": self.user_id,
                "seq": self.seq,
                "request_id": request_id,
                "abort": abort,
                "attempt": retries + 1,
                "request_group": group,
                "final": True,
                "reconnects": 0,
                **ctx_extra,
            }
            headers = {**self.headers, "X-Request-Id": request_id}
            t0 = time.time()
            if t_sched is not None and retries == 0:  # a retry is the client's, not an arrival
                ctx.update(t_sched=t_sched, sched_lag_ms=max(0.0, (t0 - t_sched) * 1000))
            plugin.trace(self.environment, ctx, template, urls, after * 1000 if abort else None)
            try:
                if abort:
                    status, resp, retry = self._abort(
                        payload, headers, name, ctx, req.path, t0, retries, after, policy, last
                    )
                else:
                    status, resp, retry = self._post(
                        payload, headers, name, ctx, req, retries, policy, last, template, hashes
                    )
            except GreenletExit:
                # Locust is stopping this user mid-request (the run ended): the request still gets its row
                plugin.cut(self.environment, ctx, t0, (time.time() - t0) * 1000)
                raise
            finally:
                plugin.attempt_done(self.environment)
            if retry is None:
                break
            gevent.sleep(retry_policy.delay(retries, self.jitter.random(), retry))  # the client's backoff
            retries += 1
        self.last_group = group  # a replay links the recorded retries that follow to it
        if status is None and not abort and self.refused_backoff:
            # nobody answering (refused, reset, timed out): back off as a real client would, instead of
            # spinning thousands of refused requests per second while the server is down
            gevent.sleep(self.refused_backoff)
        return status, resp
