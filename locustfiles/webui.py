"""The mmchaos panel in Locust's web UI: crash and drift events, outcomes by kind, server health and mm-cache hits.

It uses the extension points of Locust's own (React) web UI, so no JavaScript of ours is involved:

- ``web_ui.template_args["extended_tabs"]`` / ``["extended_tables"]`` add three tabs and their table columns
  (the same mechanism as Locust's ``examples/extend_web_ui.py``);
- an ``after_request`` hook adds ``extended_stats`` (the rows of those tables) to ``/stats/requests``, which the
  UI polls every 2 s while a test runs; the UI renders every cell as React text, so server text (error
  messages, log lines) is escaped by construction;
- ``/mmchaos/state`` (a route of a Flask blueprint on ``web_ui.app``) serves the whole panel state as JSON at
  any time, linked from the UI's "Download Data" tab (``extended_csv_files``).

Where the data comes from, all in the process that owns the test (master or standalone):

- server health over time: the watchers' ``on_health`` callback (``/health`` every 0.25 s), judged by the shared
  crash-from-health rule (mmchaos.health_rule);
- mm-cache hit rate: the watchers' ``/metrics`` samples (observed as the watchers write them), summed over the
  counters whose names look like ``vllm:*mm*cache_hits`` / ``_queries`` (names vary by version), "n/a" when
  the server exposes none;
- outcomes by kind and drift 503s: Locust's request event, classified exactly as the recorder classifies its
  rows. Standalone, the owner sees those events itself. In master/worker mode only workers see them: each
  worker adds its counts since its last report to the stats report Locust already sends to the master every
  3 s (``events.report_to_master`` -> ``events.worker_report``), including the final report at stop;
- crash events: ``--server-log PATH`` makes the panel tail that file and classify its lines with the signature
  table, which names the crash (e.g. ``detokenizer_assert``) and adds the drift and fatal lines as events.
"""

from __future__ import annotations

import json
import logging

import gevent
from flask import Blueprint, jsonify, request
from locust import events
from locust.runners import MasterRunner, WorkerRunner

from mmchaos import options
from mmchaos.logtail import LogTail
from mmchaos.signatures import Signatures

from .panel import LOG_POLL_S, Panel
from .web_form import apply_mangled_form_fields
from .panel_outcomes import Outcomes, classify_request
from .panel_tables import TABLES, TABS, tables

log = logging.getLogger("mmchaos")
REPORT_KEY = "mmchaos_panel"  # our entry in the workers' stats reports


class _Process:
    session = None  # the plugin's Session (given to register): the run's watchers and results-folder choice
    panel: Panel | None = None
    sigs: Signatures | None = None
    log_greenlet: gevent.Greenlet | None = None
    pending: dict[str, Outcomes] = {}  # worker: counts not yet reported, by run id
    run_id = ""  # worker: the run its requests belong to


def register(session) -> None:
    """Wire the panel into Locust (called once per process by the plugin, after its own listeners)."""
    _Process.session = session
    events.init.add_listener(_init)
    events.test_start.add_listener(_test_start)
    events.test_stop.add_listener(_test_stop)
    events.quitting.add_listener(_quitting)


def _signatures() -> Signatures:
    if _Process.sigs is None:
        _Process.sigs = Signatures.load()
    return _Process.sigs


def _runner_state(environment) -> str | None:
    return getattr(environment.runner, "state", None)


class MetricsTee:
    """Stands in for the watchers' metrics writer: writes as before and shows each row to the panel."""

    def __init__(self, writer, observe):
        self._writer, self._observe = writer, observe

    def add(self, row: dict) -> None:
        self._writer.add(row)
        try:
            self._observe(row)
        except Exception:  # the panel must never cost the watchers a row
            log.exception("mmchaos panel: metrics row")

    def __getattr__(self, name):
        return getattr(self._writer, name)


