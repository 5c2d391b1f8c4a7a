"""Locust in this process, as Locust's own tests run it: an ``Environment`` with mmchaos's options, a local runner,
and the events Locust's ``main()`` fires, in its order — against a stand-in served from this process
(standin_server.in_process). For tests of our Locust code (the mix, the recorder, the retries, the probes, the live
state and the gates); what is about processes (signals, workers, the command line) is in the integration lane.

Importing this module imports Locust, which patches the process with gevent (tests/conftest.py decides when).
Every run is bounded twice: by a count (``--max-requests``, which ends it) and by a time that only a hung run
reaches (``bound_s``, after which the test fails, saying so).
"""

from __future__ import annotations

import importlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gevent
import locust
from locust import LoadTestShape, User
from locust.argument_parser import get_parser
from locust.env import Environment

from mmchaos import schema
from mmchaos.tables import read_table

DEFAULTS = ["--image-preset", "small", "--pool-size", "16"]  # as tests/locust_run.py's processes


class RunHung(AssertionError):
    pass


@dataclass
class Run:
    environment: Environment
    exit_code: int
    out: Path

    @property
    def requests(self) -> int:
        """Locust's own count of requests (failures included), as its --json-file would give it."""
        return self.environment.stats.total.num_requests

    def rows(self):
        return read_table(self.out, "requests").to_pandas()

    def table(self, name: str):
        return read_table(self.out, name).to_pandas()


def _classes(module):
    users = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, User) and not v.abstract]
    shapes = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, LoadTestShape) and v is not LoadTestShape and not v.abstract
    ]
    return users, shapes


def run(
    locustfile: str,
    host: str,
    out: Path,
    *args: str,
    users: int = 4,
    max_requests: int,
    bound_s: float = 120,
    quit_when: Callable[[Environment], bool] | None = None,
) -> Run:
    """One headless run of ``mmchaos.locustfiles.<locustfile>`` (e.g. "embeddings"), ended by its request budget.

    The run time handed to Locust is ``bound_s``: a run that reaches it has not met its budget, and fails.
    ``quit_when``: the runner is quit once this holds, as Locust's run time quits it (whatever is in flight is
    cut); a run where it never holds within ``bound_s`` has hung."""
    module = importlib.import_module(f"mmchaos.locustfiles.{locustfile}")  # registers the plugin's arguments
    options = get_parser(default_config_files=[]).parse_args(
        [
            "-f",
            module.__file__,
            "--headless",
            "-u",
            str(users),
            "-r",
            str(users),
            "-t",
            f"{bound_s:g}s",
            "--host",
            host,
            "--results-dir",
            str(out),
            "--max-requests",
            str(max_requests),
            *DEFAULTS,
            *args,
        ]
    )
    user_classes, shapes = _classes(module)
    env = Environment(
        user_classes=user_classes,
        shape_class=shapes[0]() if shapes else None,
        events=locust.events,
        host=host,
        parsed_options=options,
        locustfile=module.__file__,
    )
    handlers = []
    real_signal_handler = gevent.signal_handler

    def keep(signalnum, *a, **kw):  # this process keeps its own signals once the run is over
        handlers.append(real_signal_handler(signalnum, *a, **kw))
        return handlers[-1]

    gevent.signal_handler = keep
    t0 = time.monotonic()
    try:
        runner = env.create_local_runner()
        env.events.init.fire(environment=env, runner=runner, web_ui=None)
        # Locust's headless main(): the shape runs until it ends or the budget quits the runner
        if env.shape_class is not None:
            runner.start_shape()
            shape = runner.shape_greenlet  # ends with the shape, or is killed when the budget quits the runner
            ended = lambda timeout: bool(gevent.wait([shape], timeout=timeout))  # noqa: E731
        else:
            runner.start(users, users)
            ended = lambda timeout: runner.greenlet.join(timeout=timeout)  # noqa: E731 (a Group: says if it ended)
        if quit_when is None:
            hung = not ended(bound_s + 30)
        else:
            deadline = time.monotonic() + bound_s
            while not (quit_when(env) or time.monotonic() > deadline):
                gevent.sleep(0.01)  # a poll of the run's own state, bounded
            hung = not quit_when(env)
        runner.quit()
        # Locust's shutdown(): quitting, the exit code, the runner's last stop, quit
        env.events.quitting.fire(environment=env, reverse=True)
        if env.process_exit_code is not None:
            code = env.process_exit_code
        elif runner.errors or runner.exceptions:
            code = options.exit_code_on_error
        else:
            code = 0
        runner.quit()
        env.events.quit.fire(exit_code=code)
    finally:
        gevent.signal_handler = real_signal_handler
        for h in handlers:
            h.cancel()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hung or time.monotonic() - t0 >= bound_s:
        raise RunHung(f"the run did not end within {bound_s:g} s: its budget of {max_requests} requests was not met")
    return Run(env, code, out)


def locust_rows(df):
    """The rows of requests Locust counted: all but those cut by the end of the run (no Locust request)."""
    return df[df["outcome"] != schema.CUT]
