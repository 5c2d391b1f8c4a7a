"""Live progress of a campaign in the terminal (rich): configuration, trial, elapsed, requests, unexpected answers
(anything but what a request was built to get), crashes."""

from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live
from rich.table import Table


class CampaignProgress:
    def __init__(self, camp, console: Console):
        self.camp = camp
        self.console = console
        self.state: dict = {}
        self.done: list[str] = []
        self.t0 = time.time()
        self.live = Live(self._render(), console=console, refresh_per_second=4, transient=False)

    def _render(self) -> Table:
        s = self.state
        total = len(self.camp.configs) * self.camp.trials
        t = Table(title=f"campaign {self.camp.name} — {len(self.done)}/{total} trials done, "
                        f"{time.time() - self.t0:.0f} s", title_justify="left")
        for col in ("config", "trial", "phase", "elapsed", "requests", "unexpected", "crashes"):
            t.add_column(col)
        if s:
            t.add_row(str(s.get("config", "")), str(s.get("trial", "")), str(s.get("phase", "")),
                      f"{s.get('elapsed', 0):.0f} s", str(s.get("requests", "")), str(s.get("unexpected", "")),
                      str(s.get("crashes", "")))
        return t

    def update(self, state: dict) -> None:
        key = (state.get("config"), state.get("trial"))
        if self.state and key != (self.state.get("config"), self.state.get("trial")):
            self.done.append(f"{self.state.get('config')}/t{self.state.get('trial')}")
        self.state = state
        self.live.update(self._render())

    def summary(self, results) -> None:
        t = Table(title="trials", title_justify="left")
        for col in ("config", "trial", "status", "requests", "unexpected", "crashes", "signatures", "note"):
            t.add_column(col)
        for r in results:
            sigs = ", ".join(sorted({c.signature for c in r.crashes}))
            t.add_row(r.config, str(r.trial), r.status + (" (skipped)" if r.skipped else ""), str(r.requests),
                      str(r.errors), str(len(r.crashes)), sigs, r.error or "")
        self.console.print(t)

    def __enter__(self):
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        self.live.__exit__(*exc)
