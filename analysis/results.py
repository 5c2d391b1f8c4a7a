"""Load one campaign folder (``results/<campaign>/<config>/<trial>/``) into tidy DataFrames.

Everything in ``analysis`` reads results through :func:`load_results`; nothing else opens the files. (What a
campaign is to run is harness.campaign.plan.CampaignPlan; what it wrote is a :class:`CampaignResults`.)
Every table gets ``campaign``, ``config`` and ``trial`` columns taken from the folder layout (the
folders are the truth: a writer that got a column wrong cannot mislabel a trial), ``sweep`` (the trial's sweep
point from its manifest, as in the trials table), and a ``t_rel`` column: seconds since the trial started.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from mmchaos import manifest as M
from mmchaos import schema as S
from mmchaos.errors import MmchaosError
from mmchaos.tables import part_files, table_dir

# Partition columns added while scanning; double underscore so they cannot meet a schema column.
_CONFIG_DIR = "__config_dir"
_TRIAL_DIR = "__trial_dir"
_PARTITIONING = ds.DirectoryPartitioning(
    pa.schema([(_CONFIG_DIR, pa.string()), (_TRIAL_DIR, pa.string())]), segment_encoding="none"
)

# Low-cardinality text columns become pandas categoricals: 1M rows group and compare much faster.
_CATEGORICAL = {
    "requests": ("run_id", "worker", "kind", "case", "probe", "endpoint", "outcome", "error"),
    "health": ("error",),
    "metrics": ("name", "labels"),
    "log_events": ("signature",),
    "crashes": ("reason", "signature"),
    "faults": ("fault", "kind", "target", "source", "outcome"),
}
# Which column of each table is "when", for t_rel.
_TIME_COLUMN = {
    "requests": "t_start",
    "health": "t",
    "metrics": "t",
    "log_events": "t",
    "crashes": "t_detected",
    "faults": "t_injected",
}
_TRIAL_MARKERS = (S.MANIFEST, S.SERVER_LOG, *S.TABLE_DIRS.values())
# Tables a finished trial always has rows in; crashes and log_events have no folder when nothing happened.
_ALWAYS_WRITTEN = ("requests", "health", "metrics")


class LoadError(MmchaosError, ValueError):
    """The folder is not a campaign we can read (missing, empty, no trials)."""


@dataclass
class CampaignResults:
    """One campaign (or several combined, see :func:`combine`) as tidy tables.

    ``requests``, ``health``, ``metrics``, ``log_events``, ``crashes``, ``faults``: the schema.py tables, plus
    ``campaign``, ``config`` (categorical in ``configs`` order), ``trial`` and ``t_rel``.
    ``trials``: one row per trial folder: campaign, config, trial, trial_dir, status, engine, target, flags
    (space-joined), env, workload and sweep (JSON text; sweep: knob -> value of the trial's sweep point, {}
    outside sweeps), users, shape, seed, t_start, t_end (the load window when the runner recorded it, else the
    whole trial), duration_s, git_rev,
    machine, has_manifest, missing (files a finished trial would have), path, n_requests.
    """

    name: str
    path: Path
    configs: list[str]  # display order
    trials: pd.DataFrame
    requests: pd.DataFrame
    health: pd.DataFrame
    metrics: pd.DataFrame
    log_events: pd.DataFrame
    crashes: pd.DataFrame
    faults: pd.DataFrame = field(default_factory=pd.DataFrame)  # empty without columns: made by hand, no faults
    warnings: list[str] = field(default_factory=list)

    def table(self, name: str) -> pd.DataFrame:
        return getattr(self, name)


def find_trials(campaign_dir: Path) -> list[tuple[str, str, Path]]:
    """(config folder, trial folder, path) for every folder two levels down that holds any trial file."""
    found = []
    for config_dir in sorted(p for p in campaign_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for trial_dir in sorted(p for p in config_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if any((trial_dir / m).exists() for m in _TRIAL_MARKERS):
                found.append((config_dir.name, trial_dir.name, trial_dir))
    return found


def load_results(campaign_dir: str | Path) -> CampaignResults:
    """Read every trial of a campaign. Missing files in a trial (interrupted run) are tolerated."""
    campaign_dir = Path(campaign_dir)
    if not campaign_dir.is_dir():
        raise LoadError(f"{campaign_dir} is not a folder (expected results/<campaign>)")
    found = find_trials(campaign_dir)
    if not found:
        inner = [p.name for p in campaign_dir.iterdir() if p.is_dir() and find_trials(p)]
        hint = f"; it holds campaigns {', '.join(sorted(inner))}: pass one of them" if inner else ""
        raise LoadError(f"no trials found in {campaign_dir} (expected <campaign>/<config>/<trial>/{S.MANIFEST}){hint}")

    name = campaign_dir.resolve().name
    notes: list[str] = []
    trials = _trials_table(name, found, notes)
    tables, rows_trial = {}, {}  # rows_trial[table][i]: which trials row table row i belongs to
    for table_name in S.REPORT_TABLES:
        files = _files_for(table_name, found, notes)
        tables[table_name], rows_trial[table_name] = _load_table(table_name, files, campaign_dir, trials, notes)
    tables["log_events"]["image_hash"] = _images_of_request(tables["log_events"], tables["requests"])
    _check_crash_counts(trials, rows_trial["crashes"], notes)
    _fill_times_from_data(trials, tables, rows_trial)
    starts = trials["t_start"].to_numpy()
    for table_name, df in tables.items():
        df["t_rel"] = df[_TIME_COLUMN[table_name]].to_numpy() - starts[rows_trial[table_name]]
    trials["n_requests"] = np.bincount(rows_trial["requests"], minlength=len(trials))
    configs = _config_order(campaign_dir, trials)
    trials["config"] = pd.Categorical(trials["config"], categories=configs)
    for df in tables.values():
        df["config"] = df["config"].cat.set_categories(configs)
    trials = trials.sort_values(["config", "trial"], ignore_index=True)
    return CampaignResults(name, campaign_dir, configs, trials, warnings=notes, **tables)


def combine(campaigns: list[CampaignResults]) -> CampaignResults:
    """Several campaigns in one (for before/after comparisons): configs become ``<campaign>/<config>``."""
    names = []
    for c in campaigns:  # two folders with the same name still need distinct prefixes
        n, i = c.name, 2
        while n in names:
            n, i = f"{c.name}#{i}", i + 1
        names.append(n)
    configs = [f"{n}/{cfg}" for n, c in zip(names, campaigns) for cfg in c.configs]
    out = {}
    for table_name in ("trials", *S.REPORT_TABLES):
        parts = []
        for n, c in zip(names, campaigns):
            df = c.table(table_name).copy()
            df["campaign"] = pd.Categorical([n] * len(df), categories=names)
            df["config"] = df["config"].cat.rename_categories(lambda cfg, n=n: f"{n}/{cfg}").cat.set_categories(configs)
            parts.append(df)
        # give each categorical the union of categories first, so concat keeps it categorical (and cheap)
        for col in parts[0].columns:
            if all(isinstance(p[col].dtype, pd.CategoricalDtype) for p in parts):
                cats = list(dict.fromkeys(v for p in parts for v in p[col].cat.categories))
                for p in parts:
                    p[col] = p[col].cat.set_categories(cats)
        out[table_name] = pd.concat(parts, ignore_index=True)
    notes = [f"{n}: {w}" for n, c in zip(names, campaigns) for w in c.warnings]
    return CampaignResults(" vs ".join(names), campaigns[0].path, configs, warnings=notes, **out)


# --- trials -------------------------------------------------------------------------------------------


def _trials_table(name: str, found: list[tuple[str, str, Path]], notes: list[str]) -> pd.DataFrame:
    rows = []
    for config, trial_name, path in found:
        manifest, has_manifest = M.TrialManifest(), False
        mpath = path / S.MANIFEST
        if mpath.exists():
            try:
                manifest, unreadable = M.read(mpath)
                has_manifest = bool(manifest.model_fields_set)
            except (OSError, M.ManifestError) as e:
                notes.append(f"{config}/{trial_name}: unreadable {S.MANIFEST} ({e}); using what the tables say")
            else:  # a manifest of another mmchaos version: what it holds that this one cannot read is left out
                notes += [f"{config}/{trial_name}: {n.removeprefix(str(mpath) + ': ')}" for n in unreadable]
        if manifest.config not in ("", config):
            notes.append(f"{config}/{trial_name}: manifest says config {manifest.config!r}; using the folder name")
        if manifest.workers_lost:  # Locust workers that died mid-trial: less load from then on
            lost = [str(w) for w in manifest.workers_lost]
            notes.append(
                f"{config}/{trial_name}: {len(lost)} Locust worker(s) lost mid-trial ({', '.join(lost)}); "
                "their rows up to their last flush are kept"
            )
        workload = manifest.workload
        missing = [m for m in (S.MANIFEST, S.SERVER_LOG) if not (path / m).exists()]
        missing += [d for t, d in S.TABLE_DIRS.items() if t in _ALWAYS_WRITTEN and not part_files(path / d)]
        # a trial's clock is its load (server start-up and shutdown excluded; a whole replayed log: the log's)
        t_start, t_end = manifest.load_window()
        rows.append(
            {
                "campaign": name,
                "config": config,
                "trial": _trial_number(manifest.trial, trial_name),
                "trial_dir": trial_name,
                "status": manifest.status or "unknown",
                "engine": manifest.engine,
                "target": manifest.target,
                "flags": " ".join(manifest.flags),
                "env": json.dumps(manifest.env, sort_keys=True),
                "workload": json.dumps(workload, sort_keys=True),
                "sweep": json.dumps(manifest.sweep, sort_keys=True),  # knob -> value of a sweep point
                "users": workload.get("users"),
                "shape": workload.get("shape"),
                # the runner writes the trial's seed at the top (the campaign's seed + the trial's repeat)
                "seed": manifest.seed,
                "t_start": _float(t_start),
                "t_end": _float(t_end),
                "git_rev": manifest.git_rev,
                "machine": manifest.machine
                if isinstance(manifest.machine, (str, type(None)))
                else json.dumps(manifest.machine, sort_keys=True),
                "has_manifest": has_manifest,
                "manifest_crashes": manifest.crashes,
                "missing": ", ".join(missing),
                "path": str(path),
            }
        )
    trials = pd.DataFrame(rows)
    dup = trials.duplicated(["config", "trial"], keep=False)
    if dup.any():  # two folders claiming one trial number: fall back to folder order so both are kept
        notes.append("duplicate trial numbers in manifests; numbering trials by folder order instead")
        trials["trial"] = trials.groupby("config").cumcount()
    trials["trial"] = trials["trial"].astype(int)
    for col in ("users", "seed"):
        trials[col] = pd.to_numeric(trials[col], errors="coerce")
    return trials


def _trial_number(value, folder: str) -> int:
    if isinstance(value, (int, np.integer)) or (isinstance(value, str) and value.isdigit()):
        return int(value)
    digits = re.findall(r"\d+", folder)
    return int(digits[-1]) if digits else -1


def _float(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return np.nan


def _config_order(campaign_dir: Path, trials: pd.DataFrame) -> list[str]:
    """campaign.json's order when it is there and readable, then the rest by when they started."""
    present = list(dict.fromkeys(trials.sort_values(["t_start", "config"])["config"]))
    listed: list[str] = []
    try:
        meta = json.loads((campaign_dir / S.CAMPAIGN_MANIFEST).read_text())
        for c in meta.get("configs") or []:
            listed.append(c if isinstance(c, str) else str(c.get("name", "")) if isinstance(c, dict) else str(c))
    except (OSError, ValueError, AttributeError):
        pass
    return [c for c in listed if c in present] + [c for c in present if c not in listed]


