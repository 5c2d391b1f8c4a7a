"""The live state of a run (panel.py), kept by the process that owns the test, with or without the web UI:

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
from typing import ClassVar

import gevent
from locust.runners import MasterRunner, WorkerRunner
from locust.stats import StatsEntry

from mmchaos import options, schema
from mmchaos.logtail import LogTail
from mmchaos.signatures import Signatures

from . import open_loop
from .panel import LOG_POLL_S, Panel
from .panel_outcomes import Outcomes, classify_request, cut_attempt

log = logging.getLogger("mmchaos")
REPORT_KEY = "mmchaos_panel"  # our entry in the workers' stats reports
DUE_KEY = "mmchaos_due"  # open loop: a worker's requests due so far (a level, not a delta), by run id
VALID_NAMES = tuple(f"[{k}]" for k in schema.VALID_KINDS)  # how ChaosUser names the stats entries of valid kinds


class Live:
    """This process's part (the class is the process's single instance, like plugin.Session)."""

    panel: Panel | None = None  # the owner's
    sigs: Signatures | None = None
    log_greenlet: gevent.Greenlet | None = None
    pending: ClassVar[dict[str, Outcomes]] = {}  # worker: counts not yet reported, by run id
    run_id = ""  # worker: the run its requests belong to
    environment = None  # worker: its Locust environment (the pacer's home)


def signatures() -> Signatures:
    if Live.sigs is None:
        Live.sigs = Signatures.default()
    return Live.sigs


def valid_p95_ms(stats) -> float | None:
    """p95 response time of the valid kinds' attempts, as Locust's stats have them (None when there are none)."""
    merged = StatsEntry(stats, "valid requests", "", use_response_times_cache=False)
    for entry in stats.entries.values():
        if entry.name.endswith(VALID_NAMES):
            merged.extend(entry)
    return merged.get_response_time_percentile(0.95) if merged.num_requests else None


def init(environment, cut_hook, redactor) -> None:
    """At Locust's init: the owner makes the panel, a worker counts for its reports."""
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        Live.environment = environment
        environment.events.request.add_listener(_worker_on_request)
        cut_hook.add_listener(_worker_on_cut)
        environment.events.report_to_master.add_listener(_worker_report)
        return
    if environment.parsed_options is None:
        return
    if isinstance(runner, MasterRunner):
        source = "the workers' stats reports to the master (every 3 s)"
    else:
        source = "request events in this Locust process"
    panel = Live.panel = Panel(signatures(), source, redactor)
    panel.p95_ms = lambda: valid_p95_ms(environment.stats)
    if isinstance(runner, MasterRunner):

        def on_worker_report(client_id, data, **_):
            for run_id, report in (data.get(REPORT_KEY) or {}).items():
                if run_id == panel.run_id:  # late reports of an earlier run are not this run's
                    panel.on_worker_report(client_id, report)
            due = (data.get(DUE_KEY) or {}).get(panel.run_id)
            if due is not None:
                panel.worker_dues[client_id] = int(due)

        environment.events.worker_report.add_listener(on_worker_report)
    else:

        def on_request(response=None, context=None, exception=None, start_time=None, **_):
            panel.on_attempt(classify_request(signatures(), response, context, exception, start_time))

        environment.events.request.add_listener(on_request)
        cut_hook.add_listener(lambda context, start_time, **_: panel.on_attempt(cut_attempt(context, start_time)))


def backlog() -> int:
    """Open loop, in the owner: arrivals due and not yet sent (every user was busy), as last counted."""
    panel = Live.panel
    if panel is None or not panel.options.get("rate"):
        return 0
    return max(0, panel.due() - panel.outcomes.lags.total)


def _pending() -> Outcomes:
    return Live.pending.setdefault(Live.run_id, Outcomes())


def _worker_on_request(response=None, context=None, exception=None, start_time=None, **_):
    _pending().add(classify_request(signatures(), response, context, exception, start_time))


def _worker_on_cut(context, start_time, **_):
    _pending().add(cut_attempt(context, start_time))


def _worker_report(client_id, data, **_):
    pending, Live.pending = Live.pending, {}
    if pending:
        data[REPORT_KEY] = {run_id: o.to_report() for run_id, o in pending.items() if o}
    pacer = open_loop.pacer(Live.environment) if Live.environment is not None else None
    if pacer is not None:
        data[DUE_KEY] = {Live.run_id: pacer.due()}


def test_start(environment, watchers) -> None:
    """After the plugin decided the run's id and started its watchers."""
    o = environment.parsed_options
    if isinstance(environment.runner, WorkerRunner):
        Live.run_id = o.run_id or ""  # the master's, received with the spawn message
        return
    panel = Live.panel
    if panel is None or o is None:
        return
    _stop_log_tail()
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
        Live.log_greenlet = gevent.spawn(_tail_loop, panel, tail)


def _tail_loop(panel: Panel, tail: LogTail) -> None:
    while True:
        try:
            panel.read_log(tail)
            panel.log_error = None
        except OSError as e:
            panel.log_error = f"cannot read it: {e.strerror or e}"
        gevent.sleep(LOG_POLL_S)  # the tail's poll period


def _stop_log_tail() -> None:
    if Live.log_greenlet is not None:
        Live.log_greenlet.kill()
        Live.log_greenlet = None


def test_stop() -> None:
    # the log keeps being read a little after the stop: a crash at the end still gets its signature
    if Live.log_greenlet is not None:
        g = Live.log_greenlet
        gevent.spawn_later(5.0, lambda: g.kill())


def quitting() -> None:
    _stop_log_tail()
