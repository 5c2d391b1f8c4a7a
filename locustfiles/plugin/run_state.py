"""The run state of one Locust process: one object, made at Locust's init by the plugin and kept on the Environment
(``environment.mmchaos``), as Locust keeps its own runner and stats there. Users reach it through
``self.environment.mmchaos``, listeners through the ``environment`` Locust hands them.

It holds what lives as long as the process (the redactor, the live state and its panel, a worker's outbox or a
master's inbox, the encoder threads of fresh images, the user ids) and what one run of it has (the request budget
spent, the recorder, the tracer, the watchers, the open-loop pacer, the wrong-answer oracle; a locustfile's own:
the realistic mix's traffic, a replay's plan). Two Environments of one process (tests run several in-process)
share none of it, and the listeners a run state puts on Locust's events (its recorder's, its live state's, its
``quit``) come off again when its run stops or its process quits: Environments that share Locust's events, one after
the other, do not count each other's requests.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import gevent.event
from gevent.lock import BoundedSemaphore
from gevent.threadpool import ThreadPool
from locust.event import EventHook

from mmchaos.payloads import fresh
from mmchaos.redact import Redactor

from .consistency import Oracle
from .live_feed import Live

if TYPE_CHECKING:
    import gevent
    from locust.env import Environment

    from . import shipping
    from .open_loop import Pacer
    from .recorder import Recorder
    from .tracing import Tracer
    from .traffic import Traffic
    from .watchers import Watchers


class EncoderThreads:
    """Whole-image re-encodes of fresh images (WebP, mostly) on other cores (fresh.Offload): as many threads as
    cores, made at first use (more would add nothing but memory: glibc gives each thread that ever ran an encode an
    arena of its own, ~20 MB here; gevent's hub pool, 10 threads, grew a one-hour run from 374 to 424 MB as bursts
    of fresh images woke more of its threads), and as many slots."""

    def __init__(self, threads: int | None = None):
        self.threads = threads or os.cpu_count() or 1
        self._pool: ThreadPool | None = None
        self.offload = fresh.Offload(self.run, BoundedSemaphore(self.threads))

    def run(self, fn, *args):
        if self._pool is None:
            self._pool = ThreadPool(self.threads)
        return self._pool.apply(fn, args)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.kill()
            self._pool = None


@dataclass(eq=False)
class RunState:
    """One Locust process's mmchaos state (see the module's docstring)."""

    environment: Environment
    redactor: Redactor = field(default_factory=Redactor)  # its secrets, masked in rows and the web UI
    main: gevent.Greenlet | None = None  # the greenlet of Locust's main(), which a headless master's wait blocks
    # requests cut by the end of the run: (context, start_time, response_time); they are no Locust request
    cut_hook: EventHook = field(default_factory=EventHook)
    live: Live = field(default_factory=Live)
    encoders: EncoderThreads = field(default_factory=EncoderThreads)
    outbox: shipping.Outbox | None = None  # a worker's parts on their way to the master
    inbox: shipping.Inbox | None = None  # a master's end of them
    auto_results_dir: bool = False  # a results folder is made per run (none given)
    auto_run_id: bool = False  # a run id is made per run (none given)
    user_ids: Iterator[int] = field(default_factory=itertools.count)
    # the current run's
    sent: int = 0  # requests started by this process (the --max-requests budget)
    in_flight: int = 0  # request attempts sent and not yet answered (or hung up, or cut)
    ending: bool = False  # the budget is spent: the run ends once the requests in flight have come back
    settled: gevent.event.Event = field(default_factory=gevent.event.Event)  # set when ending and none in flight
    recorder: Recorder | None = None
    tracer: Tracer | None = None
    watchers: Watchers | None = None
    pacer: Pacer | None = None  # open loop (open_loop.py); None: closed loop, or the master, which sends nothing
    oracle: Oracle | None = None  # the wrong-answer oracle of this run's users (consistency.py)
    # a locustfile's own
    traffic: tuple[tuple, Traffic] | None = None  # embeddings.py: the mix for one set of options
    replay: Any = None  # replay.py: its Replay

    def next_user_id(self) -> int:
        return next(self.user_ids)

    def oracle_for(self, sample: float) -> Oracle:
        """The oracle of this run (one store of first answers for all the users of this process)."""
        if self.oracle is None or self.oracle.sample != sample:
            self.oracle = Oracle(sample)
        return self.oracle

    def new_run(self) -> None:
        """At test_start: what the last run counted is not this run's."""
        self.sent = 0
        self.ending = False
        self.settled = gevent.event.Event()
        self.oracle = None  # a run's first answers are its own (the web UI may point the next one elsewhere)


def of(environment) -> RunState:
    """``environment.mmchaos``, made by the plugin at Locust's init."""
    state = getattr(environment, "mmchaos", None)
    if state is None:
        raise RuntimeError(
            "this Locust Environment has no mmchaos run state: the plugin makes it at Locust's init event "
            "(a locustfile calls plugin.register() at import; fire environment.events.init before users start)"
        )
    return state