def _fill_times_from_data(trials: pd.DataFrame, tables: dict[str, pd.DataFrame], rows_trial: dict) -> None:
    """A trial without t_start/t_end in its manifest spans what its tables saw."""
    lo, hi = [], []
    for table_name, col in _TIME_COLUMN.items():
        t = tables[table_name][col].to_numpy()
        end = t + (tables[table_name]["latency_ms"].fillna(0).to_numpy() / 1000 if table_name == "requests" else 0)
        lo.append(pd.Series(t).groupby(rows_trial[table_name]).min())
        hi.append(pd.Series(end).groupby(rows_trial[table_name]).max())
    seen_lo = pd.concat(lo).groupby(level=0).min().reindex(trials.index)
    seen_hi = pd.concat(hi).groupby(level=0).max().reindex(trials.index)
    trials["t_start"] = trials["t_start"].fillna(seen_lo)
    trials["t_end"] = trials["t_end"].fillna(seen_hi)
    trials["duration_s"] = (trials["t_end"] - trials["t_start"]).clip(lower=0)


# --- tables -------------------------------------------------------------------------------------------


def _files_for(table_name: str, found: list[tuple[str, str, Path]], notes: list[str]) -> list[Path]:
    return [f for _, _, p in found for f in part_files(table_dir(p, table_name), notes)]


