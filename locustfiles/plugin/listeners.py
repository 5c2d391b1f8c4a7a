"""The mmchaos plugin for Locust: custom arguments, the recorder, the watchers, the request budget, the live state
(live_feed.py) with its web UI panel, and the gates that set the run's exit code. A locustfile calls :func:`register`
once, at import (Locust parses its command line after importing the locustfile); a second call, from another
locustfile of the same process, does nothing. At Locust's init the plugin makes the process's run state
(run_state.py) and keeps it on the Environment: ``environment.mmchaos``.

Roles: the process that owns the test (master or standalone) resolves the run's ids, results folder and model,
runs the watchers and judges the gates; the processes that send requests (workers or standalone) record them.
Where a table's rows go is decided once, in :func:`table_writer`: a worker ships them to its master
(shipping.py), whatever machine it runs on; the master and a standalone Locust write them into the run's folder.
"""

from __future__ import annotations

import logging
import signal
import time
import uuid
from pathlib import Path

import gevent
import gevent.util
import requests
from locust import events
from locust.exception import StopUser
from locust.runners import STATE_INIT, MasterRunner, WorkerRunner

from mmchaos import arrivals, options, paths, schema
from mmchaos.auth import api_key, auth_headers
from mmchaos.payloads import routes
from mmchaos.redact import Redactor
from mmchaos.tables import PartWriter, table_dir

from . import gates, open_loop, shipping, webui
from .recorder import Recorder
from .run_state import RunState
from .tracing import Tracer
from .watchers import Watchers

log = logging.getLogger("mmchaos")
END_MARGIN_S = 5.0  # past the request timeout: the answer's row being written


def register(hooks=events) -> None:
    """Add mmchaos's arguments and listeners to Locust's events (``hooks``: Locust's own, which its main() gives
    the Environment), in order: ours, then the web UI panel's (it shows the live state, which ours make). Once
    per set of events: the mark is kept on them."""
    if getattr(hooks, "mmchaos_registered", False):
        return
    hooks.mmchaos_registered = True
    hooks.init_command_line_parser.add_listener(_add_arguments)
    hooks.init.add_listener(_init)
    hooks.test_start.add_listener(_test_start)
    hooks.test_stopping.add_listener(open_loop.test_stopping)
    hooks.test_stop.add_listener(_test_stop)
    hooks.quitting.add_listener(_quitting)
    webui.register(hooks)


def cut(environment, context: dict, start_time: float, response_time: float) -> None:
    """A request still in flight when Locust stopped its user: it keeps its row, and is no Locust failure."""
    environment.mmchaos.cut_hook.fire(context=context, start_time=start_time, response_time=response_time)


def trace(environment, context: dict, template: bytes, urls, abort_after_ms: float | None) -> None:
    """Keep what a request attempt sends, as it goes out (when this run keeps a trace)."""
    tracer = environment.mmchaos.tracer
    if tracer is not None:
        tracer.record(context, template, urls, abort_after_ms)


def opts(environment):
    return environment.parsed_options


def table_writer(environment, table: str) -> PartWriter:
    """The writer of ``table`` (a name of mmchaos.schema.TABLES) for this process's current run: on a Locust
    worker its parts go to the master over Locust's messages, elsewhere into the run's results folder."""
    o = opts(environment)
    outbox = environment.mmchaos.outbox
    if outbox is not None:
        return PartWriter(None, schema.TABLES[table], sink=outbox.sink(o.run_id, o.results_dir, table))
    return PartWriter(table_dir(o.results_dir, table), schema.TABLES[table])


def take_budget(environment) -> None:
    """Count one request attempt against --max-requests (and as in flight until ``attempt_done``); stop this user
    once the budget is spent, and end the run when the last attempt sent has come back."""
    budget = opts(environment).max_requests
    state = environment.mmchaos
    if budget and state.sent >= budget:
        runner = environment.runner
        if not state.ending and runner is not None and not isinstance(runner, WorkerRunner):
            state.ending = True
            gevent.spawn(_end_when_answered, environment)
        raise StopUser()
    state.sent += 1
    state.in_flight += 1


def attempt_done(environment) -> None:
    state = environment.mmchaos
    state.in_flight -= 1
    if state.ending and state.in_flight <= 0:
        state.settled.set()


def _end_when_answered(environment) -> None:
    """Quit (headless) or stop (web UI) once no attempt is in flight: quitting when the budget ran out cut the
    requests still out, and their rows said so. Users waiting to send have sent nothing and are stopped. Bounded by
    one request's timeout. In a greenlet of its own: stopping the users from one of them would kill it with the quit
    half done."""
    o, state = opts(environment), environment.mmchaos
    if state.in_flight <= 0:
        state.settled.set()
    state.settled.wait(timeout=o.request_timeout + END_MARGIN_S)
    runner = environment.runner
    (runner.quit if o.headless else runner.stop)()


