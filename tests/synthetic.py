"""A synthetic campaign folder with the real layout, for tests and the analysis benchmark.

Each configuration is a small model of a server: requests arrive uniformly, latencies are lognormal per
kind, and "incidents" arrive as a Poisson process. An incident is the bug's sequence: a malformed_post
request poisons an image, the next valid request with that image hits the cache drift, and the server
either dies (``crash_per_hour``; it restarts after ``restart_s``) or answers a retryable 503
(``drift_per_hour``). Nothing here is a claim about vLLM; it only has to look like what the harness writes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from mmchaos import schema as S
from mmchaos.manifest import TrialManifest
from mmchaos.outcomes import causes
from mmchaos.tables import table_dir


@dataclass
class SyntheticConfig:
    name: str
    flags: list[str] = field(default_factory=list)
    engine: str | None = "0.30.0"
    crash_per_hour: float = 0.0
    drift_per_hour: float = 0.0  # drift answered with a retryable 503, server stays up
    latency_factor: float = 1.0  # multiplies every kind's median latency
    restart_s: float = 30.0


DEFAULT_CONFIGS = (
    SyntheticConfig("default", crash_per_hour=12.0),
    SyntheticConfig("no-mm-cache", ["--mm-processor-cache-gb", "0"], latency_factor=1.35),
    SyntheticConfig("v0.32", engine="0.32.0", drift_per_hour=30.0),
)

MIX = {  # request kind -> share of the realistic mix
    "valid_image": 0.45,
    "text": 0.20,
    "multi_image": 0.10,
    "batch": 0.08,
    "tokenize": 0.05,
    "malformed_pre": 0.04,
    "malformed_post": 0.04,
    "abort": 0.02,
    "probe": 0.02,
}
MEDIAN_MS = {  # median latency per kind
    "valid_image": 120.0,
    "text": 25.0,
    "multi_image": 260.0,
    "batch": 180.0,
    "tokenize": 15.0,
    "malformed_pre": 4.0,
    "malformed_post": 60.0,
    "abort": 50.0,
    "probe": 110.0,
}
N_IMAGES = {"valid_image": 1, "multi_image": 3, "batch": 2, "tokenize": 1, "malformed_post": 1, "abort": 1, "probe": 1}
PRE_CASES = ("bad_encoding_format", "schema_type_error", "truncate_gt_max_len")
POST_CASES = ("dimensions_unsupported", "prompt_too_long")
DRIFT_LINE = (
    "WARNING [core.py:1868] Multi-modal cache miss for request embd-{rid} (mm_hashes=['{h}']): P0/P1 cache drift; "
    "returning a retryable response so the items are resent with data."
)
FATAL_LINE = "AssertionError: assert req_state.detokenizer is not None"


def _request_id(trial: int, i: int) -> str:
    """The X-Request-Id mmchaos would have sent (locustfiles.base), unique within the trial."""
    return f"mmc-synth{trial}-0-0-{i}"


def make_campaign(
    root: str | Path,
    name: str = "synthetic",
    configs: tuple[SyntheticConfig, ...] | list[SyntheticConfig] = DEFAULT_CONFIGS,
    trials: int = 3,
    requests_per_trial: int = 2000,
    duration_s: float = 600.0,
    seed: int = 0,
    part_rows: int = 5000,
    error_text: str | None = None,
    interrupt_last: bool = True,
    t0: float = 1_760_000_000.0,
) -> Path:
    """Write ``root/name/<config>/t###/...``; return the campaign folder.

    ``error_text`` replaces the malformed_post error message (tests use it to check HTML escaping).
    ``interrupt_last`` leaves the last trial of the last configuration unfinished: no health/metrics
    files, no t_end, status "interrupted".
    """
    rng = np.random.default_rng(seed)
    camp = Path(root) / name
    camp.mkdir(parents=True, exist_ok=True)
    (camp / S.CAMPAIGN_MANIFEST).write_text(json.dumps({"name": name, "configs": [c.name for c in configs]}))
    pool = np.array([hashlib.sha256(f"img{i}".encode()).hexdigest()[:16] for i in range(200)])
    start = t0
    for ci, cfg in enumerate(configs):
        for trial in range(trials):
            interrupted = interrupt_last and ci == len(configs) - 1 and trial == trials - 1
            folder = camp / cfg.name / S.trial_folder(trial)
            _write_trial(
                folder,
                name,
                cfg,
                trial,
                start,
                duration_s,
                requests_per_trial,
                part_rows,
                pool,
                error_text,
                interrupted,
                rng,
            )
            start += duration_s + 30
    return camp


def _write_trial(folder, campaign, cfg, trial, t0, duration, n, part_rows, pool, error_text, interrupted, rng):
    kinds = np.array(list(MIX))
    t = np.sort(rng.uniform(0, duration, n))
    kind = kinds[rng.choice(len(kinds), n, p=np.array(list(MIX.values())) / sum(MIX.values()))].astype(object)
    lat = rng.lognormal(0.0, 0.45, n) * np.array([MEDIAN_MS[k] for k in kind]) * cfg.latency_factor
    zipf = 1.0 / np.arange(1, len(pool) + 1) ** 1.1
    img = rng.choice(len(pool), (n, 3), p=zipf / zipf.sum())
    n_img = np.array([N_IMAGES.get(k, 0) for k in kind])
    status = np.full(n, 200.0)
    outcome = np.full(n, S.OK, dtype=object)
    error = np.full(n, None, dtype=object)
    case = np.full(n, None, dtype=object)
    expected = np.full(n, np.nan)

    pre, post = kind == "malformed_pre", kind == "malformed_post"
    case[pre] = rng.choice(PRE_CASES, pre.sum())
    case[post] = rng.choice(POST_CASES, post.sum())
    expected[pre | post] = 400
    status[pre | post] = 400
    outcome[pre | post] = S.HTTP_ERROR
    error[pre] = "Invalid request body"
    error[post] = error_text or "This model does not support matryoshka representation (dimensions=5)"
    ab = kind == "abort"
    status[ab], outcome[ab], error[ab] = np.nan, S.ABORTED, "client aborted"
    slow = rng.random(n) < 0.001  # the odd timeout, as under real load
    status[slow], outcome[slow], error[slow], lat[slow] = np.nan, S.TIMEOUT, "read timeout", 30_000.0

    # Incidents: Poisson arrivals over the trial; crashes take the server down for restart_s.
    log, crashes, down = [], [], []
    restart = 0
    for what, rate in (("crash", cfg.crash_per_hour), ("drift", cfg.drift_per_hour)):
        if rate <= 0:
            continue
        ti = 0.0
        while True:
            ti += rng.exponential(3600.0 / rate)
            if ti >= duration - 5:
                break
            if any(a <= ti <= b for a, b in down):
                continue
            trig = np.searchsorted(t, ti) - 1
            poison = np.searchsorted(t, ti - 3.0) - 1
            if poison < 0 or trig <= poison:
                continue
            h = rng.integers(len(pool))
            kind[poison], case[poison], expected[poison], n_img[poison] = "malformed_post", POST_CASES[0], 400, 1
            status[poison], outcome[poison] = 400, S.HTTP_ERROR
            error[poison] = error_text or "This model does not support matryoshka representation (dimensions=5)"
            kind[trig], case[trig], expected[trig], n_img[trig] = "valid_image", None, np.nan, 1
            img[poison, 0] = img[trig, 0] = h
            log.append(
                (
                    t0 + t[trig] + 0.05,
                    "cache_drift",
                    False,
                    pool[h],
                    _request_id(trial, trig),
                    DRIFT_LINE.format(rid=_request_id(trial, trig), h=pool[h]),
                )
            )
            if what == "drift":
                status[trig], outcome[trig], error[trig] = 503, S.HTTP_ERROR, "Multi-modal processor cache miss."
                continue
            tc = t[trig] + 0.1
            back = tc + cfg.restart_s
            log.append((t0 + tc, "detokenizer_assert", True, None, None, FATAL_LINE))
            dead = (t >= t[trig]) & (t < back)
            status[dead], outcome[dead], error[dead] = np.nan, S.CONNECTION_ERROR, "Connection refused"
            lat[dead] = rng.uniform(0.2, 2.0, dead.sum())
            crashes.append((t0 + tc + 2.0, t0 + tc - 0.9, "process_exit", "detokenizer_assert", 1, 3, restart))
            restart += 1
            down.append((tc, back))

    ids = np.array([f"img{i}" for i in range(len(pool))], dtype=object)
    image_ids = np.full(n, None, dtype=object)
    image_hashes = np.full(n, None, dtype=object)
    for k in (1, 2, 3):
        m = n_img == k
        image_ids[m] = [",".join(r) for r in ids[img[m, :k]]]
        image_hashes[m] = [",".join(r) for r in pool[img[m, :k]]]
    users = 16
    user = rng.integers(0, users, n)
    seq = np.zeros(n, dtype=np.int64)
    for u in range(users):  # per-user sequence numbers in send order
        m = user == u
        seq[m] = np.arange(m.sum())
    table = pa.table(
        {
            "run_id": np.full(n, f"{campaign}-{cfg.name}-{trial}", dtype=object),
            "config": np.full(n, cfg.name, dtype=object),
            "trial": np.full(n, trial, dtype=np.int32),
            "worker": np.full(n, "localhost:4242", dtype=object),
            "user_id": user.astype(np.int32),
            "seq": seq,
            "request_id": np.array([_request_id(trial, i) for i in range(n)], dtype=object),
            "kind": kind,
            "case": case,
            "probe": np.full(n, None, dtype=object),
            "expected_status": pa.array(expected, pa.int32(), from_pandas=True),
            "endpoint": np.where(kind == "tokenize", "/tokenize", "/v1/embeddings").astype(object),
            "t_start": t0 + t,
            "latency_ms": lat,
            "t_sched": pa.nulls(n, pa.float64()),  # closed loop: no schedule
            "sched_lag_ms": pa.nulls(n, pa.float64()),
            "status": pa.array(status, pa.int32(), from_pandas=True),
            "outcome": outcome,
            "error": error,
            "cause": causes(pd.DataFrame({"status": status, "outcome": outcome, "expected_status": expected})),
            "attempt": np.ones(n, dtype=np.int16),  # the synthetic client does not retry (--retry-policy none)
            "request_group": np.array([_request_id(trial, i) for i in range(n)], dtype=object),
            "final": np.ones(n, dtype=bool),
            "reconnects": np.zeros(n, dtype=np.int16),
            "consistent": pa.nulls(n, pa.bool_()),  # the wrong-answer oracle did not look
            "n_images": n_img.astype(np.int16),
            "image_ids": image_ids,
            "image_hashes": image_hashes,
            "n_videos": np.zeros(n, dtype=np.int16),
            "video_hashes": np.full(n, None, dtype=object),
            "request_bytes": (400 + n_img * 60_000).astype(np.int64),
            "response_bytes": np.where(outcome == S.OK, 4096, 120).astype(np.int64),
        },
        schema=S.REQUESTS,
    )
    _write_parts(folder, "requests", table, part_rows)

    def is_down(x):
        return np.any([(x >= a) & (x < b) for a, b in down], axis=0) if down else np.zeros(len(x), bool)

    if not interrupted:
        th = np.arange(0, duration, 2.0)
        up = ~is_down(th)
        _write_parts(
            folder,
            "health",
            pa.table(
                {
                    "t": t0 + th,
                    "ok": up,
                    "status": pa.array(np.where(up, 200, np.nan), pa.int32(), from_pandas=True),
                    "latency_ms": rng.lognormal(1.0, 0.3, len(th)),
                    "error": np.where(up, None, "Connection refused").astype(object),
                },
                schema=S.HEALTH,
            ),
        )
        tm = np.arange(0, duration, 5.0)
        up = ~is_down(tm)
        running = np.where(up, rng.poisson(6, len(tm)), 0).astype(float)
        queries = np.cumsum(rng.poisson(40, len(tm))).astype(float)
        names = [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:mm_cache_queries_total",
            "vllm:mm_cache_hits_total",
        ]
        values = [running, np.where(up, rng.poisson(2, len(tm)), 0.0), queries, np.floor(queries * 0.7)]
        _write_parts(
            folder,
            "metrics",
            pa.table(
                {
                    "t": np.tile(t0 + tm, len(names)),
                    "name": np.repeat(names, len(tm)).astype(object),
                    "labels": np.full(len(tm) * len(names), '{"model_name": "tiny"}', dtype=object),
                    "value": np.concatenate(values),
                },
                schema=S.METRICS,
            ),
        )
        crash_rows = [dict(zip(S.CRASHES.names, c)) for c in crashes]
        _write_parts(folder, "crashes", S.table_from_rows(crash_rows, S.CRASHES))
    _write_parts(
        folder, "log_events", S.table_from_rows([dict(zip(S.LOG_EVENTS.names, e)) for e in sorted(log)], S.LOG_EVENTS)
    )
    (folder / S.SERVER_LOG).write_text("INFO Started server process\n" + "\n".join(e[-1] for e in sorted(log)) + "\n")
    manifest = {  # checked as the runner's are (mmchaos/manifest.py), written as they are
        "campaign": campaign,
        "config": cfg.name,
        "trial": trial,
        "engine": cfg.engine,
        "flags": list(cfg.flags),
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        "target": "engine",
        "workload": {
            "users": users,
            "spawn_rate": 4,
            "duration_s": duration,
            "max_requests": None,
            "shape": "steady",
            "mix": MIX,
        },
        "seed": int(rng.integers(1 << 30)),
        "t_start": t0,
        "t_end": None if interrupted else t0 + duration,
        "status": "interrupted" if interrupted else "completed",
        "git_rev": "0000000",
        "machine": {"host": "synthetic", "cpus": 2},
    }
    (folder / S.MANIFEST).write_text(json.dumps(TrialManifest.model_validate(manifest).dump(), indent=1))


def _write_parts(trial_dir: Path, table_name: str, table: pa.Table, part_rows: int = 1_000_000) -> None:
    folder = table_dir(trial_dir, table_name)
    folder.mkdir(parents=True, exist_ok=True)
    for i, lo in enumerate(range(0, max(len(table), 1), part_rows)):
        pq.write_table(table.slice(lo, part_rows), folder / f"part-synthetic-{i:06d}.parquet")