def _check_crash_counts(trials: pd.DataFrame, crash_rows: np.ndarray, notes: list[str]) -> None:
    """A trial whose crashes table holds fewer crashes than its manifest counted lost some: say so."""
    held = np.bincount(crash_rows, minlength=len(trials))
    for i, said in enumerate(trials["manifest_crashes"]):
        if pd.notna(said) and int(said) != held[i]:
            notes.append(
                f"{trials['config'].iat[i]}/{trials['trial_dir'].iat[i]}: the manifest says {int(said)} "
                f"crash(es) but its crashes table holds {held[i]}; the counts here use the table"
            )


def _load_table(
    table_name: str, files: list[Path], base: Path, trials: pd.DataFrame, notes: list[str]
) -> tuple[pd.DataFrame, np.ndarray]:
    schema = S.TABLES[table_name]
    full = schema.append(pa.field(_CONFIG_DIR, pa.string())).append(pa.field(_TRIAL_DIR, pa.string()))
    table = None
    if files:
        try:  # one multithreaded scan over every part file
            dataset = ds.dataset(
                [str(f) for f in files],
                schema=full,
                format="parquet",
                partitioning=_PARTITIONING,
                partition_base_dir=str(base),
            )
            table = dataset.to_table()
        except (pa.ArrowException, OSError) as e:  # a truncated or odd file: read file by file, skip the bad ones
            notes.append(f"{table_name}: fast scan failed ({str(e).splitlines()[0][:160]}); reading file by file")
            table = _load_file_by_file(files, base, schema, full, notes)
    if table is None:
        table = full.empty_table()
    return _to_frame(table_name, table, schema, trials)


