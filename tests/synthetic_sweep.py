"""A synthetic sweep campaign with a known crash hazard, for the hazard model's tests.

Each trial is one sweep point run under the ``restart`` crash policy. Poison requests (post-render 400s and client
aborts) arrive as a Poisson process; each poisons a fresh image, which a later valid request sends again with
probability ``reuse``; when that reuse reaches the same server, the server crashes with probability ``p`` (from
:class:`SweepConfig`), is detected at once and comes back ``restart_s`` later. Valid background requests fill the
rest. What really happened per trial is written to ``<campaign>/truth.json``. Nothing here is a claim about vLLM.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
from synthetic import _write_parts

from mmchaos import schema as S
from mmchaos.manifest import TrialManifest
from mmchaos.outcomes import causes

TRUTH = "truth.json"
HEALTH_EVERY_S = 1.0
DETECT_S = 1e-4  # from the crash to its detection (a reuse in between counts as an event that cannot crash)
POST_WEIGHTS = ("malformed_post", "weight_malformed_post")
ABORT_WEIGHTS = ("abort", "weight_abort")


@dataclass
class SweepConfig:
    name: str
    p: float  # chance that one poison event crashes the server, at ``reference``
    slopes: dict[str, float] = field(default_factory=dict)  # knob -> change of log p per unit of the knob
    reference: dict[str, float] = field(default_factory=dict)
    engine: str = "0.30.0"
    flags: list[str] = field(default_factory=list)

    def p_at(self, point: dict) -> float:
        log_ratio = sum(b * (point[k] - self.reference.get(k, 0.0)) for k, b in self.slopes.items())
        return min(1.0, self.p * math.exp(log_ratio))


def make_sweep_campaign(
    root: str | Path,
    configs: list[SweepConfig],
    sweep: dict[str, list],
    name: str = "sweep",
    trials_per_point: int = 2,
    duration_s: float = 600.0,
    poison_per_s: float = 0.05,  # poison requests per second per unit of weight
    reuse: float = 0.6,  # share of poisoned images sent again (1 - fresh_fraction when that is swept)
    valid_per_s: float = 1.0,
    restart_s: float = 20.0,
    users: int = 8,
    seed: int = 0,
    t0: float = 1_760_000_000.0,
    rate: float = 0.0,  # written as the workload's open-loop rate (the requests' times are the generator's anyway)
) -> Path:
    """Write ``root/name/<config>/t###/`` (one trial per sweep point and repeat); return the campaign folder.

    ``sweep``: knob -> values; every combination is a point. Knobs the generator understands: malformed_post and
    abort (weights: poison_per_s × weight each; defaults 1 and 0), fresh_fraction (reuse = 1 - it), users; any
    knob can move p through ``SweepConfig.slopes``.
    """
    rng = np.random.default_rng(seed)
    camp = Path(root) / name
    camp.mkdir(parents=True, exist_ok=True)
    (camp / S.CAMPAIGN_MANIFEST).write_text(json.dumps({"name": name, "configs": [c.name for c in configs]}))
    knobs = list(sweep)
    points = [dict(zip(knobs, vals)) for vals in itertools.product(*sweep.values())]
    truth, start = [], t0
    for cfg in configs:
        for trial, (point, _) in enumerate(itertools.product(points, range(trials_per_point))):
            world = _World(cfg, point, duration_s, poison_per_s, reuse, valid_per_s, restart_s, rng)
            folder = camp / cfg.name / S.trial_folder(trial)
            world.write(folder, name, trial, start, users, rate)
            truth.append({"config": cfg.name, "trial": trial, "sweep": point, "p": cfg.p_at(point), **world.truth()})
            start += duration_s + 60
    (camp / TRUTH).write_text(json.dumps(truth, indent=1))
    return camp


def read_truth(campaign: str | Path) -> pd.DataFrame:
    """What really happened per trial: config, trial, sweep, p, poison_requests, poison_events, crashes, uptime_s."""
    return pd.DataFrame(json.loads((Path(campaign) / TRUTH).read_text()))


class _World:
    """One trial, simulated event by event (poison requests, reuses) in time order."""

    def __init__(self, cfg, point, duration, poison_per_s, reuse, valid_per_s, restart_s, rng) -> None:
        self.cfg, self.point, self.duration, self.restart_s, self.rng = cfg, point, duration, restart_s, rng
        self.p = cfg.p_at(point)
        self.reuse = 1.0 - point["fresh_fraction"] if "fresh_fraction" in point else reuse
        w_post = next((point[k] for k in POST_WEIGHTS if k in point), 1.0)
        w_abort = next((point[k] for k in ABORT_WEIGHTS if k in point), 0.0)
        self.rows: list[dict] = []
        self.crashes: list[tuple[float, float]] = []  # (t_detected, back up)
        self.poison_requests = self.poison_events = 0
        # heap of (t, order, what, image, life it poisoned)
        events: list[tuple[float, int, str, str | None, int | None]] = []
        for kind, rate in (("malformed_post", poison_per_s * w_post), ("abort", poison_per_s * w_abort)):
            for t in _arrivals(rate, duration, rng):
                events.append((t, len(events), kind, None, None))
        heapq.heapify(events)
        n = len(events)
        while events:
            t, _, what, image, life = heapq.heappop(events)
            if what == "valid_image":
                self._reuse(t, image, life)
                continue
            if self._down(t):  # refused: the server failed it, it cannot poison anything
                self._row(t, what, None, S.CONNECTION_ERROR)
                continue
            image = f"poison-{n}-{t:.6f}"
            n += 1
            self.poison_requests += 1
            self._row(
                t,
                what,
                image,
                S.HTTP_ERROR if what == "malformed_post" else S.ABORTED,
                400 if what == "malformed_post" else None,
            )
            t_again = t + rng.uniform(0.2, 5.0)
            if rng.random() < self.reuse and t_again < duration:  # the run stops at its end
                heapq.heappush(events, (t_again, n, "valid_image", image, self._life(t)))
        for t in _arrivals(valid_per_s, duration, rng):  # background: a hot pool nobody poisons
            self._row(
                t,
                "valid_image",
                f"bg{rng.integers(50)}",
                S.CONNECTION_ERROR if self._down(t) else S.OK,
                None if self._down(t) else 200,
            )

    def _reuse(self, t, image, life) -> None:
        if self._down(t):
            self._row(t, "valid_image", image, S.CONNECTION_ERROR)
            return
        if life != self._life(t):  # a restart emptied the cache: a plain request
            self._row(t, "valid_image", image, S.OK, 200)
            return
        self.poison_events += 1
        dying = bool(self.crashes) and t < self.crashes[-1][0]  # crashed, not yet detected: cannot crash again
        if not dying and self.rng.random() < self.p:
            detected = t + DETECT_S
            self.crashes.append((detected, detected + self.restart_s))
            self._row(t, "valid_image", image, S.CONNECTION_ERROR)
        else:
            self._row(t, "valid_image", image, S.OK, 200)

    def _life(self, t) -> int:
        """Which server is up at ``t``: crashes detected by then."""
        return sum(a <= t for a, _ in self.crashes)

    def _down(self, t) -> bool:
        return any(a <= t < b for a, b in self.crashes)

    def _row(self, t, kind, image, outcome, status=None) -> None:
        self.rows.append({"t": t, "kind": kind, "image": image, "outcome": outcome, "status": status})

    def truth(self) -> dict:
        polls = np.arange(0.0, self.duration, HEALTH_EVERY_S)
        down = 0.0
        for a, b in self.crashes:
            back = polls[polls >= b]
            down += min(back[0] if len(back) else self.duration, self.duration) - a
        return {
            "poison_requests": self.poison_requests,
            "poison_events": self.poison_events,
            "crashes": len(self.crashes),
            "uptime_s": self.duration - down,
        }

    def write(self, folder: Path, campaign: str, trial: int, t0: float, users: int, rate: float = 0.0) -> None:
        d = pd.DataFrame(self.rows).sort_values("t", ignore_index=True)
        n = len(d)
        rid = [f"mmc-sweep{trial}-0-0-{i}" for i in range(n)]
        expected = np.where(d["kind"] == "malformed_post", 400.0, np.nan)
        status = d["status"].astype(float).to_numpy()
        rows = pd.DataFrame(
            {
                "run_id": f"{campaign}-{self.cfg.name}-{trial}",
                "config": self.cfg.name,
                "trial": trial,
                "worker": "localhost:4242",
                "user_id": np.arange(n) % users,
                "seq": np.arange(n) // users,
                "request_id": rid,
                "kind": d["kind"],
                "case": np.where(d["kind"] == "malformed_post", "dimensions_unsupported", None),  # type: ignore[call-overload]
                "expected_status": expected,
                "endpoint": "/v1/embeddings",
                "t_start": t0 + d["t"],
                "latency_ms": 50.0,
                "status": status,
                "outcome": d["outcome"],
                "cause": causes(pd.DataFrame({"status": status, "outcome": d["outcome"], "expected_status": expected})),
                "attempt": 1,
                "request_group": rid,
                "final": True,
                "reconnects": 0,
                "n_images": d["image"].notna().astype(int),
                "image_ids": d["image"],
                "image_hashes": [
                    hashlib.sha256(i.encode()).hexdigest()[:16] if isinstance(i, str) else None for i in d["image"]
                ],
            }
        )
        _write_parts(folder, "requests", _table(rows, S.REQUESTS))
        polls = np.arange(0.0, self.duration, HEALTH_EVERY_S)
        up = np.array([not self._down(x) for x in polls])
        _write_parts(
            folder,
            "health",
            S.table_from_rows(
                [
                    {
                        "t": t0 + x,
                        "ok": bool(u),
                        "status": 200 if u else None,
                        "latency_ms": 2.0,
                        "error": None if u else "Connection refused",
                    }
                    for x, u in zip(polls, up)
                ],
                S.HEALTH,
            ),
        )
        _write_parts(
            folder,
            "crashes",
            S.table_from_rows(
                [
                    {
                        "t_detected": t0 + a,
                        "t_last_healthy": t0 + a - DETECT_S,
                        "reason": "process_exit",
                        "signature": "detokenizer_assert",
                        "exit_code": 1,
                        "in_flight": 0,
                        "restart": i,
                    }
                    for i, (a, _) in enumerate(self.crashes)
                ],
                S.CRASHES,
            ),
        )
        (folder / S.SERVER_LOG).write_text("INFO Started server process\n")
        manifest = {  # checked as the runner's are (mmchaos/manifest.py), written as they are
            "campaign": campaign,
            "config": self.cfg.name,
            "trial": trial,
            "engine": self.cfg.engine,
            "flags": list(self.cfg.flags),
            "env": {},
            "target": "engine",
            "crash_policy": {"policy": "restart"},
            "workload": {
                "users": int(self.point.get("users", users)),
                "duration_s": self.duration,
                "shape": "steady",
                **({"rate": rate} if rate else {}),
            },
            "seed": trial,
            "sweep": self.point,
            "t_start": t0,
            "t_end": t0 + self.duration,
            "status": "completed",
        }
        (folder / S.MANIFEST).write_text(json.dumps(TrialManifest.model_validate(manifest).dump(), indent=1))


def _arrivals(rate: float, duration: float, rng) -> np.ndarray:
    return np.sort(rng.uniform(0.0, duration, rng.poisson(rate * duration))) if rate > 0 else np.zeros(0)


def _table(df: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    """``df`` as a table of exactly ``schema`` (missing columns null), column by column."""
    cols = [
        pa.array(df[f.name].to_numpy(), f.type, from_pandas=True) if f.name in df else pa.nulls(len(df), f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(cols, schema=schema)
