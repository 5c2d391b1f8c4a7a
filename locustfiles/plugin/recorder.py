"""The per-request recorder: exactly one REQUESTS row for every request sent, whatever happened to it.

It listens to Locust's request event (fired once per request by FastHttpSession, success or failure), so it
counts what Locust counts, plus the requests cut by the end of the run (the plugin's cut hook: they are no Locust
request). Rows are flushed to Parquet parts every second (mmchaos.tables.PartWriter), into the results folder or,
on a Locust worker, to the master (the plugin's table_writer decides).
"""

from __future__ import annotations

import gevent

from mmchaos import schema
from mmchaos.outcomes import cause_of, error_text, outcome_of, status_of
from mmchaos.tables import PartWriter, process_tag


class Recorder:
    """Attach to a Locust environment; writes the REQUESTS rows through ``writer``."""

    def __init__(
        self,
        environment,
        writer: PartWriter,
        run_id: str,
        config: str,
        trial: int,
        cut_hook,
        redactor,
        interval: float = 1.0,
    ):
        self.writer = writer
        self.run_id, self.config, self.trial = run_id, config, trial
        self.worker = process_tag()
        self.interval = interval
        self.rows_seen = 0
        self._closed = False
        self.environment = environment
        environment.events.request.add_listener(self.on_request)
        self.cut_hook = cut_hook
        self.redact = redactor  # server text can quote a key (vLLM echoes its arguments): none reaches a row
        cut_hook.add_listener(self.on_cut)
        self._loop = gevent.spawn(self._flush_loop)

    def on_request(
        self,
        request_type,
        name,
        response_time,
        response_length,
        response=None,
        context=None,
        exception=None,
        start_time=None,
        url=None,
        **_,
    ):
        ctx = context or {}
        status = status_of(response)
        # marking a request a success in Locust (catch_response) clears its exception; the cause stays on it
        exception = exception or getattr(response, "error", None)
        outcome = outcome_of(status, exception, bool(ctx.get("abort")))
        # an answer the oracle found wrong is ok as HTTP goes: its row says why in its error
        error = error_text(response, exception, status) or ctx.get("wrong_answer")
        self._add(ctx, name, start_time, response_time, status, outcome, error, response_length)

    def on_cut(self, context, start_time, response_time, **_):
        """A request Locust stopped mid-flight at the end of the run (no request event: not a Locust failure)."""
        self._add(context, None, start_time, response_time, None, schema.CUT, "cut by the end of the run", 0)

    def _add(self, ctx: dict, name, start_time, response_time, status, outcome, error, response_length) -> None:
        self.rows_seen += 1
        expected = ctx.get("expected_status")
        self.writer.add(
            {
                "run_id": self.run_id,
                "config": self.config,
                "trial": self.trial,
                "worker": self.worker,
                "user_id": ctx.get("user_id"),
                "seq": ctx.get("seq"),
                "request_id": ctx.get("request_id"),
                "kind": ctx.get("kind") or "other",
                "case": ctx.get("case"),
                "probe": ctx.get("probe"),
                "expected_status": expected,
                "endpoint": ctx.get("endpoint") or name,
                "t_start": start_time,
                "latency_ms": response_time,
                "t_sched": ctx.get("t_sched"),
                "sched_lag_ms": ctx.get("sched_lag_ms"),
                "status": status,
                "outcome": outcome,
                "error": self.redact(error) if error else None,
                "cause": cause_of(status, outcome, expected),
                "attempt": ctx.get("attempt", 1),
                "request_group": ctx.get("request_group") or ctx.get("request_id"),
                "final": ctx.get("final", True),
                "reconnects": ctx.get("reconnects", 0),
                "consistent": ctx.get("consistent"),
                "n_images": ctx.get("n_images", 0),
                "image_ids": ctx.get("image_ids"),
                "image_hashes": ctx.get("image_hashes"),
                "n_videos": ctx.get("n_videos", 0),
                "video_hashes": ctx.get("video_hashes"),
                "request_bytes": ctx.get("request_bytes"),
                "response_bytes": response_length,
            }
        )

    def _flush_loop(self) -> None:
        while True:
            gevent.sleep(self.interval)  # the flush period: bounds what a crash can lose
            self.flush(pause=lambda: gevent.sleep(0))

    def flush(self, pause=None) -> int:
        # in the hub's thread on purpose (native threads under gevent's monkey-patching deadlock on patched locks,
        # seen: pyarrow's first use from a threadpool thread); the loop's flush gives way between slices of rows,
        # to the greenlets ready to run (answers that came in), so they wait ~1 ms for it, not ~5
        return self.writer.flush(pause)

    def close(self) -> None:
        # test_stop and quitting both close: killing the flush loop yields, so the second call can come meanwhile
        if self._closed:
            return
        self._closed = True
        self.environment.events.request.remove_listener(self.on_request)
        self.cut_hook.remove_listener(self.on_cut)
        self._loop.kill()
        self.writer.flush()