def _load_file_by_file(files, base: Path, schema: pa.Schema, full: pa.Schema, notes: list[str]) -> pa.Table:
    parts = []
    for f in files:
        try:
            t = pq.read_table(f)
        except (pa.ArrowException, OSError) as e:
            notes.append(f"skipped unreadable {f.relative_to(base)} ({str(e).splitlines()[0][:160]})")
            continue
        rel = f.relative_to(base).parts
        cols = []
        for fld in schema:
            if fld.name in t.column_names:
                cols.append(t.column(fld.name).cast(fld.type, safe=False))
            else:
                cols.append(pa.nulls(len(t), fld.type))
        cols += [pa.array([rel[0]] * len(t), pa.string()), pa.array([rel[1]] * len(t), pa.string())]
        parts.append(pa.Table.from_arrays(cols, schema=full))
    return pa.concat_tables(parts) if parts else full.empty_table()


def _to_frame(
    table_name: str, table: pa.Table, schema: pa.Schema, trials: pd.DataFrame
) -> tuple[pd.DataFrame, np.ndarray]:
    # Map each row's folders to the trial row (config name from the folder, trial number from the manifest).
    trial_key = pc.binary_join_element_wise(table.column(_CONFIG_DIR), table.column(_TRIAL_DIR), "/")
    encoded = pc.dictionary_encode(trial_key).combine_chunks()
    lookup = {f"{c}/{d}": i for i, (c, d) in enumerate(zip(trials["config"], trials["trial_dir"]))}
    dict_to_trial = np.array([lookup[k] for k in encoded.dictionary.to_pylist()], dtype=np.int64)
    row_trial = dict_to_trial[encoded.indices.to_numpy(zero_copy_only=False)] if len(table) else np.zeros(0, int)

    config_codes, config_names = pd.factorize(trials["config"])
    cols = [c for c in schema.names if c not in ("config", "trial")]
    table = table.select(cols)
    for c in _CATEGORICAL.get(table_name, ()):
        if c in cols:
            table = table.set_column(cols.index(c), c, pc.dictionary_encode(table.column(c)))
    df = table.to_pandas(self_destruct=True, split_blocks=True)
    ids = pd.DataFrame(
        {
            "campaign": pd.Categorical.from_codes(np.zeros(len(df), dtype=np.int8), [trials["campaign"].iat[0]]),
            "config": pd.Categorical.from_codes(config_codes[row_trial], config_names),
            "trial": trials["trial"].to_numpy()[row_trial].astype(np.int32),
        }
    )
    sweep_codes, sweep_names = pd.factorize(trials["sweep"])
    ids["sweep"] = pd.Categorical.from_codes(sweep_codes[row_trial], sweep_names)  # each row's sweep point
    return pd.concat([ids, df], axis=1), row_trial