def _attach(environment, web_ui) -> None:
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        source = "the workers' stats reports to the master (every 3 s)"
    else:
        source = "request events in this Locust process"
    panel = _Process.panel = Panel(_signatures(), source)
    if isinstance(runner, MasterRunner):
        @environment.events.worker_report.add_listener
        def _on_worker_report(client_id, data, **_):
            for run_id, report in (data.get(REPORT_KEY) or {}).items():
                if run_id == panel.run_id:  # late reports of an earlier run are not this run's
                    panel.on_worker_report(client_id, report)
    else:
        environment.events.request.add_listener(panel.on_request)

    web_ui.template_args["extended_tabs"] = TABS
    web_ui.template_args["extended_tables"] = TABLES
    web_ui.template_args["extended_csv_files"] = [{"href": "./mmchaos/state", "title": "mmchaos panel state (JSON)"}]
    base = getattr(environment.parsed_options, "web_base_path", "") or ""
    bp = Blueprint("mmchaos_panel", __name__, url_prefix=base or None)

    @bp.route("/mmchaos/state")
    @web_ui.auth_required_if_enabled
    def mmchaos_state():
        return jsonify(panel.state(_runner_state(environment)))

    web_ui.app.register_blueprint(bp)

    @web_ui.app.before_request
    def _start_form():
        if request.method == "POST" and request.path == base + "/swarm":
            apply_mangled_form_fields(environment.parsed_options, request.form)
            # the plugin decides "generate a results folder per run" once, from the command line; a folder typed
            # in the form is this run's, an empty field asks for a generated one
            if "results_dir" in request.form:
                _Process.session.auto_results_dir = not request.form["results_dir"].strip()

    @web_ui.app.after_request
    def _extend_stats(response):
        if request.path != base + "/stats/requests" or response.status_code != 200:
            return response
        try:
            data = json.loads(response.get_data())
            data["extended_stats"] = tables(panel, _runner_state(environment))
            response.set_data(json.dumps(data))
        except Exception:  # never break Locust's own stats for the panel's sake
            log.exception("mmchaos panel: extending /stats/requests")
        return response


def _init(environment, web_ui=None, **_):
    if isinstance(environment.runner, WorkerRunner):
        environment.events.request.add_listener(_worker_on_request)
        environment.events.report_to_master.add_listener(_worker_report)
    elif web_ui is not None and environment.parsed_options is not None:
        _attach(environment, web_ui)


def _worker_on_request(response=None, context=None, exception=None, start_time=None, **_):
    kind, cat, error, drift = classify_request(_signatures(), response, context, exception)
    _Process.pending.setdefault(_Process.run_id, Outcomes()).add(kind, cat, start_time, error, drift)


def _worker_report(client_id, data, **_):
    pending, _Process.pending = _Process.pending, {}
    if pending:
        data[REPORT_KEY] = {run_id: o.to_report() for run_id, o in pending.items() if o}


def _test_start(environment, **_):
    o = environment.parsed_options
    if isinstance(environment.runner, WorkerRunner):
        _Process.run_id = o.run_id or ""  # the master's, received with the spawn message
        return
    panel = _Process.panel
    if panel is None or o is None:
        return
    _stop_log_tail()
    panel.reset(o.run_id)  # after the plugin's listener: the run id is decided
    panel.options = {opt.name: getattr(o, opt.name, None) for opt in options.OPTIONS}
    w = _Process.session.watchers
    if w is not None:
        panel.watchers, panel.watching = w, True
        previous = w.on_health

        def on_health(row, _prev=previous):
            if _prev:
                _prev(row)
            panel.on_health(row)

        w.on_health = on_health
        w.metrics = MetricsTee(w.metrics, panel.on_metric)
    path = getattr(o, "server_log", "") or ""
    if path:
        panel.server_log = path
        tail = LogTail(path)
        tail.skip_to_end()  # what the server logged before this run is not this run's
        _Process.log_greenlet = gevent.spawn(_tail_loop, panel, tail)


def _tail_loop(panel: Panel, tail: LogTail) -> None:
    while True:
        try:
            panel.read_log(tail)
            panel.log_error = None
        except OSError as e:
            panel.log_error = f"cannot read it: {e.strerror or e}"
        gevent.sleep(LOG_POLL_S)  # the tail's poll period


def _stop_log_tail() -> None:
    if _Process.log_greenlet is not None:
        _Process.log_greenlet.kill()
        _Process.log_greenlet = None


def _test_stop(environment, **_):
    # the log keeps being read a little after the stop: a crash at the end still gets its signature
    if _Process.log_greenlet is not None:
        g = _Process.log_greenlet
        gevent.spawn_later(5.0, lambda: g.kill())


def _quitting(environment, **_):
    _stop_log_tail()
