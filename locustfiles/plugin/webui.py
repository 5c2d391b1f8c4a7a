"""The mmchaos panel in Locust's web UI: the verdict and the gates, crash and drift events, outcomes by kind, server
health and mm-cache hits, and a timeline page.

It uses the extension points of Locust's own (React) web UI:

- ``web_ui.template_args["extended_tabs"]`` / ``["extended_tables"]`` add four tabs and their table columns
  (the same mechanism as Locust's ``examples/extend_web_ui.py``);
- an ``after_request`` hook adds ``extended_stats`` (the rows of those tables) to ``/stats/requests``, which the
  UI polls every 2 s while a test runs, and sets its ``state`` as the UI must read it (``_runner_state``); the
  UI renders every cell as React text, so server text (error messages, log lines) is escaped by construction;
- routes of a Flask blueprint on ``web_ui.app``: ``/mmchaos/state`` (the whole live state as JSON) and
  ``/mmchaos/timeline`` (a page drawing health, drift, crashes and the mm-cache hit rate over the run; it
  reads the state JSON and sets every text with ``textContent``), both linked from the UI's "Download Data"
  tab (``extended_csv_files``) and from the verdict tab.

The state itself is kept by live_feed.py, with or without the web UI, in the process's run state
(``environment.mmchaos``, run_state.py).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from flask import Blueprint, Response, jsonify, request
from locust.runners import STATE_INIT, STATE_SPAWNING

from .fault_form import FaultRelay, register_routes
from .panel_tables import TABLES, TABS, tables
from .web_form import apply_mangled_form_fields

log = logging.getLogger("mmchaos")
TIMELINE_PAGE = Path(__file__).with_name("timeline.html")


def register(hooks) -> None:
    """Wire the panel into Locust's web UI (called once per set of Locust's events by the plugin, after its own
    listeners: the run state is made then)."""
    hooks.init.add_listener(_init)


def _runner_state(environment) -> str | None:
    """The run's state as a UI must show it. A run started with a shape (ours always are) stays "ready" until
    test_start has run and users spawn: 1.7 s here when the image pool is not yet on disk, more on a loaded
    machine. Locust's UI polls 2 s after its Start (and /stats/requests is memoized for 2 s); a "ready" read
    then sends it back to the start form, where it stops polling while the run goes on. A live shape greenlet
    means a run was started (one whose start failed leaves it dead)."""
    runner = environment.runner
    state = getattr(runner, "state", None)
    shape = getattr(runner, "shape_greenlet", None)
    if state == STATE_INIT and shape is not None and not shape.dead:
        return STATE_SPAWNING
    return state


def _init(environment, web_ui=None, **_):
    run_state = environment.mmchaos
    panel = run_state.live.panel
    if web_ui is None or panel is None:
        return
    web_ui.template_args["extended_tabs"] = TABS
    web_ui.template_args["extended_tables"] = TABLES
    web_ui.template_args["extended_csv_files"] = [
        {"href": "./mmchaos/timeline", "title": "mmchaos timeline (page)"},
        {"href": "./mmchaos/faults", "title": "mmchaos faults: fire one by hand (page)"},
        {"href": "./mmchaos/state", "title": "mmchaos panel state (JSON)"},
    ]
    base = getattr(environment.parsed_options, "web_base_path", "") or ""
    bp = Blueprint("mmchaos_panel", __name__, url_prefix=base or None)

    def state() -> dict:
        return panel.state(_runner_state(environment), environment.parsed_options)

    @bp.route("/mmchaos/state")
    @web_ui.auth_required_if_enabled
    def mmchaos_state():
        return jsonify(state())

    @bp.route("/mmchaos/timeline")
    @web_ui.auth_required_if_enabled
    def mmchaos_timeline():
        return Response(TIMELINE_PAGE.read_text(), mimetype="text/html")

    panel.fault_relay = relay = FaultRelay(getattr(environment.parsed_options, "fault_control", "") or "").start()
    environment.events.quit.add_listener(lambda **_: relay.stop())
    register_routes(bp, web_ui, panel.fault_relay)
    web_ui.app.register_blueprint(bp)

    @web_ui.app.before_request
    def _start_form():
        if request.method == "POST" and request.path == base + "/swarm":
            apply_mangled_form_fields(environment.parsed_options, request.form)
            # the plugin decides "generate a results folder per run" once, from the command line; a folder typed
            # in the form is this run's, an empty field asks for a generated one
            if "results_dir" in request.form:
                run_state.auto_results_dir = not request.form["results_dir"].strip()

    @web_ui.app.after_request
    def _extend_stats(response):
        if request.path != base + "/stats/requests" or response.status_code != 200:
            return response
        data = json.loads(response.get_data())
        data["state"] = _runner_state(environment)
        try:
            data["extended_stats"] = tables(panel, state())
        except Exception:  # never break Locust's own stats for the panel's sake
            log.exception("mmchaos panel: extending /stats/requests")
        response.set_data(json.dumps(data))
        return response
