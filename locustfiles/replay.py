"""Replay a trace, or a request log of your own, against a server: the same bytes, per-user order kept.

    locust -f locustfiles/replay.py --host http://127.0.0.1:8000 --headless --replay results/demo/v0.30-default/t000
    locust -f locustfiles/replay.py --host ... --headless --replay my-traffic.jsonl --replay-speed 0

``--replay`` names a folder a run kept its trace in (a campaign trial, an ad-hoc run) or a JSONL request log
(docs/request-log.md). Each recorded user (a log's session) is one Locust user that sends its requests one after
the other, on one connection, at the recorded offsets divided by ``--replay-speed`` (1: as recorded; 2: twice as
fast; 0: as fast as possible). An abort hangs up after its recorded delay. A request is retried as
``--retry-policy`` says (default ``openai``, as for the mix), each attempt a row linked by ``request_group``; a
request recorded with its retries (a trace's attempts, a log's ``retry_of``) is sent as recorded, attempt by
attempt, none added. Every row carries its kind and case over. The run ends when every user has sent its last
request (or at ``-t``: the requests not sent are counted). It writes ``replay.json`` in the results folder: how many
requests the log holds and how many were sent, and whether the whole log was (``complete``) or ``-t`` cut it. One
process only (no --processes or workers): lanes are handed out by this process.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import gevent
from gevent.event import Event
from locust import LoadTestShape, constant, events, task
from locust.exception import StopUser
from locust.runners import MasterRunner, WorkerRunner

from mmchaos import schema
from mmchaos.files import write_json_atomic
from mmchaos.locustfiles.plugin import listeners as plugin
from mmchaos.locustfiles.plugin.chaos_user import ChaosUser
from mmchaos.payloads.replay_plan import ReplayError, ReplayPlan

plugin.register()
log = logging.getLogger("mmchaos")


@events.init_command_line_parser.add_listener
def _options(parser):
    parser.add_argument("--replay", type=str, default="", help="the trace folder or JSONL request log to replay")
    parser.add_argument(
        "--replay-speed",
        type=float,
        default=1.0,
        help="1: the recorded timing; k: k times faster; 0: as fast as possible",
    )


class Replay:
    """This process's replay: the plan, which lanes are taken, and when the last one is done. One per Locust
    Environment, in its run state (``environment.mmchaos.replay``)."""

    def __init__(self) -> None:
        self.plan: ReplayPlan | None = None
        self.source: str | None = None
        self.failed = False
        self.new_run()

    def new_run(self) -> None:
        self.taken = 0
        self.done = 0
        self.sent = 0  # recorded requests sent (attempts of a recorded retry each count; added retries do not)
        self.cut = False  # -t ended the run before the last request was sent
        self.t0: float | None = None
        self.t_done: float | None = None
        self.finished = Event()

    def ensure(self, environment) -> ReplayPlan | None:
        """The plan of --replay, loaded once (the shape asks before the test starts); None when it cannot be
        read, said in one line, with exit code 2."""
        o = environment.parsed_options
        if o is None:
            return None
        if self.source != o.replay:
            self.source, self.failed = o.replay, False
            try:
                if o.replay_speed < 0:
                    raise ReplayError(f"--replay-speed must be >= 0, not {o.replay_speed}")
                if isinstance(environment.runner, (MasterRunner, WorkerRunner)):
                    raise ReplayError("replay runs in one process (no master/workers)")
                self.plan = ReplayPlan.load(o.replay)
                log.info(
                    "mmchaos: replaying %d requests of %d users from %s", len(self.plan), len(self.plan.lanes), o.replay
                )
            except (ReplayError, OSError) as e:
                log.error("mmchaos: %s", e)
                self.plan, self.failed = None, True
                environment.process_exit_code = 2
        return self.plan


def replay_of(environment) -> Replay:
    """The replay of this Environment's run state, made at Locust's init."""
    return environment.mmchaos.replay


@events.init.add_listener
def _init(environment, **_):
    environment.mmchaos.replay = Replay()  # after the plugin's init, which made the run state


@events.test_start.add_listener
def _start(environment, **_):
    replay = replay_of(environment)
    replay.new_run()
    if replay.plan is not None:
        # the server's model name (given, or read from /v1/models when the test started): a body recorded for
        # another name gets this one
        replay.plan.model = environment.parsed_options.model or None


@events.test_stop.add_listener
def _stop(environment, **_):
    """What was sent of the log: a campaign's trial is completed when all of it was, whatever ``-t`` was."""
    replay, o = replay_of(environment), environment.parsed_options
    plan = replay.plan
    if plan is None or not getattr(o, "results_dir", None) or replay.t0 is None:
        return
    write_json_atomic(
        Path(o.results_dir) / schema.REPLAY,
        {
            "source": replay.source,
            "requests": len(plan),
            "sent": replay.sent,
            "not_sent": len(plan) - replay.sent,
            "complete": replay.finished.is_set(),
            "cut_by_run_time": replay.cut and not replay.finished.is_set(),
            "t_first": replay.t0,
            "t_done": replay.t_done,
            "speed": o.replay_speed,
        },
    )


class ReplayUser(ChaosUser):
    wait_time = constant(0)

    def on_start(self) -> None:
        self.groups: dict[str, str] = {}  # recorded request_group -> the request_group of its replayed rows
        self.replay = replay = replay_of(self.environment)
        plan = replay.plan
        if plan is None or replay.taken >= len(plan.lanes):
            self.lane = None
        else:
            self.lane = plan.lanes[replay.taken]
            replay.taken += 1
            replay.t0 = replay.t0 or time.time()

    @task
    def replay_lane(self):
        o = self.environment.parsed_options
        replay = self.replay
        if self.lane is not None:
            for step in self.lane:
                slot = None
                if o.replay_speed > 0:  # the recorded schedule, not a synchronisation
                    slot = replay.t0 + step.offset / o.replay_speed
                    gevent.sleep(max(0.0, slot - time.time()))
                self.send(
                    step.request,
                    abort=step.abort_after_ms is not None,
                    abort_after_ms=step.abort_after_ms,
                    recorded=self._recorded(step.recorded),
                    t_sched=slot,  # its row says when it was due and how late it went out
                )
                replay.sent += 1
                if step.recorded is not None and step.recorded.attempt == 1:
                    self.groups[step.recorded.group] = self.last_group
            self.lane = None
            replay.done += 1
            if replay.done >= len(replay.plan.lanes):
                replay.t_done = time.time()
                replay.finished.set()
        replay.finished.wait()  # a user whose lane is done waits for the others (the shape then ends the run)
        raise StopUser()

    def _recorded(self, r):
        """How ChaosUser.send sends a recorded attempt: its replayed group, attempt number, whether more follow."""
        if r is None:
            return None
        return self.groups.get(r.group), r.attempt, r.more


class ReplayShape(LoadTestShape):
    """As many users as the trace has lanes, all at once; the run ends when every lane is done (or at -t)."""

    def tick(self):
        environment = self.runner.environment
        replay = replay_of(environment)
        plan = replay.ensure(environment)
        run_time = environment.parsed_options.run_time
        if plan is None or replay.finished.is_set():
            return None
        if run_time and self.get_run_time() >= run_time:
            replay.cut = True
            return None
        return len(plan.lanes), max(1, len(plan.lanes))
