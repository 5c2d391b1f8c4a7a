"""What a replay sends: a trace (a run's folder) or a request log (JSONL), as lanes of steps. A lane is one
recorded user: its requests in order, each at its offset from the first request of the whole trace."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from . import request_log
from .bodies import RequestMeta
from .traces import Trace, TraceError

ReplayError = TraceError


class TracedRequest(NamedTuple):
    """One recorded request, sendable as a built one (ChaosUser.send): its endpoint, its row's columns, its body."""

    path: str
    meta: RequestMeta
    plan: ReplayPlan
    index: int

    def template(self):
        template, urls = self.plan.trace.template(self.index)
        return self.plan.with_model(template), urls


@dataclass(frozen=True)
class Step:
    offset: float  # seconds after the trace's first request
    request: TracedRequest
    abort_after_ms: float | None


class ReplayPlan:
    def __init__(self, trace: Trace, model: str | None = None):
        self.trace, self.model = trace, model
        t = trace.requests
        t0 = float(t["t_start"].min())
        self.lanes = [[self._step(i, t0) for i in lane] for lane in trace.lanes()]

    @classmethod
    def load(cls, path: str | Path, model: str | None = None) -> ReplayPlan:
        path = Path(path)
        if not str(path):
            raise ReplayError("--replay names nothing: give a trace folder or a JSONL request log")
        if path.is_dir():
            return cls(Trace.load(path), model)
        if path.is_file():
            return cls(request_log.read(path), model)
        raise ReplayError(f"{path}: no such trace folder or request log")

    def __len__(self) -> int:
        return len(self.trace)

    def _step(self, i: int, t0: float) -> Step:
        r = self.trace.requests.loc[i]
        case = None if pd.isna(r["case"]) else r["case"]
        expected = None if pd.isna(r["expected_status"]) else int(r["expected_status"])
        hashes = tuple(self.trace.image_hashes(i))
        meta = RequestMeta(kind=r["kind"], image_ids=hashes, image_hashes=hashes, case=case,
                           expected_status=expected)
        after = r["abort_after_ms"]
        return Step(float(r["t_start"]) - t0, TracedRequest(r["endpoint"], meta, self, i),
                    None if pd.isna(after) else float(after))

    def with_model(self, template: bytes) -> bytes:
        """The body for a server that serves ``model`` under another name than the recorded one: only the model
        field changes (the rest stays byte for byte)."""
        if not self.model:
            return template
        try:
            body = json.loads(template)
        except ValueError:
            return template
        if not isinstance(body, dict) or body.get("model") in (None, self.model):
            return template
        body["model"] = self.model
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