def media_hashes(r: pd.DataFrame) -> np.ndarray:
    """Each row's images and videos, comma-joined: a video poisons and is reused as an image is (measured on 0.30.0
    and 0.32.0, payloads/video_cases.py); results written before videos have no video_hashes column."""
    images = r["image_hashes"].to_numpy(dtype=object)
    if "video_hashes" not in r or not r["video_hashes"].notna().any():
        return images
    videos = r["video_hashes"].to_numpy(dtype=object)
    both = pd.notna(images) & pd.notna(videos)
    out = np.where(pd.isna(images), videos, images)
    out[both] = [f"{a},{b}" for a, b in zip(images[both], videos[both])]
    return out


def _images_of_request(events: pd.DataFrame, requests: pd.DataFrame) -> pd.Series:
    """For log lines that name one of our requests (X-Request-Id), the images and videos that request carried
    (comma-joined hashes in the requests table's space; vLLM's own mm_hash is not). Null where unknown."""
    ids = events["request_id"].dropna()
    if ids.empty:
        return pd.Series(None, index=events.index, dtype=object)
    named = requests[requests["request_id"].isin(set(ids))]  # a few rows: their media only, not every row's
    media = pd.Series(media_hashes(named), index=named["request_id"].to_numpy()).dropna()
    return events["request_id"].map(media[~media.index.duplicated()].astype(str)).astype(object)


def fatal_lines(trial_path: str | Path, sigs, before: int = 60, after: int = 4) -> tuple[list[str], int] | None:
    """The lines of a trial's server log that tell its first death: from the traceback (or drift line) that led
    to the first line a fatal signature names, to a few lines after it; and the first line's number. None when
    no line names a death (a SIGKILL, a hang): then the log's end is what there is."""
    p = Path(trial_path) / S.SERVER_LOG
    if not p.exists():
        return None
    lines = p.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        m = sigs.match(line)
        if m is not None and m.signature.fatal:
            start = i
            for j in range(i, max(-1, i - before), -1):  # back to where its story starts
                start = j
                hit = sigs.match(lines[j])
                if "Traceback (most recent call last)" in lines[j] or (hit is not None and hit.signature.drift):
                    break
            return lines[start : i + after + 1], start + 1
    return None


def read_server_log(trial_path: str | Path, tail_lines: int = 40) -> list[str]:
    """The last lines of a trial's server log ([] when there is none)."""
    p = Path(trial_path) / S.SERVER_LOG
    if not p.exists():
        return []
    with open(p, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - 64 * 1024))
        return f.read().decode("utf-8", "replace").splitlines()[-tail_lines:]