def _add_arguments(parser):
    options.register(parser)


def _init(environment, **_):
    state = environment.mmchaos = RunState(
        environment,
        redactor=Redactor.from_environment([api_key() or ""]),
        main=gevent.getcurrent(),  # Locust's main(), which a headless master's wait for workers blocks
    )

    def on_quit(**_):  # the last event of a Locust process; it names no Environment: this one's, taken off after
        _quit(environment)
        environment.events.quit.remove_listener(on_quit)

    environment.events.quit.add_listener(on_quit)
    # Locust installs its SIGTERM handler only after a headless shape test has finished, so until then SIGTERM
    # kills the process with rows unflushed. End the shape instead: Locust then quits its usual way.
    gevent.signal_handler(signal.SIGTERM, lambda: _end_shape_on_sigterm(environment))
    # what every greenlet is waiting on, for a run that stalls (the campaign runner asks before it stops one)
    gevent.signal_handler(
        signal.SIGUSR2,
        lambda: log.error("mmchaos: greenlets on SIGUSR2:\n%s", "\n".join(gevent.util.format_run_info())),
    )
    state.live.init(environment, state.cut_hook, state.redactor)
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        state.outbox = shipping.Outbox(environment)
    elif isinstance(runner, MasterRunner):
        state.inbox = shipping.Inbox(environment)
    o = opts(environment)
    if o is None:
        return
    why = open_loop_problem(environment)
    if why and not isinstance(runner, WorkerRunner):  # a worker's own options are not the run's (the master's are)
        log.error("mmchaos: %s", why)
        raise SystemExit(2)
    if state.inbox is not None and o.run_id and o.results_dir:
        state.inbox.open_run(o.run_id, o.results_dir)  # a master started again for a run takes its parts
    state.auto_results_dir = not o.results_dir
    state.auto_run_id = not o.run_id


def open_loop_problem(environment) -> str | None:
    """Why this run's open-loop options cannot run (one phrase), or None."""
    o = opts(environment)
    problem = arrivals.problem(o.rate, o.arrival, o.burstiness, o.max_concurrency, o.shape)
    why = problem[1] if problem else None
    if why is None and o.rate and not all(getattr(u, "open_loop_capable", False) for u in environment.user_classes):
        why = "--rate paces the realistic mix (locustfiles/embeddings.py); this locustfile's users set their own pace"
    return why


def _end_shape_on_sigterm(environment) -> None:
    runner = environment.runner
    if runner is None or environment.shape_class is None:
        return  # no shape: Locust's own SIGTERM handler is in place and does the shutdown
    if runner.shape_greenlet is not None:
        runner.shape_greenlet.kill(block=False)  # main() joins it, then quits the runner and shuts down
    elif runner.state == STATE_INIT:
        runner.quit()  # the shape has not started yet (and the workers connected so far are told to quit)
        main = environment.mmchaos.main
        if isinstance(runner, MasterRunner) and opts(environment).headless and main is not None:
            # a headless master waits for its workers in main(), deaf to SIGTERM: end that wait (nothing started,
            # no row to keep)
            log.error("mmchaos: stopped while waiting for the workers to connect")
            main.throw(SystemExit(2))


def resolve_model(host: str) -> str:
    r = requests.get(host.rstrip("/") + "/v1/models", headers=auth_headers(), timeout=10)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def resolve_routes(host: str) -> str:
    """The other pooling routes the server at ``host`` lists in its /openapi.json (a ``--routes`` value)."""
    r = requests.get(host.rstrip("/") + "/openapi.json", headers=auth_headers(), timeout=10)
    r.raise_for_status()
    listed = r.json().get("paths")
    if not isinstance(listed, dict):  # a server that answers anything with the same body (a null endpoint)
        raise ValueError("not an OpenAPI document")
    return ",".join(p for p in routes.PATHS if "post" in (listed.get(p) or {})) or routes.NO_ROUTES


def _routes_to_send(host: str, o) -> str:
    """--routes as given (a path the server does not list left out, said in one line), or the routes the server
    lists; none when its /openapi.json cannot be read and none were given."""
    try:
        listed = resolve_routes(host)
    except (requests.RequestException, AttributeError, ValueError) as e:
        if not o.routes and any(getattr(o, f"weight_{k}") > 0 for k in routes.ROUTE_KINDS):
            log.warning(
                "mmchaos: cannot read %s/openapi.json (%s): the route kinds (%s) are not sent; pass --routes",
                host,
                e,
                ", ".join(routes.ROUTE_KINDS),
            )
        return o.routes or routes.NO_ROUTES
    if not o.routes:
        return listed
    try:
        asked = routes.listed(o.routes)
    except ValueError:
        return o.routes  # the mix refuses it in one line when it is built
    served = set(routes.listed(listed))
    left_out = [p for p in asked if p not in served]
    if left_out:
        log.warning("mmchaos: --routes: %s not listed by the server's /openapi.json: not sent", ", ".join(left_out))
    return ",".join(p for p in asked if p not in left_out) or routes.NO_ROUTES


