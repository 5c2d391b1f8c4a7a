"""Faults by hand in Locust's web UI: a page (``/mmchaos/faults``) whose form lists only what the server under load
can take, and a panel tab listing every fault of the run (scheduled or by hand) with its outcome.

The Locust process never injects a fault: it relays the form to the fault control of the process that started the
server (``--fault-control URL``, printed by ``mmchaos serve``; harness/injection/control.py), which checks it with the
one rule and fires it at the pids it recorded. Its list of faults is polled every ``POLL_S`` into the panel.
"""

from __future__ import annotations

import logging
from pathlib import Path

import gevent
import requests
from flask import Response, jsonify, request

log = logging.getLogger("mmchaos")
PAGE = Path(__file__).with_name("faults.html")
POLL_S = 1.0
TIMEOUT_S = 5.0
NO_CONTROL = (
    "no fault control: start the server with `mmchaos serve` (or a campaign) and pass the --fault-control URL it prints"
)


class FaultRelay:
    """This run's view of the fault control: the rows it last listed, and the form's requests relayed to it."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.rows: list[dict] = []
        self.error = ""  # why the last poll failed (the panel says it)
        self.greenlet: gevent.Greenlet | None = None

    def start(self) -> FaultRelay:
        if self.url:
            self.greenlet = gevent.spawn(self._poll_loop)
        return self

    def stop(self) -> None:
        if self.greenlet is not None:
            self.greenlet.kill(block=False)

    def _poll_loop(self) -> None:
        while True:
            self.poll()
            gevent.sleep(POLL_S)

    def poll(self) -> None:
        try:
            r = requests.get(self.url + "/faults", timeout=TIMEOUT_S)
            r.raise_for_status()
            self.rows, self.error = r.json(), ""
        except (requests.RequestException, ValueError) as e:
            self.error = f"fault control {self.url}: {type(e).__name__}"

    def offer(self) -> tuple[dict, int]:
        if not self.url:
            return {"error": NO_CONTROL, "kinds": {}}, 200
        try:
            r = requests.get(self.url + "/faults/offer", timeout=TIMEOUT_S)
            return r.json(), r.status_code
        except (requests.RequestException, ValueError) as e:
            return {"error": f"fault control {self.url} does not answer ({type(e).__name__})", "kinds": {}}, 502

    def fire(self, body) -> tuple[dict, int]:
        if not self.url:
            return {"error": NO_CONTROL}, 400
        try:
            r = requests.post(self.url + "/faults", json=body, timeout=TIMEOUT_S)
            got = r.json(), r.status_code
        except (requests.RequestException, ValueError) as e:
            return {"error": f"fault control {self.url} does not answer ({type(e).__name__})"}, 502
        self.poll()  # the panel shows it at its next refresh
        return got


def register_routes(bp, web_ui, relay: FaultRelay) -> None:
    @bp.route("/mmchaos/faults")
    @web_ui.auth_required_if_enabled
    def mmchaos_faults_page():
        return Response(PAGE.read_text(), mimetype="text/html")

    @bp.route("/mmchaos/faults/offer")
    @web_ui.auth_required_if_enabled
    def mmchaos_faults_offer():
        body, status = relay.offer()
        return jsonify(body), status

    @bp.route("/mmchaos/faults/list")
    @web_ui.auth_required_if_enabled
    def mmchaos_faults_list():
        return jsonify({"rows": relay.rows, "error": relay.error if relay.url else NO_CONTROL})

    @bp.route("/mmchaos/faults/fire", methods=["POST"])
    @web_ui.auth_required_if_enabled
    def mmchaos_faults_fire():
        body, status = relay.fire(request.get_json(silent=True))
        return jsonify(body), status


def rows_for_panel(relay: FaultRelay | None) -> list[dict]:
    """The faults tab: one row per fault, newest first."""
    if relay is None or not relay.url:
        return [{"time": "", "fault": "(no fault control)", "outcome": "", "detail": NO_CONTROL}]
    t0 = next((r["t_injected"] for r in relay.rows if r.get("t_injected")), None)
    rows = [
        {
            "time": f"+{r['t_injected'] - t0:.1f} s" if t0 and r.get("t_injected") else "",
            "fault": r.get("fault", ""),
            "source": r.get("source", ""),
            "target": r.get("target", ""),
            "outcome": r.get("outcome", ""),
            "detail": r.get("detail", ""),
        }
        for r in reversed(relay.rows)
    ]
    head = [{"time": "", "fault": "(fire one)", "detail": "open ./mmchaos/faults"}]
    if relay.error:
        head.insert(0, {"time": "", "fault": "(error)", "detail": relay.error})
    return head + rows
