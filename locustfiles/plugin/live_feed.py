"""The live state of a run (live_state.py), kept by the process that owns the test, with or without the web UI:

- outcomes by kind and the verdict's counts: Locust's request event (and the plugin's cut hook), classified as the
  recorder classifies its rows. Standalone, the owner sees those events itself; in master/worker mode each
  worker adds its counts since its last report to the stats report Locust already sends to the master every 3 s
  (``events.report_to_master`` -> ``events.worker_report``), including the final report at stop;
- server health and mm-cache hits: the watchers' /health polls (judged by mmchaos.health_rule) and /metrics
  samples, observed as the watchers write them;
- crash names and drift lines: ``--server-log PATH`` makes the owner tail that file and classify its lines with
  the signature table, which names the crash (e.g. ``detokenizer_assert``);
- the p95 latency of valid requests for the gates: Locust's own stats (merged from the workers on a master).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import gevent
from locust.event import EventHook
from locust.runners import MasterRunner, WorkerRunner
from locust.stats import StatsEntry

from mmchaos import options, schema
from mmchaos.logtail import LogTail
from mmchaos.signatures import Signatures

from . import open_loop
from .live_state import LOG_POLL_S, LiveState
from .outcomes import Outcomes, classify_request, cut_attempt

log = logging.getLogger("mmchaos")
REPORT_KEY = "mmchaos_panel"  # our entry in the workers' stats reports
DUE_KEY = "mmchaos_due"  # open loop: a worker's requests due so far (a level, not a delta), by run id
VALID_NAMES = tuple(f"[{k}]" for k in schema.VALID_KINDS)  # how ChaosUser names the stats entries of valid kinds


def valid_p95_ms(stats) -> float | None:
    """p95 response time of the valid kinds' attempts, as Locust's stats have them (None when there are none)."""
    merged = StatsEntry(stats, "valid requests", "", use_response_times_cache=False)
    for entry in stats.entries.values():
        if entry.name.endswith(VALID_NAMES):
            merged.extend(entry)
    return merged.get_response_time_percentile(0.95) if merged.num_requests else None


class Live:
    """This process's live state: one per Locust Environment, in its run state (run_state.py)."""

    def __init__(self) -> None:
        self.panel: LiveState | None = None  # the owner's
        self.sigs = Signatures.default()
        self.log_greenlet: gevent.Greenlet | None = None
        self.pending: dict[str, Outcomes] = {}  # worker: counts not yet reported, by run id
        self.run_id = ""  # worker: the run its requests belong to
        self.environment = None  # worker: its Locust environment (the pacer's home)
        self._listeners: list[tuple[EventHook, Callable]] = []  # on Locust's events, until quit

    def _listen(self, hook: EventHook, listener: Callable) -> None:
        hook.add_listener(listener)
        self._listeners.append((hook, listener))

    def init(self, environment, cut_hook, redactor) -> None:
        """At Locust's init: the owner makes the panel, a worker counts for its reports."""
        runner = environment.runner
        if isinstance(runner, WorkerRunner):
            self.environment = environment
            self._listen(environment.events.request, self._worker_on_request)
            self._listen(cut_hook, self._worker_on_cut)
            self._listen(environment.events.report_to_master, self._worker_report)
            return
        if environment.parsed_options is None:
            return
        if isinstance(runner, MasterRunner):
            source = "the workers' stats reports to the master (every 3 s)"
        else:
            source = "request events in this Locust process"
        sigs = self.sigs
        panel = self.panel = LiveState(sigs, source, redactor)
        panel.p95_ms = lambda: valid_p95_ms(environment.stats)
        if isinstance(runner, MasterRunner):

            def on_worker_report(client_id, data, **_):
                for run_id, report in (data.get(REPORT_KEY) or {}).items():
                    if run_id == panel.run_id:  # late reports of an earlier run are not this run's
                        panel.on_worker_report(client_id, report)
                due = (data.get(DUE_KEY) or {}).get(panel.run_id)
                if due is not None:
                    panel.worker_dues[client_id] = int(due)

            self._listen(environment.events.worker_report, on_worker_report)
        else:

            def on_request(response=None, context=None, exception=None, start_time=None, **_):
                panel.on_attempt(classify_request(sigs, response, context, exception, start_time))

            self._listen(environment.events.request, on_request)
            self._listen(cut_hook, lambda context, start_time, **_: panel.on_attempt(cut_attempt(context, start_time)))

    def backlog(self) -> int:
        """Open loop, in the owner: arrivals due and not yet sent (every user was busy), as last counted."""
        panel = self.panel
        if panel is None or not panel.options.get("rate"):
            return 0
        return max(0, panel.due() - panel.outcomes.lags.total)

    def _pending(self) -> Outcomes:
        return self.pending.setdefault(self.run_id, Outcomes())

    def _worker_on_request(self, response=None, context=None, exception=None, start_time=None, **_):
        self._pending().add(classify_request(self.sigs, response, context, exception, start_time))

    def _worker_on_cut(self, context, start_time, **_):
        self._pending().add(cut_attempt(context, start_time))

    def _worker_report(self, client_id, data, **_):
        pending, self.pending = self.pending, {}
        if pending:
            data[REPORT_KEY] = {run_id: o.to_report() for run_id, o in pending.items() if o}
        pacer = open_loop.pacer(self.environment) if self.environment is not None else None
        if pacer is not None:
            data[DUE_KEY] = {self.run_id: pacer.due()}

    def test_start(self, environment, watchers) -> None:
        """After the plugin decided the run's id and started its watchers."""
        o = environment.parsed_options
        if isinstance(environment.runner, WorkerRunner):
            self.run_id = o.run_id or ""  # the master's, received with the spawn message
            return
        panel = self.panel
        if panel is None or o is None:
            return
        self._stop_log_tail()
        panel.reset(o.run_id)
        panel.options = {opt.name: getattr(o, opt.name, None) for opt in options.OPTIONS}
        if isinstance(environment.runner, MasterRunner):
            panel.due = lambda: sum(panel.worker_dues.values())
        else:
            panel.due = lambda: p.due() if (p := open_loop.pacer(environment)) is not None else 0
        if watchers is not None:
            panel.watchers, panel.watching = watchers, True
            watchers.observers.append(panel)
        path = getattr(o, "server_log", "") or ""
        if path:
            panel.server_log = path
            tail = LogTail(path)
            tail.skip_to_end()  # what the server logged before this run is not this run's
            self.log_greenlet = gevent.spawn(_tail_loop, panel, tail)

    def _stop_log_tail(self) -> None:
        if self.log_greenlet is not None:
            self.log_greenlet.kill()
            self.log_greenlet = None

    def test_stop(self) -> None:
        # the log keeps being read a little after the stop: a crash at the end still gets its signature
        if self.log_greenlet is not None:
            g = self.log_greenlet
            gevent.spawn_later(5.0, lambda: g.kill())

    def quitting(self) -> None:
        self._stop_log_tail()

    def quit(self) -> None:
        """At the end of the process (or of an in-process Environment): off Locust's events, which another
        Environment of this process may share."""
        for hook, listener in self._listeners:
            hook.remove_listener(listener)
        self._listeners.clear()


def _tail_loop(panel: LiveState, tail: LogTail) -> None:
    while True:
        try:
            panel.read_log(tail)
            panel.log_error = None
        except OSError as e:
            panel.log_error = f"cannot read it: {e.strerror or e}"
        gevent.sleep(LOG_POLL_S)  # the tail's poll period