def _test_start(environment, **_):
    o = opts(environment)
    runner = environment.runner
    state = environment.mmchaos
    state.new_run()
    owner = not isinstance(runner, WorkerRunner)
    if owner and (why := open_loop_problem(environment)):  # the web form's values
        log.error("mmchaos: %s", why)
        environment.process_exit_code = 2
        gevent.spawn(runner.quit if o.headless else runner.stop)
        return
    if owner:
        # decided here, once: the master sends its options to the workers with the spawn message
        if state.auto_run_id:
            o.run_id = uuid.uuid4().hex[:12]
        if state.auto_results_dir:
            o.results_dir = str(paths.results_dir() / "adhoc" / f"{time.strftime('%Y%m%d-%H%M%S')}-{o.run_id}")
        if not o.model:
            try:
                o.model = resolve_model(environment.host)
            except (requests.RequestException, KeyError, IndexError, ValueError) as e:
                log.error("cannot read the model name from %s/v1/models (%s): pass --model", environment.host, e)
        o.routes = _routes_to_send(environment.host, o)
        Path(o.results_dir).mkdir(parents=True, exist_ok=True)
        if state.inbox is not None:
            state.inbox.open_run(o.run_id, o.results_dir)
        if not o.no_watch and environment.host:
            state.watchers = Watchers(
                o.watch_url or environment.host,
                lambda table: table_writer(environment, table),
                headers=auth_headers(),
                health_interval=o.health_interval,
                metrics_interval=o.metrics_interval,
            ).start()
    open_loop.test_start(environment)  # after the run's options are final: the master's go to its workers next
    if not isinstance(runner, MasterRunner):
        state.recorder = Recorder(
            environment,
            table_writer(environment, "requests"),
            o.run_id,
            o.config_name,
            o.trial,
            state.cut_hook,
            state.redactor,
        )
        if not o.no_trace:
            state.tracer = Tracer(table_writer(environment, "trace"), table_writer(environment, "trace_images"))
    state.live.test_start(environment, state.watchers)


def _stop_all(state: RunState):
    if state.tracer:
        state.tracer.close()
        state.tracer = None
    if state.recorder:
        state.recorder.close()
        state.recorder = None
    if state.watchers:
        state.watchers.stop()
        state.watchers = None


def _test_stop(environment, **_):
    state = environment.mmchaos
    _stop_all(state)
    if state.outbox is not None:
        state.outbox.run_ended()
    state.live.test_stop()


def _quitting(environment, **_):
    """Locust decides its exit code right after this: the gates decide it (a code set already, 2 when the run
    could not run, stands)."""
    state = environment.mmchaos
    if state.inbox is not None:
        # the workers' last parts and stats reports come after Locust stopped reading them: read them first
        state.inbox.drain(timeout=(environment.stop_timeout or 0) + shipping.DRAIN_S)
    state.live.quitting()
    panel = state.live.panel
    if panel is None or isinstance(environment.runner, WorkerRunner) or opts(environment) is None:
        return
    if environment.process_exit_code is not None:
        return
    if not panel.counts().attempts:
        log.error("mmchaos: no request was sent")
        environment.process_exit_code = 2
        return
    ol = panel.open_loop()
    if ol is not None:
        line = open_loop.summary(ol["rate"], ol["arrival"], ol["sent"], ol["due"], panel.outcomes.lags)
        if ol["held"] is not None and ol["held"] < arrivals.DEFAULT_MIN_RATE_RATIO:
            log.warning("mmchaos: the generator did not hold the rate: %s", line)
        else:
            log.warning("mmchaos: %s", line)
    judged = panel.gates(opts(environment))
    for g in judged:
        if g.state == gates.FAILED:
            log.error("mmchaos: gate failed: %s", g.text)
    environment.process_exit_code = gates.exit_code(judged)


def _quit(environment) -> None:
    # the last event of a Locust process, after its runner has stopped every user; not `quitting`, which
    # Locust fires before it stops the users (rows of requests still in flight would be lost)
    state = environment.mmchaos
    _stop_all(state)
    if state.outbox is not None:
        state.outbox.finish()
    state.encoders.close()
    state.live.quit()
