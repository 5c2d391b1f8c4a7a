"""What a replay sends: a trace (a run's folder) or a request log (JSONL), as lanes of steps. A lane is one
recorded user: its requests in order, each at its offset from the first request of the whole trace.

A request whose retries were recorded (a trace's attempts of one ``request_group``, a log's lines with
``retry_of``) is sent as recorded, attempt by attempt, with no retry added; any other request is one the client
retries by its own policy (``--retry-policy``), as the recorded client would have had it failed."""

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
    row: int  # of the trace's requests

    def template(self):
        template, urls = self.plan.trace.template(self.row)
        return self.plan.with_model(template), urls


@dataclass(frozen=True)
class Recorded:
    """One attempt of a request whose retries were recorded."""

    group: str  # the recorded request_group (the first attempt's request_id)
    attempt: int  # 1, 2, ... in sending order
    more: bool  # a later recorded attempt follows


@dataclass(frozen=True)
class Step:
    offset: float  # seconds after the trace's first request
    request: TracedRequest
    abort_after_ms: float | None
    recorded: Recorded | None = None  # None: a request the replaying client retries by its policy


class ReplayPlan:
    def __init__(self, trace: Trace, model: str | None = None):
        self.trace, self.model = trace, model
        t = trace.requests
        t0 = float(t["t_start"].min())
        recorded = _recorded_attempts(t)
        self.lanes = [[self._step(i, t0, recorded.get(i)) for i in lane] for lane in trace.lanes()]

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

    def _step(self, i: int, t0: float, recorded: Recorded | None) -> Step:
        r = self.trace.requests.loc[i]
        case = None if pd.isna(r["case"]) else r["case"]
        expected = None if pd.isna(r["expected_status"]) else int(r["expected_status"])
        hashes = tuple(self.trace.image_hashes(i))
        meta = RequestMeta(kind=r["kind"], image_ids=hashes, image_hashes=hashes, case=case, expected_status=expected)
        after = r["abort_after_ms"]
        return Step(
            float(r["t_start"]) - t0,
            TracedRequest(r["endpoint"], meta, self, i),
            None if pd.isna(after) else float(after),
            recorded,
        )

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


def _recorded_attempts(requests: pd.DataFrame) -> dict[int, Recorded]:
    """The attempts of every request recorded with its retries (a group of more than one row), by row index."""
    if "request_group" not in requests:
        return {}
    group = requests["request_group"].astype(object).where(requests["request_group"].notna(), requests["request_id"])
    sizes = group.map(group.value_counts())
    out = {}
    for g, rows in requests[sizes > 1].groupby(group[sizes > 1], sort=False):
        order = list(rows.sort_values(["t_start", "seq"], kind="stable").index)
        for n, i in enumerate(order, 1):
            out[i] = Recorded(str(g), n, n < len(order))
    return out
