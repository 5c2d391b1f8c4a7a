"""The mmchaos plugin for Locust: custom arguments, the recorder, the watchers, the request budget, the live state
(live.py) with its web UI panel, and the gates that set the run's exit code. A locustfile calls :func:`register`
once, at import (Locust parses its command line after importing the locustfile); a second call, from another
locustfile of the same process, does nothing.

Roles: the process that owns the test (master or standalone) resolves the run's ids, results folder and model,
runs the watchers and judges the gates; the processes that send requests (workers or standalone) record them.
"""

from __future__ import annotations

import itertools
import logging
import signal
import time
import uuid
from pathlib import Path

import gevent
import requests
from locust import events
from locust.event import EventHook
from locust.exception import StopUser
from locust.runners import STATE_INIT, MasterRunner, WorkerRunner

from mmchaos import options, paths
from mmchaos.auth import api_key, auth_headers
from mmchaos.redact import Redactor

from . import gates, live, webui
from .recorder import Recorder
from .watchers import Watchers

log = logging.getLogger("mmchaos")


class Session:
    """This process's part of the current test run."""

    registered = False
    recorder: Recorder | None = None
    watchers: Watchers | None = None
    auto_results_dir = False
    auto_run_id = False
    sent = 0  # requests started by this process in this run (the --max-requests budget)
    user_ids = itertools.count()
    # requests cut by the end of the run: (context, start_time, response_time); they are no Locust request
    cut_hook = EventHook()
    redactor = Redactor()  # this process's secrets (its MMCHAOS_API_KEY), masked in rows and the web UI


def register() -> None:
    """Add mmchaos's arguments and listeners to Locust's events, in order: ours, then the web UI panel's (it
    shows the live state, which ours make)."""
    if Session.registered:
        return
    Session.registered = True
    events.init_command_line_parser.add_listener(_add_arguments)
    events.init.add_listener(_init)
    events.test_start.add_listener(_test_start)
    events.test_stop.add_listener(_test_stop)
    events.quitting.add_listener(_quitting)
    events.quit.add_listener(_quit)
    webui.register(Session)


def cut(environment, context: dict, start_time: float, response_time: float) -> None:
    """A request still in flight when Locust stopped its user: it keeps its row, and is no Locust failure."""
    Session.cut_hook.fire(context=context, start_time=start_time, response_time=response_time)


def opts(environment):
    return environment.parsed_options


def next_user_id() -> int:
    return next(Session.user_ids)


def take_budget(environment) -> None:
    """Count one request against --max-requests; stop this user once the budget is spent."""
    budget = opts(environment).max_requests
    if budget and Session.sent >= budget:
        runner = environment.runner
        if runner is not None and not isinstance(runner, WorkerRunner):
            runner.quit() if opts(environment).headless else runner.stop()
        raise StopUser()
    Session.sent += 1


def _add_arguments(parser):
    options.register(parser)


def _init(environment, **_):
    # Locust installs its SIGTERM handler only after a headless shape test has finished, so until then SIGTERM
    # kills the process with rows unflushed. End the shape instead: Locust then quits its usual way.
    gevent.signal_handler(signal.SIGTERM, lambda: _end_shape_on_sigterm(environment))
    Session.redactor = Redactor.from_environment([api_key() or ""])
    live.init(environment, Session.cut_hook, Session.redactor)
    o = opts(environment)
    if o is None:
        return
    Session.auto_results_dir = not o.results_dir
    Session.auto_run_id = not o.run_id


def _end_shape_on_sigterm(environment) -> None:
    runner = environment.runner
    if runner is None or environment.shape_class is None:
        return  # no shape: Locust's own SIGTERM handler is in place and does the shutdown
    if runner.shape_greenlet is not None:
        runner.shape_greenlet.kill(block=False)  # main() joins it, then quits the runner and shuts down
    elif runner.state == STATE_INIT:
        runner.quit()  # the shape has not started yet


def resolve_model(host: str) -> str:
    r = requests.get(host.rstrip("/") + "/v1/models", headers=auth_headers(), timeout=10)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def _test_start(environment, **_):
    o = opts(environment)
    runner = environment.runner
    Session.sent = 0
    owner = not isinstance(runner, WorkerRunner)
    if owner:
        # decided here, once: the master sends its options to the workers with the spawn message
        if Session.auto_run_id:
            o.run_id = uuid.uuid4().hex[:12]
        if Session.auto_results_dir:
            o.results_dir = str(paths.results_dir() / "adhoc" / f"{time.strftime('%Y%m%d-%H%M%S')}-{o.run_id}")
        if not o.model:
            try:
                o.model = resolve_model(environment.host)
            except (requests.RequestException, KeyError, IndexError, ValueError) as e:
                log.error("cannot read the model name from %s/v1/models (%s): pass --model", environment.host, e)
        Path(o.results_dir).mkdir(parents=True, exist_ok=True)
        if not o.no_watch and environment.host:
            Session.watchers = Watchers(environment.host, o.results_dir, headers=auth_headers(),
                                        health_interval=o.health_interval,
                                        metrics_interval=o.metrics_interval).start()
    if not isinstance(runner, MasterRunner):
        Session.recorder = Recorder(environment, o.results_dir, o.run_id, o.config_name, o.trial, Session.cut_hook,
                                    Session.redactor)
    live.test_start(environment, Session.watchers)


def _stop_all():
    if Session.recorder:
        Session.recorder.close()
        Session.recorder = None
    if Session.watchers:
        Session.watchers.stop()
        Session.watchers = None


def _test_stop(environment, **_):
    _stop_all()
    live.test_stop()


def _quitting(environment, **_):
    """Locust decides its exit code right after this: the gates decide it (a code set already, 2 when the run
    could not run, stands)."""
    live.quitting()
    panel = live.Live.panel
    if panel is None or isinstance(environment.runner, WorkerRunner) or opts(environment) is None:
        return
    if environment.process_exit_code is not None:
        return
    if not panel.counts().attempts:
        log.error("mmchaos: no request was sent")
        environment.process_exit_code = 2
        return
    judged = panel.gates(opts(environment))
    for g in judged:
        if g.state == gates.FAILED:
            log.error("mmchaos: gate failed: %s", g.text)
    environment.process_exit_code = gates.exit_code(judged)


def _quit(exit_code, **_):
    # the last event of a Locust process, after its runner has stopped every user; not `quitting`, which
    # Locust fires before it stops the users (rows of requests still in flight would be lost)
    _stop_all()
