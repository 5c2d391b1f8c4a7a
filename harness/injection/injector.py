"""Inject a trial's faults when they are due, and record each one as a row of its ``faults`` table.

Process faults go to the pid mmchaos recorded for the role when the server became healthy (server_processes.py),
and only while that very process still runs: a role whose process has died (the server crashed, or was restarted
and has new pids) is ``target_gone``, never a search for some other process. Network faults switch the fault
proxy's fault on, and off again after their duration. Operator actions are POSTs to the server's own routes, each
on a thread of its own (operator_call.py): a row is written once the server has answered (and, for a pause or a
sleep, once its undo has been sent and answered).
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmchaos import schema
from mmchaos.faults import KILL, STOP, Fault
from mmchaos.tables import PartWriter, table_dir

from ..servers.server_processes import Identity, alive
from .operator_call import OperatorCall
from .proxy import FaultProxy


@dataclass
class _Lasting:
    fault: Fault
    row: dict
    ends: float
    ident: Identity | None  # a stopped process (SIGCONT at the end); None: a network fault or an operator action
    undo: str | None = None  # an operator action's undo route (/resume, /wake_up)


@dataclass
class _Call:
    row: dict
    call: OperatorCall
    then: _Lasting | None = None  # what lasts once the action is answered (a pause, a sleep)


class FaultInjector:
    def __init__(
        self, faults: list[Fault], trial_dir: Path | str, proxy: FaultProxy | None = None, source: str = "campaign"
    ):
        self.pending = list(faults)
        self.proxy = proxy
        self.source = source
        self.lasting: list[_Lasting] = []
        self.rows: list[dict] = []  # every row written, in order (the runner's progress and tests read them)
        self.identities: dict[str, Identity] = {}
        self.restart = 0
        self.base_url: str | None = None  # the server's own address (operator actions go there, not via the proxy)
        self.api_key: str | None = None
        self.calls: list[_Call] = []  # operator requests not answered yet
        self.writer = PartWriter(table_dir(trial_dir, "faults"), schema.FAULTS, tag="harness")
        self._n = 0

    def bind(
        self, identities: dict[str, Identity], restart: int, base_url: str | None = None, api_key: str | None = None
    ) -> None:
        """The processes and address of the server now running (after its start, or a restart)."""
        self.identities, self.restart = dict(identities), restart
        self.base_url, self.api_key = base_url, api_key

    def due(self, elapsed: float, requests: int) -> list[Fault]:
        return [
            f
            for f in self.pending
            if (f.at is not None and elapsed >= f.at) or (f.after_requests is not None and requests >= f.after_requests)
        ]

    def tick(self, now: float, elapsed: float, requests: int) -> list[dict]:
        """Fire what is due (``elapsed``: seconds of load; ``requests``: rows recorded so far), end what has lasted
        its duration. Returns the rows of the faults fired now (an operator action's once the server answered)."""
        answered = self._answered()
        self._end_lasting(now)
        fired = []
        for f in self.due(elapsed, requests):
            self.pending.remove(f)
            row = self.fire(f, now)
            if "outcome" in row:
                fired.append(row)
        return answered + fired

    def fire(self, f: Fault, now: float, source: str | None = None) -> dict:
        """Inject ``f`` at once (the campaign's plan when due, or by hand)."""
        self._n += 1
        row: dict[str, Any] = {
            "fault": f.name,
            "kind": f.kind,
            "target": f.role(),
            "source": source or self.source,
            "t_injected": now,
            "restart": self.restart,
            "detail": _detail(f),
        }
        if f.is_operator:
            if self.base_url is None:
                row.update(outcome=schema.FAULT_FAILED, detail=f"{row['detail']}; no server address in this run")
                return self._write(row)
            path, undo = f.request()
            call = OperatorCall(self.base_url, path, self.api_key)
            row["t_injected"] = call.t_sent
            then = _Lasting(f, row, call.t_sent + f.duration, None, undo) if undo else None
            self.calls.append(_Call(row, call, then))
            return row  # its outcome once the server answers (tick)
        if f.is_process:
            ident = self.identities.get(f.role())
            if ident is None or not alive(ident):
                why = "no such process was recorded" if ident is None else f"pid {ident.pid} is no longer running"
                row.update(
                    outcome=schema.FAULT_TARGET_GONE,
                    target_pid=ident.pid if ident else None,
                    detail=f"{row['detail']}; {why}",
                )
                return self._write(row)
            row["target_pid"] = ident.pid
            row["detail"] = f"{row['detail']}; {ident.title[:80]}".strip("; ")
            try:
                os.kill(ident.pid, signal.SIGKILL if f.kind == KILL else signal.SIGSTOP)
            except OSError as e:
                row.update(outcome=schema.FAULT_FAILED, detail=f"{row['detail']}; {e.strerror or e}")
                return self._write(row)
            row["outcome"], row["t_effect"] = schema.FAULT_INJECTED, now
            if f.kind == STOP:
                self.lasting.append(_Lasting(f, row, now + f.duration, ident))
                return row  # written when it ends, with its SIGCONT
            return self._write(row)
        if self.proxy is None:
            row.update(outcome=schema.FAULT_FAILED, detail=f"{row['detail']}; no fault proxy in this run")
            return self._write(row)
        row["id"] = f"{f.name}#{self._n}"
        self.proxy.switch_on(row["id"], f.kind, f.params)
        row["outcome"], row["t_effect"] = schema.FAULT_INJECTED, now
        self.lasting.append(_Lasting(f, row, now + f.duration, None))
        return row

    def _answered(self, wait: bool = False) -> list[dict]:
        """The operator requests the server has answered (``wait``: all of them, each bounded by its timeout):
        an action answered 2xx that lasts goes on to its undo; every other is written."""
        rows = []
        for c in [c for c in self.calls if wait or c.call.done]:
            self.calls.remove(c)
            c.call.wait()
            c.row["detail"] = f"{c.row['detail']}; {c.call.says()}"
            if "outcome" in c.row:  # its undo answered: the action's row is complete
                self._write(c.row)
                continue
            if c.call.ok:  # vLLM acts before it answers: in effect by its answer
                c.row["t_effect"] = c.call.t_done
            if c.then is not None and c.call.ok:  # an action that lasts: undone when its duration is over
                c.row["outcome"] = schema.FAULT_INJECTED
                self.lasting.append(c.then)
                rows.append(c.row)
            else:
                c.row["outcome"] = schema.FAULT_INJECTED if c.call.ok else schema.FAULT_FAILED
                rows.append(self._write(c.row))
        return rows

    def _end_lasting(self, now: float, everything: bool = False) -> None:
        for item in [x for x in self.lasting if everything or x.ends <= now]:
            self.lasting.remove(item)
            row = item.row
            if item.undo is not None:
                assert self.base_url is not None  # an operator action was sent only with an address
                row["t_cleared"] = now
                self.calls.append(_Call(row, OperatorCall(self.base_url, item.undo, self.api_key)))
                continue
            if item.ident is not None:
                if alive(item.ident):
                    os.kill(item.ident.pid, signal.SIGCONT)
                    row["t_cleared"] = now
                else:
                    row["detail"] += "; the process ended before its SIGCONT"
            else:
                assert self.proxy is not None  # a fault without a process lasts only where a proxy switched it on
                self.proxy.switch_off(row.pop("id"))
                row["t_cleared"] = now
            self._write(row)

    def finish(self, now: float) -> None:
        """The trial is over: what lasts ends now (before the server is stopped), what was not reached says so."""
        self._answered(wait=True)  # an action in flight: answered (or timed out) before what it started is undone
        self._end_lasting(now, everything=True)
        self._answered(wait=True)
        for f in self.pending:
            self._write(
                {
                    "fault": f.name,
                    "kind": f.kind,
                    "target": f.role(),
                    "source": self.source,
                    "outcome": schema.FAULT_NOT_REACHED,
                    "detail": _detail(f),
                    "restart": self.restart,
                }
            )
        self.pending = []
        self.writer.flush()

    def _write(self, row: dict) -> dict:
        row.pop("id", None)
        self.writer.add(row)
        self.writer.flush()  # a few rows a trial: each on disk at once, whatever ends the trial
        self.rows.append(row)
        return row


def _detail(f: Fault) -> str:
    parts = [json.dumps(f.params, sort_keys=True)] if f.params else []
    if f.duration:
        parts.append(f"for {f.duration:g} s")
    parts.append(f.when() if f.at is not None or f.after_requests is not None else "by hand")
    return "; ".join(parts)
