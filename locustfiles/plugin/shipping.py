"""A Locust worker's rows reach its master over Locust's own messages, so the master's results folder is complete
whatever machine a worker runs on.

Each flush of a table on a worker (mmchaos.tables.PartWriter) is one message: the part's name and the bytes of its
Parquet file. The master writes the part into the folder of the run it belongs to and acknowledges it; the worker
keeps every part until it is acknowledged and sends it again when no acknowledgement came (after 2 s, 4 s, then
every 8 s). A part's name is unique and the master writes a name once (mmchaos.tables.put_part), so a part sent
twice is still one part: every row is on the master exactly once.

The end of a run: Locust stops reading its socket when it quits, before the workers' last parts are through, so
then each side reads it here. A worker reads until the master has acknowledged all its parts and says it is done;
the master reads until every worker of the run is done or silent (killed), then writes who handed over what
(``workers.json`` in the run's folder). A worker killed mid-run loses only the rows it had not flushed yet (at most
a second). A worker whose master never acknowledges (it is gone) writes the parts under the same results path on
its own disk, and its log says so. A master started again with the same ``--results-dir`` and ``--run-id`` takes
the parts its workers send again, as long as they still run (Locust's workers quit after 60 s without a master).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import gevent
from gevent.event import Event
from locust.exception import RPCError
from locust.runners import STATE_MISSING, STATE_RUNNING, STATE_SPAWNING

from mmchaos import schema
from mmchaos.files import write_json_atomic
from mmchaos.tables import PART_NAME, part_problem, process_tag, put_part, table_dir

log = logging.getLogger("mmchaos")

PART, ACK, DONE = "mmchaos_part", "mmchaos_part_ack", "mmchaos_done"  # worker -> master, back, worker -> master
RESEND_AFTER = (2.0, 4.0, 8.0)  # seconds without an acknowledgement before a part goes again (then every 8 s)
FINISH_S = 15.0  # how long a worker waits at its end for the master's last acknowledgements
DONE_S = 3.0  # how long a worker waits at its end for the master to acknowledge that it is done
DRAIN_S = 10.0  # how long a master waits at its end for its workers, once their users had time to stop
SILENT_S = 5.0  # a worker not heard from for this long at the end is gone (Locust's own limit is 3 s of heartbeats)
POLL_S = 0.25  # one read of the socket at the end


def _receive(recv, seconds: float):
    """One message from ``recv`` within ``seconds``, else None (also when the socket reports an error)."""
    try:
        with gevent.Timeout(seconds, False):
            return recv()
    except RPCError as e:
        log.debug("mmchaos: reading Locust's socket: %s", e)
    return None


def _handle(environment, msg) -> None:
    """What Locust's loop would have done with a message read at the end: registered messages (ours), and stats
    reports (so Locust's own counts, and the gates, include each worker's last report)."""
    if msg.type == "stats":
        environment.events.worker_report.fire(client_id=msg.node_id, data=msg.data)
        return
    handler = environment.runner.custom_messages.get(msg.type)
    if handler is not None:
        handler[0](environment=environment, msg=msg)


# --- the worker's end -----------------------------------------------------------------------------------------


@dataclass
class _Part:
    run: str
    table: str
    name: str
    data: bytes
    rows: int
    sent_at: float = 0.0
    tries: int = 0

    @property
    def key(self) -> tuple[str, str, str]:
        return self.run, self.table, self.name

    def due(self, now: float) -> bool:
        return now - self.sent_at >= RESEND_AFTER[min(self.tries, len(RESEND_AFTER)) - 1]


class Outbox:
    """A worker's parts on their way to the master, each kept until the master acknowledges it."""

    def __init__(self, environment) -> None:
        self.environment = environment
        self.worker = process_tag()  # as the rows' worker column
        self.pending: dict[tuple[str, str, str], _Part] = {}
        self.folders: dict[str, str] = {}  # run id -> the master's results folder (where parts go if all fails)
        self.open_runs: set[str] = set()  # runs with parts this worker has not said it is done with
        self._acked = Event()
        self._acked.set()
        self._done_heard = Event()  # the master acknowledged "done" (the process may end: nothing is in flight)
        self._finished: Event | None = None  # set when finish() is over
        environment.runner.register_message(ACK, self._on_ack)
        self._loop = gevent.spawn(self._resend_loop)

    def sink(self, run_id: str, results_dir: str, table: str):
        """A PartWriter sink: each part of ``table`` of run ``run_id`` goes to the master."""
        self.folders[run_id] = results_dir
        self.open_runs.add(run_id)

        def ship(name: str, data: bytes, rows: int) -> None:
            part = _Part(run_id, table, name, data, rows)
            self.pending[part.key] = part
            self._acked.clear()
            self._send(part)

        return ship

    def _send(self, part: _Part) -> None:
        part.sent_at, part.tries = time.monotonic(), part.tries + 1
        try:
            self.environment.runner.send_message(
                PART,
                {
                    "run": part.run,
                    "table": part.table,
                    "name": part.name,
                    "rows": part.rows,
                    "worker": self.worker,
                    "data": part.data,
                },
            )
        except RPCError as e:  # kept: it goes again when due
            log.warning("mmchaos: sending %s to the master failed (%s); it will be sent again", part.name, e)

    def _on_ack(self, environment, msg, **_) -> None:
        d = msg.data or {}
        if d.get("done"):
            self._done_heard.set()
            return
        part = self.pending.pop((d.get("run", ""), d.get("table", ""), d.get("name", "")), None)
        if part is not None and d.get("refused"):
            log.error("mmchaos: the master refused %d rows of %s: %s", part.rows, part.table, d["refused"])
        if not self.pending:
            self._acked.set()

    def _resend_loop(self) -> None:
        while True:
            gevent.sleep(1.0)  # the period of the check for parts due again
            now = time.monotonic()
            for part in list(self.pending.values()):
                if part.due(now):
                    self._send(part)

    def run_ended(self) -> None:
        """At a test's stop (Locust still reads the socket): say done once the master has every part."""

        def wait_then_say_done():
            if self._acked.wait(timeout=FINISH_S):
                self._say_done(spilled=0)

        gevent.spawn(wait_then_say_done)

    def finish(self, timeout: float = FINISH_S) -> int:
        """At the process's end, when Locust has stopped reading its socket: read it here until the master has
        acknowledged every part, write what it never acknowledged to this machine's disk, say done. Returns the
        rows written here (0: the master has them all)."""
        if self._finished is not None:
            # Locust shuts a worker down twice on SIGTERM (its handler, then main()): the second waits for the first
            self._finished.wait(timeout=timeout + DONE_S)
            return 0
        self._finished = Event()
        try:
            return self._finish(timeout)
        finally:
            self._finished.set()

    def _finish(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        self._pump_while(lambda: self.pending, deadline)
        self._loop.kill()
        spilled = self._spill()
        self._done_heard.clear()
        self._say_done(spilled)
        # a message sent just before the process ends can be lost with it: wait for the master to have heard it
        self._pump_while(lambda: not self._done_heard.is_set(), time.monotonic() + DONE_S)
        return spilled

    def _pump_while(self, condition, deadline: float) -> None:
        while condition() and time.monotonic() < deadline:
            msg = _receive(self.environment.runner.client.recv, min(POLL_S, max(0.0, deadline - time.monotonic())))
            if msg is not None:
                _handle(self.environment, msg)

    def _say_done(self, spilled: int) -> None:
        runs, self.open_runs = self.open_runs or {getattr(self.environment.parsed_options, "run_id", "") or ""}, set()
        for run in runs:
            try:
                self.environment.runner.send_message(DONE, {"run": run, "worker": self.worker, "spilled": spilled})
            except RPCError as e:
                log.warning("mmchaos: telling the master this worker is done failed: %s", e)

    def _spill(self) -> int:
        rows = 0
        for part in list(self.pending.values()):
            folder = self.folders.get(part.run)
            if not folder:
                log.error("mmchaos: %d rows of %s lost: no master acknowledged them", part.rows, part.table)
                continue
            try:
                put_part(table_dir(folder, part.table), part.name, part.data)
            except OSError as e:
                log.error(
                    "mmchaos: %d rows of %s lost: no master acknowledged them and %s cannot be written (%s)",
                    part.rows,
                    part.table,
                    folder,
                    e.strerror or e,
                )
                continue
            rows += part.rows
            log.error(
                "mmchaos: no master acknowledged %d rows of %s: written to %s on this machine (%s)",
                part.rows,
                part.table,
                Path(folder).resolve(),
                self.worker,
            )
        self.pending.clear()
        return rows


# --- the master's end -----------------------------------------------------------------------------------------


@dataclass
class WorkerRecord:
    """One worker of one run, as the master saw it."""

    client: str  # Locust's id of the worker
    worker: str = ""  # host-pid, as its rows' worker column
    parts: int = 0
    rows: int = 0  # of its requests table: one per request it sent
    done: bool = False  # it said the master has all its parts; False at the end: it died (or never answered)
    spilled: int = 0  # rows it wrote on its own disk because no master acknowledged them


class Inbox:
    """The master's end: each worker's parts written into the folder of their run and acknowledged, and the ledger
    of which worker handed over everything."""

    def __init__(self, environment) -> None:
        self.environment = environment
        self.folders: dict[str, Path] = {}  # run id -> results folder, for every run this master has run
        self.ledgers: dict[str, dict[str, WorkerRecord]] = {}
        self.current: str | None = None
        self._refused_runs: set[str] = set()
        self._drained: Event | None = None  # set when drain() is over
        runner = environment.runner
        runner.register_message(PART, self._on_part)
        runner.register_message(DONE, self._on_done)
        environment.events.worker_connect.add_listener(self._on_connect)

    def open_run(self, run_id: str, folder: str | Path) -> None:
        """Parts of ``run_id`` go to ``folder`` from now on; the workers connected now are the run's."""
        self.folders[run_id] = Path(folder)
        self.current = run_id
        ledger = self.ledgers.setdefault(run_id, {})
        for c in self.environment.runner.clients.all:
            if c.state != STATE_MISSING:
                ledger.setdefault(c.id, WorkerRecord(c.id))

    def _record(self, run: str, client: str) -> WorkerRecord:
        return self.ledgers.setdefault(run, {}).setdefault(client, WorkerRecord(client))

    def _on_connect(self, client_id, **_) -> None:
        if self.current is not None and self.environment.runner.state in (STATE_SPAWNING, STATE_RUNNING):
            self._record(self.current, client_id)  # joined mid-run

    def _on_part(self, environment, msg, **_) -> None:
        d = msg.data if isinstance(msg.data, dict) else {}
        run, table, name, data = d.get("run"), d.get("table"), d.get("name"), d.get("data")
        if not isinstance(run, str) or (folder := self.folders.get(run)) is None:
            # not acknowledged: the worker keeps it (a master of that run may come back), else writes it itself
            if str(run) not in self._refused_runs:
                self._refused_runs.add(str(run))
                log.warning(
                    "mmchaos: worker %s sends rows of run %r, which this master does not run: not written",
                    d.get("worker") or msg.node_id,
                    run,
                )
            return
        refused = None
        if (
            table not in schema.TABLES
            or not isinstance(name, str)
            or not PART_NAME.fullmatch(name)
            or not isinstance(data, bytes)
        ):
            refused = f"not a part of a known table: {str(table)[:40]!r}, {str(name)[:80]!r}"
        elif problem := part_problem(data, schema.TABLES[table]):
            refused = f"{name} of {table}: {problem}"
        else:
            try:
                new = put_part(table_dir(folder, table), name, data)
            except OSError as e:  # not acknowledged: it comes again, maybe after the disk is back
                log.error("mmchaos: cannot write %s of worker %s: %s", name, msg.node_id, e.strerror or e)
                return
            rec = self._record(run, msg.node_id)
            rec.worker = str(d.get("worker") or rec.worker)[:200]
            if new:  # a part sent again is counted once, as it is written once
                rec.parts += 1
                rec.rows += int(d.get("rows") or 0) if table == "requests" else 0
        environment.runner.send_message(
            ACK, {"run": run, "table": table, "name": name, "refused": refused}, client_id=msg.node_id
        )

    def _on_done(self, environment, msg, **_) -> None:
        d = msg.data if isinstance(msg.data, dict) else {}
        run = d.get("run")
        environment.runner.send_message(ACK, {"run": run, "done": True}, client_id=msg.node_id)
        if run not in self.folders:
            return
        rec = self._record(run, msg.node_id)
        rec.done = True
        rec.worker = str(d.get("worker") or rec.worker)[:200]
        rec.spilled = int(d.get("spilled") or 0)
        self.save(run)

    def save(self, run: str | None) -> None:
        """``workers.json`` in the run's folder: every worker of the run, and those lost (not done)."""
        if run is None or run not in self.folders:
            return
        workers = sorted(self.ledgers.get(run, {}).values(), key=lambda r: (r.worker, r.client))
        try:
            write_json_atomic(
                self.folders[run] / schema.WORKERS,
                {
                    "run_id": run,
                    "workers": [asdict(w) for w in workers],
                    "lost": [w.worker or w.client for w in workers if not w.done],
                },
            )
        except OSError as e:
            log.error("mmchaos: cannot write %s: %s", schema.WORKERS, e.strerror or e)

    def drain(self, timeout: float) -> None:
        """At the master's end: quit Locust's runner (it tells the workers to quit and stops reading), then read
        the socket here until every worker of the current run is done, or silent for SILENT_S, or ``timeout``."""
        if self._drained is not None:
            # Locust shuts down twice on SIGTERM (its handler, then main()): the second waits for the first
            self._drained.wait(timeout=timeout + SILENT_S)
            return
        self._drained = Event()
        try:
            self._drain(timeout)
        finally:
            self._drained.set()

    def _drain(self, timeout: float) -> None:
        runner = self.environment.runner
        runner.quit()
        run = self.current
        ledger = self.ledgers.get(run, {}) if run is not None else {}
        start = time.monotonic()
        deadline = start + timeout
        gone = {c.id for c in runner.clients.all if c.state == STATE_MISSING}
        heard: dict[str, float] = {}

        def waiting() -> bool:
            now = time.monotonic()
            return any(
                not r.done and cid not in gone and now - heard.get(cid, start) < SILENT_S for cid, r in ledger.items()
            )

        while waiting() and time.monotonic() < deadline:
            got = _receive(runner.server.recv_from_client, POLL_S)
            if got is not None:
                client_id, msg = got
                heard[client_id] = time.monotonic()
                _handle(self.environment, msg)
        self.save(run)
