"""Progress of a campaign that people can follow. On a terminal: a live table (configuration, trial, phase,
elapsed, requests, unexpected answers, crashes) under a title with the trials done, the time so far and the ETA.
Without one (a CI log): one plain line per phase change and per finished trial, with the same counts."""

from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from mmchaos.schema import sweep_label

from .runner import DONE

STARTUP_GUESS_S = {"engine": 60.0, "command": 60.0, "attach": 2.0}  # a trial's overhead before it has been measured
STOP_GUESS_S = 10.0


def _clock(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class CampaignProgress:
    def __init__(self, camp, console: Console, live: bool | None = None):
        self.camp = camp
        self.console = console
        self.total = len(camp.runs())
        self.done = 0
        self.run_times: list[float] = []  # wall seconds of the trials run (not skipped) so far
        self.state: dict = {}
        self.t0 = self.trial_t0 = time.time()
        self.is_live = console.is_terminal if live is None else live
        self.live = (
            Live(self._render(), console=console, refresh_per_second=4, transient=False) if self.is_live else None
        )

    def eta(self) -> float | None:
        """Seconds left: the trials to go times the mean trial so far (a guess before the first one ends)."""
        left = self.total - self.done
        if not left:
            return 0.0
        per = (
            sum(self.run_times) / len(self.run_times)
            if self.run_times
            else STARTUP_GUESS_S.get(self.camp.target, 60.0) + float(self.camp.workload.duration) + STOP_GUESS_S
        )
        current = time.time() - self.trial_t0 if self.state else 0.0
        return max(per - current, 0.0) + per * (left - 1)

    def title(self) -> str:
        eta = self.eta()
        return (
            f"campaign {self.camp.name}: {self.done}/{self.total} trials done, {_clock(time.time() - self.t0)} "
            f"elapsed, ETA {_clock(eta) if eta is not None else '?'}"
        )

    def _render(self) -> Table:
        s = self.state
        t = Table(title=self.title(), title_justify="left")
        for col in ("config", "trial", "phase", "elapsed", "requests", "unexpected", "crashes"):
            t.add_column(col)
        if s:
            t.add_row(
                str(s.get("config", "")),
                _trial(s.get("trial", ""), s.get("point")),
                str(s.get("phase", "")),
                f"{s.get('elapsed', 0):.0f} s",
                str(s.get("requests", "")),
                str(s.get("unexpected", "")),
                str(s.get("crashes", "")),
            )
        return t

    def update(self, state: dict) -> None:
        key = (state.get("config"), state.get("trial"))
        if key != (self.state.get("config"), self.state.get("trial")):
            self.trial_t0 = time.time()
        phase = state.get("phase", "")
        if phase == DONE:
            self._finished(state["result"])
            self.state = {}
        else:
            if not self.is_live and _kind(phase) != _kind(self.state.get("phase", "")):
                self._line(f"{state.get('config')}/t{_trial(state.get('trial'), state.get('point'))}: {phase}")
            self.state = state
        if self.live is not None:
            self.live.update(self._render())

    def _finished(self, r) -> None:
        self.done += 1
        if not r.skipped:
            self.run_times.append(time.time() - self.trial_t0)
        if not self.is_live:
            sigs = ", ".join(sorted({c.chain or c.signature for c in r.crashes}))
            self._line(
                f"{r.config}/t{_trial(r.trial, r.point)}: {r.status}"
                + (
                    " (skipped: done before)"
                    if r.skipped
                    else f", {r.requests:,} requests, {r.errors:,} unexpected, {len(r.crashes)} crash(es)"
                    + (f" ({sigs})" if sigs else "")
                    + (f"; {r.error}" if r.error else "")
                )
            )

    def _line(self, text: str) -> None:
        eta = self.eta()
        self.console.print(
            f"[{_clock(time.time() - self.t0)} elapsed, {self.done}/{self.total} done, ETA "
            f"{_clock(eta) if eta is not None else '?'}] {escape(text)}",
            highlight=False,
        )

    def summary(self, results) -> None:
        t = Table(title=f"trials of campaign {self.camp.name} ({_clock(time.time() - self.t0)})", title_justify="left")
        for col in ("config", "trial", "status", "requests", "unexpected", "crashes", "signatures", "note"):
            t.add_column(col)
        for r in results:
            sigs = ", ".join(sorted({c.chain or c.signature for c in r.crashes}))
            t.add_row(
                r.config,
                _trial(r.trial, r.point),
                r.status + (" (skipped)" if r.skipped else ""),
                str(r.requests),
                str(r.errors),
                str(len(r.crashes)),
                sigs,
                r.error or "",
            )
        self.console.print()  # the title starts a line of its own
        self.console.print(t)

    def __enter__(self):
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.__exit__(*exc)


def _trial(trial, point: dict | None) -> str:
    """A trial as the table shows it: its number, and its sweep point in a sweep."""
    return f"{trial} ({sweep_label(point)})" if point else str(trial)


def _kind(phase: str) -> str:
    """A phase without its counters ("starting server (12 s)" -> "starting server"): lines only when it changes."""
    return phase.split(" (")[0].split(":")[0]
