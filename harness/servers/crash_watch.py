"""Watch a server during a trial: its process, its /health and its log. Crashes are detected within a second.

- process exit → crash (reason ``process_exit``), classified from the log;
- /health answering anything but 200, or refusing connections → crash (``health_failed``);
- /health not answering at all for ``hang_after`` seconds while the process lives → crash (``hang``);
- every log line matching a signature is a LOG_EVENTS row (drift warnings that did not kill the server too).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mmchaos import schema
from mmchaos.health_rule import HANG, HANG_AFTER, OK, HealthRule, health_state
from mmchaos.logtail import LogTail
from mmchaos.signatures import CHAIN_LOOKBACK_S, Match, Signatures
from mmchaos.tables import PartWriter, table_dir

from .server import Server

PROCESS_EXIT = "process_exit"
EXIT_GRACE = 0.5  # seconds a server that stopped answering may take to exit, for the crash's reason


@dataclass
class Crash:
    t_detected: float
    t_last_healthy: float | None
    reason: str
    signature: str
    exit_code: int | None
    restart: int
    in_flight: int | None = None
    chain: str | None = None  # the signatures that led to it, root first (Signatures.chain)

    def row(self) -> dict:
        return dict(self.__dict__)


class CrashWatch:
    def __init__(
        self,
        server: Server,
        trial_dir,
        signatures: Signatures,
        hang_after: float = HANG_AFTER,
        health_timeout: float = 0.5,
    ):
        self.server = server
        self.sigs = signatures
        self.hang_after = hang_after
        self.health_timeout = health_timeout
        self.events = PartWriter(table_dir(trial_dir, "log_events"), schema.LOG_EVENTS, tag="harness")
        self.crashes: list[Crash] = []
        self.restart = 0
        self._tail = LogTail(server.log_path)
        self._matches: list[Match] = []  # since the current server started
        self._read_at: list[float] = []  # when each of them was read
        self.rule = HealthRule(hang_after)

    @property
    def matches(self) -> list[Match]:
        """The classified log lines of the current server, in order."""
        return list(self._matches)

    @property
    def last_healthy(self) -> float | None:
        return self.rule.last_ok

    def healthy_at(self, t: float | None) -> None:
        """The server was seen healthy at ``t`` (by its start-up wait)."""
        if t is not None:
            self.rule.observe(t, OK)

    def skip_existing(self) -> None:
        """Ignore what the log already holds (an attached server's earlier life is not this run's)."""
        self._tail.skip_to_end()

    def rebind(self, server: Server) -> None:
        """Follow a restarted server (same log file, appended). What the old server logged while we stopped it
        is skipped: shutdown tracebacks are ours, not the server's failures."""
        self._tail.skip_to_end()
        self.server = server
        self.restart += 1
        self._matches, self._read_at = [], []
        self.rule = HealthRule(self.hang_after)

    def _read_log(self, by: float | None = None) -> None:
        """Rows for the new classified lines, stamped when read, or at ``by`` if that is sooner: a dying server's
        last words (read after its crash was detected) belong to its life, not to the next one's."""
        now = time.time() if by is None else min(time.time(), by)
        for line in self._tail.new_lines():
            m = self.sigs.match(line)
            if m:
                self._matches.append(m)
                self._read_at.append(now)
                self.events.add(
                    {
                        "t": now,
                        "signature": m.signature.name,
                        "fatal": m.signature.fatal,
                        "mm_hash": m.mm_hash,
                        "request_id": m.request_id,
                        "line": m.line,
                    }
                )

    def check(self) -> Crash | None:
        """One observation (call every ~0.2 s). Returns the crash when this observation detects one."""
        self._read_log()
        code = self.server.exit_code()
        reason = PROCESS_EXIT if code is not None else None
        if reason is None:
            ok, status, err = self.server.health(timeout=self.health_timeout)
            reason = self.rule.observe(time.time(), health_state(ok, status, err))
        if reason is None:
            return None
        t_detected = time.time()
        if reason != HANG:
            self._await_last_words(t_detected)
            # a dying process stops answering a moment before it is gone: its exit, when it comes, is the reason
            end = time.time() + EXIT_GRACE
            while (code := self.server.exit_code()) is None and time.time() < end:
                time.sleep(0.05)  # polling for the exit
            reason = PROCESS_EXIT if code is not None else reason
        signature = HANG if reason == HANG else self.sigs.classify_crash(self._matches)
        since = min(self.last_healthy or t_detected, t_detected) - CHAIN_LOOKBACK_S
        chain = self.sigs.chain([m for m, t in zip(self._matches, self._read_at) if t >= since], signature)
        crash = Crash(t_detected, self.last_healthy, reason, signature, code, self.restart, chain=chain)
        self.crashes.append(crash)
        return crash

    def _await_last_words(self, t_detected: float, quiet: float = 0.3, limit: float = 2.0) -> None:
        """A dying server may still be writing its traceback: read the log until a fatal line is in, or it has
        been quiet for ``quiet`` s (a SIGKILLed server says nothing more), at most ``limit`` s."""
        end, last_growth, size = time.time() + limit, time.time(), self._tail.pos
        while time.time() < end and not any(m.signature.fatal for m in self._matches):
            time.sleep(0.05)  # polling the log file
            self._read_log(by=t_detected)
            if self._tail.pos != size:
                size, last_growth = self._tail.pos, time.time()
            elif time.time() - last_growth >= quiet:
                break

    def finish(self) -> None:
        """Call before stopping the server: lines logged by a shutdown we asked for are not events."""
        self._read_log()
        self.events.flush()


def count_in_flight(requests, t: float) -> int:
    """Requests sent before ``t`` whose answer (or failure) came after it. ``requests``: a REQUESTS DataFrame."""
    if requests is None or len(requests) == 0:
        return 0
    end = requests["t_start"] + requests["latency_ms"].fillna(0) / 1000
    return int(((requests["t_start"] <= t) & (end > t)).sum())
