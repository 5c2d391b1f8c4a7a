"""What caused each drift event or crash, and what was sent just before it — so the report can say what triggers it.

The cause comes first, in the server's own words (mmchaos/cause_rule.py): the drift line names the request it
missed (and its ``mm_hash``); the request's image — the one whose ``mm_hash`` the server named, where earlier lines
told which of a request's images that is — is followed back through the same server's life to the first request
that carried it and failed after render (columns ``cause*``). A crash takes the cause of the drift line that
opened its chain (the last one of its server's life). Incidents without that evidence have no cause.

The window statistics below are the second opinion (column ``lift``):

For a drift / cache-miss log line that names our request (X-Request-Id; ``image_hash`` in results.py) we
look for requests that carried one of its images or videos (``media_hashes``) in the window before it: the
poisoners. vLLM's own mm_hash hashes the decoded image, in another hash space, so where the line names no request
of ours we fall back to every request with images in the window, and say so (column ``match``). Crashes carry no
mm_hash: their window runs from ``window_s`` before the last healthy moment to the detection.

To tell a trigger from a bystander, each kind/case is compared with a background: the same windows placed
before randomly chosen image requests of the same configuration. ``lift`` > 1 means the kind shows up before
events more often than before any request.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from mmchaos import cause_rule
from mmchaos import schema as S

from .intervals import SEED
from .results import CampaignResults, media_hashes
from .stats import drift_events

DEFAULT_WINDOW_S = 10.0
SAME_IMAGE = "same image"
WINDOW = "all images in window"
NO_CASE = "—"
BACKGROUND_SAMPLES = 500
MIN_LIFT_EVENTS = 5  # a case is named from window statistics alone only over at least this many incidents
PRE_RENDER_KINDS = ("malformed_pre",)  # fail before their image is processed: by our catalogue they cannot poison


def attribute(c: CampaignResults, window_s: float = DEFAULT_WINDOW_S) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-event table, per-config summary). See the module docstring for the matching rules."""
    events = _events(c, window_s)
    index = _ImageIndex(c)
    e_ids, rows, matched = index.pairs(events)
    events["match"] = np.where(matched, SAME_IMAGE, WINDOW)
    sent = index.sent(e_ids, rows)
    events = _with_causes(c, events, index)
    return _per_event(events, sent), _summary(c, events, sent, index)


def _events(c: CampaignResults, window_s: float) -> pd.DataFrame:
    d = drift_events(c)
    t = d["t"].to_numpy()
    drift = pd.DataFrame(
        {
            "config": d["config"].astype(str).to_numpy(),
            "trial": d["trial"].to_numpy(),
            "event": "drift",
            "signature": d["signature"].astype(str).to_numpy(),
            "t": t,
            "t_rel": d["t_rel"].to_numpy(),
            "mm_hash": d["image_hash"].astype(object).to_numpy(),
            "lo": t - window_s,
            "hi": t,
            "server_mm_hash": d["mm_hash"].astype(object).to_numpy(),
            "request_id": d["request_id"].astype(object).to_numpy(),
        }
    )
    cr = c.crashes
    t = cr["t_detected"].to_numpy(dtype=float)
    start = np.fmin(cr["t_last_healthy"].to_numpy(dtype=float), t)  # fmin: a missing last-healthy is ignored
    crash = pd.DataFrame(
        {
            "config": cr["config"].astype(str).to_numpy(),
            "trial": cr["trial"].to_numpy(),
            "event": "crash",
            "signature": cr["signature"].astype(object).fillna("(unclassified)").astype(str).to_numpy(),
            "t": t,
            "t_rel": cr["t_rel"].to_numpy(),
            "mm_hash": None,
            "lo": start - window_s,
            "hi": t,
            "server_mm_hash": None,
            "request_id": None,
        }
    )
    ev = pd.concat([drift, crash], ignore_index=True)
    ev["config"] = pd.Categorical(ev["config"], categories=c.configs)
    ev = ev.sort_values(["config", "trial", "t"], ignore_index=True)
    ev.insert(0, "event_id", np.arange(len(ev)))
    return ev


def _trial_code(config, trial, configs: list[str]) -> np.ndarray:
    """One int per (config, trial); both sides use the campaign's config order, so codes agree."""
    codes = pd.Categorical(
        np.asarray(config, dtype=object) if not isinstance(config, pd.Series) else config, categories=configs
    ).codes
    return codes.astype(np.int64) * (1 << 32) + np.asarray(trial, dtype=np.int64)


class _ImageIndex:
    """Requests that carried images or videos (a video poisons as an image does), with their hashes exploded once
    (only if some event needs them)."""

    def __init__(self, c: CampaignResults):
        r = c.requests
        media = media_hashes(r)
        cols = [
            "config",
            "trial",
            "t_start",
            "latency_ms",
            "kind",
            "case",
            "request_id",
            "status",
            "outcome",
            "endpoint",
        ]
        img = r.loc[pd.notna(media), cols].assign(media=media[pd.notna(media)])
        self.configs = c.configs
        self.img = img
        self.key = _trial_code(img["config"], img["trial"], c.configs)
        self.t = img["t_start"].to_numpy()
        self.kind = _Labels(img["kind"])
        self.case = _Labels(img["case"])
        self.config_code = pd.Categorical(img["config"], categories=c.configs).codes
        self._hashes = None
        self._by_trial: _Sorted | None = None

    def hashes(self):
        """(request position per hash, unique hashes, requests sorted by (trial, hash) and time)."""
        if self._hashes is None:
            # in Arrow: splitting and encoding 1M hash strings as Python objects would take seconds
            split = pc.split_pattern(pa.chunked_array([pa.array(self.img["media"], pa.string())]), ",")
            parent = pc.list_parent_indices(split).to_numpy()
            enc = pc.dictionary_encode(pc.utf8_trim_whitespace(pc.list_flatten(split))).combine_chunks()
            codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
            uniques = pd.Index(enc.dictionary.to_pylist(), dtype=object)
            group = self.key[parent] * max(len(uniques), 1) + codes
            self._hashes = parent, pd.Index(uniques), _Sorted(group, self.t[parent])
        return self._hashes

    def by_trial(self) -> _Sorted:
        if self._by_trial is None:
            self._by_trial = _Sorted(self.key, self.t)
        return self._by_trial

    def pairs(self, events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(event positions, image-request positions, per-event "matched by image") for ``events``."""
        ev_key = _trial_code(events["config"], events["trial"], self.configs)
        lo, hi = events["lo"].to_numpy(dtype=float), events["hi"].to_numpy(dtype=float)
        has_hash = events["mm_hash"].notna().to_numpy()
        matched = np.zeros(len(events), dtype=bool)
        out_e, out_r = [], []
        if has_hash.any() and len(self.img):
            parent, uniques, by_hash = self.hashes()
            # every image of the request the line names: a poisoned second image counts as much as the first
            named = np.flatnonzero(has_hash)
            images = [str(h).split(",") for h in events["mm_hash"].to_numpy()[named]]
            ev_of = np.repeat(named, [len(x) for x in images])
            codes = uniques.get_indexer([x.strip() for xs in images for x in xs])
            ev_of, codes = ev_of[codes >= 0], codes[codes >= 0]
            e, p = by_hash.join(ev_key[ev_of] * max(len(uniques), 1) + codes, lo[ev_of], hi[ev_of])
            found = np.unique(np.stack([ev_of[e], parent[p]]), axis=1)  # a request with two of its images: once
            out_e.append(found[0])
            out_r.append(found[1])
            matched[found[0]] = True
        rest = np.flatnonzero(~matched)
        e, p = self.by_trial().join(ev_key[rest], lo[rest], hi[rest])
        out_e.append(rest[e])
        out_r.append(p)
        return np.concatenate(out_e), np.concatenate(out_r), matched

    def sent(self, e_ids: np.ndarray, rows: np.ndarray) -> pd.DataFrame:
        return pd.DataFrame(
            {"event_id": e_ids, "kind": self.kind[rows], "case": self.case[rows], "t_start": self.t[rows]}
        )


class _Labels:
    """A categorical column as codes, turned into text only for the rows asked for (700k strings are slow)."""

    def __init__(self, col: pd.Series):
        cat = col if isinstance(col.dtype, pd.CategoricalDtype) else col.astype("category")
        self.codes = cat.cat.codes.to_numpy()
        self.text = np.append(np.asarray(cat.cat.categories, dtype=object).astype(str), NO_CASE)  # code -1 -> last

    def __getitem__(self, rows) -> np.ndarray:
        return self.text[self.codes[rows]]


class _Sorted:
    """Requests sorted by (group, time), ready to answer "which rows of group g have lo <= t <= hi" for many
    windows at once. Built once per kind of group key and reused (the sort is the expensive part)."""

    def __init__(self, group, t):
        group, t = np.asarray(group, np.int64), np.asarray(t, float)
        self.order = np.lexsort((t, group))
        self.right = pd.DataFrame(
            {"g": group[self.order], "t": t[self.order], "pos": np.arange(len(self.order))}
        ).sort_values("t", kind="stable")

    def join(self, ev_group, ev_lo, ev_hi) -> tuple[np.ndarray, np.ndarray]:
        """All (event index, request index) with equal group and ev_lo <= t <= ev_hi.

        Two as-of joins find, per event, the first and last request of its group inside the window (positions
        in group-then-time order); the pairs are the ranges between them. No event × request product.
        """
        n_ev = len(ev_group)
        if n_ev == 0 or len(self.order) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        ev = pd.DataFrame({"g": np.asarray(ev_group, np.int64), "lo": ev_lo, "hi": ev_hi, "eid": np.arange(n_ev)})
        first = pd.merge_asof(
            ev.sort_values("lo").drop(columns="hi"),
            self.right.rename(columns={"t": "lo"}),
            on="lo",
            by="g",
            direction="forward",
        )
        last = pd.merge_asof(
            ev.sort_values("hi").drop(columns="lo"),
            self.right.rename(columns={"t": "hi"}),
            on="hi",
            by="g",
            direction="backward",
        )
        lo_pos = first.set_index("eid")["pos"].reindex(np.arange(n_ev)).to_numpy(dtype=float, na_value=np.nan)
        hi_pos = last.set_index("eid")["pos"].reindex(np.arange(n_ev)).to_numpy(dtype=float, na_value=np.nan)
        empty = np.isnan(lo_pos) | np.isnan(hi_pos) | (hi_pos < lo_pos)
        counts = np.where(empty, 0, hi_pos - lo_pos + 1).astype(np.int64)
        e_ids = np.repeat(np.arange(n_ev), counts)
        offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        pos = np.repeat(np.nan_to_num(lo_pos).astype(np.int64), counts) + offsets
        return e_ids, self.order[pos]


CAUSE_COLUMNS = [
    "cause",
    "cause_kind",
    "cause_case",
    "cause_status",
    "cause_before_s",
    "cause_request_id",
    "cause_endpoint",  # the route of the request that poisoned: a poison on one route is one for every route
    "named_image",
]


def _named_images(events: pd.DataFrame) -> list[list[str]]:
    """Per event, the images (our hashes) the server named: the one its ``mm_hash`` is known to be (learned from
    lines that named a request with one image), else every image of the request the line named."""
    learned: dict[str, str] = {}
    drift = events["event"] == "drift"
    for mm, ours in events.loc[drift, ["server_mm_hash", "mm_hash"]].itertuples(index=False):
        if isinstance(mm, str) and isinstance(ours, str) and "," not in ours:
            learned.setdefault(mm, ours)
    out = []
    for mm, ours in events[["server_mm_hash", "mm_hash"]].itertuples(index=False):
        if isinstance(mm, str) and mm in learned:
            out.append([learned[mm]])
        else:
            out.append([h.strip() for h in ours.split(",")] if isinstance(ours, str) else [])
    return out


def _with_causes(c: CampaignResults, events: pd.DataFrame, index: _ImageIndex) -> pd.DataFrame:
    """``events`` with the cause columns (CAUSE_COLUMNS; null without evidence)."""
    events = events.copy()
    for col in CAUSE_COLUMNS:
        events[col] = None
    if not len(events):
        return events
    images = _named_images(events)
    # each event's server life: since the last crash of its trial before it
    crash_t = events.loc[events["event"] == "crash", ["config", "trial", "t"]]
    life = np.full(len(events), -np.inf)
    ref_t = events["t"].to_numpy(dtype=float).copy()  # when its image was missed
    skip = events["request_id"].to_numpy(dtype=object).copy()  # the request the line named is no cause
    for i, (cfg, trial, t) in enumerate(events[["config", "trial", "t"]].itertuples(index=False)):
        same = crash_t[(crash_t["config"] == cfg) & (crash_t["trial"] == trial) & (crash_t["t"] < t)]
        life[i] = same["t"].max() if len(same) else -np.inf
    for i in np.flatnonzero((events["event"] == "crash").to_numpy()).tolist():
        # a crash takes the image of the drift line that opened its chain: the last of its server's life
        cfg, trial, t = events.at[i, "config"], events.at[i, "trial"], events.at[i, "t"]
        d = events[
            (events["event"] == "drift")
            & (events["config"] == cfg)
            & (events["trial"] == trial)
            & (events["t"] <= t)
            & (events["t"] > life[i])
        ]
        if len(d):
            j = d.index[-1]
            images[i], ref_t[i], skip[i] = images[j], events.at[j, "t"], events.at[j, "request_id"]
    named = [i for i, im in enumerate(images) if im]
    for i in named:
        events.at[i, "named_image"] = ",".join(images[i])
    if not named or not len(index.img):
        return events
    parent, uniques, by_hash = index.hashes()
    ev_of = np.repeat(named, [len(images[i]) for i in named])
    codes = uniques.get_indexer([h for i in named for h in images[i]])
    ev_of, codes = ev_of[codes >= 0], codes[codes >= 0]
    ev_key = _trial_code(events["config"], events["trial"], index.configs)
    e, p = by_hash.join(ev_key[ev_of] * max(len(uniques), 1) + codes, life[ev_of], ref_t[ev_of])
    if not len(e):
        return events
    # per (event, named image): the rule follows each image alone (a second image answered since says nothing of
    # the first; seen: a multi-image request whose new image had just failed after render, beside an image in use)
    pairs = pd.DataFrame({"event": ev_of[e], "image": codes[e], "row": parent[p]}).drop_duplicates()
    img = index.img
    rid = img["request_id"].to_numpy(dtype=object)[pairs["row"]]
    pairs = pairs[rid != skip[pairs["event"].to_numpy()]]
    rows, pev = pairs["row"].to_numpy(), pairs["event"].to_numpy()
    group = pev * max(len(uniques), 1) + pairs["image"].to_numpy()
    kind, case = index.kind[rows], index.case[rows]
    outcome = img["outcome"].astype(str).to_numpy()[rows]
    combos = {
        k: cause_rule.failed_after_render(k[0], None if k[1] == NO_CASE else k[1], k[2])
        for k in set(zip(kind, case, outcome))
    }
    failed = np.array([combos[k] for k in zip(kind, case, outcome)], dtype=bool)
    answered = (outcome == S.OK) & ~failed
    per_image = cause_rule.causes(group, index.t[rows], ref_t[pev], failed, answered)
    found: dict[int, int] = {}
    for k in sorted(per_image.values(), key=lambda k: index.t[rows[k]]):  # an event's earliest cause of its images
        found.setdefault(int(pev[k]), k)
    status = img["status"].to_numpy(dtype=float)
    t_end = index.t + img["latency_ms"].to_numpy(dtype=float, na_value=np.nan) / 1000
    ok_end = np.where(outcome == S.OK, t_end[rows], np.nan)
    # no failure before it: were an image's first uses at once? (the missed request and one in flight beside it)
    where = pd.Series(np.arange(len(img)), index=img["request_id"].astype(object).to_numpy())
    where = where[~where.index.duplicated()]
    at_once: dict[int, int] = {}
    for _, ks in pd.Series(np.arange(len(pairs))).groupby(group):
        ev = int(pev[ks.iat[0]])
        if ev in found or skip[ev] is None or skip[ev] not in where.index:
            continue
        n = int(where[skip[ev]])
        ks = ks.to_numpy()
        j = cause_rule.at_once(
            ok_end[ks], index.t[rows[ks]], t_end[rows[ks]], index.t[n], np.nan_to_num(t_end[n], nan=np.inf)
        )
        if j is not None and (ev not in at_once or index.t[rows[ks[j]]] < index.t[rows[at_once[ev]]]):
            at_once[ev] = int(ks[j])
    for ev, k in [*found.items(), *at_once.items()]:
        r = rows[k]
        use = cause_rule.Use(
            float(index.t[r]),
            str(kind[k]),
            None if case[k] == NO_CASE else str(case[k]),
            None if np.isnan(status[r]) else int(status[r]),
            str(outcome[k]),
            rid_of(img, r),
            endpoint=None if pd.isna(img["endpoint"].iat[r]) else str(img["endpoint"].iat[r]),
        )
        t_event, race = float(events.at[ev, "t"]), ev in at_once
        events.at[ev, "cause"] = cause_rule.describe(use, t_event, at_once=race)
        events.at[ev, "cause_kind"] = cause_rule.AT_ONCE if race else use.kind
        events.at[ev, "cause_case"] = cause_rule.label(use) if race else use.case or NO_CASE  # race: the other use
        events.at[ev, "cause_status"], events.at[ev, "cause_before_s"] = use.status, t_event - use.t
        events.at[ev, "cause_request_id"] = use.request_id
        events.at[ev, "cause_endpoint"] = use.endpoint
    return events


def rid_of(img: pd.DataFrame, row: int) -> str | None:
    v = img["request_id"].iat[row]
    return None if pd.isna(v) else str(v)


def _label(kind, case) -> np.ndarray:
    kind, case = np.asarray(kind, dtype=object), np.asarray(case, dtype=object)
    return np.where(case != NO_CASE, kind + "/" + case, kind)


def _per_event(events: pd.DataFrame, sent: pd.DataFrame) -> pd.DataFrame:
    sent = sent.assign(label=_label(sent["kind"], sent["case"])).sort_values(["event_id", "t_start"])
    g = sent.groupby("event_id")
    per = pd.DataFrame(
        {
            "requests": g.size(),
            "sent": g["label"].agg(lambda s: ", ".join(f"{k} ×{v}" for k, v in s.value_counts().items())),
            "last_sent": g["label"].last(),
            "last_t": g["t_start"].last(),
        }
    )
    out = events.join(per, on="event_id")
    out["requests"] = out["requests"].fillna(0).astype(int)
    out["last_before_s"] = out["t"] - out.pop("last_t")
    return out.drop(columns=["lo", "hi"])


def _summary(c: CampaignResults, events: pd.DataFrame, sent: pd.DataFrame, index: _ImageIndex) -> pd.DataFrame:
    """Per config × event type × kind/case: share of events whose window held it, the same share for random
    windows (background) and their ratio (lift)."""
    cols = [
        "config",
        "event",
        "kind",
        "case",
        "caused",
        "events_with",
        "events",
        "share_of_events",
        "background_share",
        "lift",
        "requests",
        "match",
    ]
    if not len(events) or not len(sent):
        return pd.DataFrame(columns=cols)
    ev = events[["event_id", "config", "event"]].assign(config=events["config"].astype(str))
    s = sent.merge(ev, on="event_id")
    n_events = ev.groupby(["config", "event"]).size().rename("events")
    g = s.groupby(["config", "event", "kind", "case"])
    out = pd.DataFrame({"events_with": g["event_id"].nunique(), "requests": g.size()}).reset_index()
    out = out.join(n_events, on=["config", "event"])
    out["share_of_events"] = out["events_with"] / out["events"]
    bg, modes = _background(events, index)
    out = out.join(bg, on=["config", "event", "kind", "case"]).join(modes, on=["config", "event"])
    out["background_share"] = out["background_share"].fillna(0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["lift"] = out["share_of_events"] / out["background_share"]
    # the cause each incident's evidence names: the first column; a cause seen outside the window gets its row
    caused = (
        events[events["cause_kind"].notna()]
        .assign(config=lambda d: d["config"].astype(str))
        .groupby(["config", "event", "cause_kind", "cause_case"])
        .size()
        .rename("caused")
    )
    caused.index = caused.index.set_names(["config", "event", "kind", "case"])
    out = out.set_index(["config", "event", "kind", "case"]).join(caused, how="outer").reset_index()
    out["caused"] = out["caused"].fillna(0).astype(int)
    out["events"] = out["events"].fillna(
        pd.Series([n_events.get((a, b), 0) for a, b in zip(out["config"], out["event"])], index=out.index)
    )
    out["config"] = pd.Categorical(out["config"].astype(str), categories=c.configs)
    return out.sort_values(
        ["config", "event", "caused", "lift", "share_of_events"],
        ascending=[True, True, False, False, False],
        ignore_index=True,
    )[cols]


def _background(events: pd.DataFrame, index: _ImageIndex) -> tuple[pd.Series, pd.Series]:
    """Share of pseudo-events (random image requests, same window width and matching mode as the real events
    of that config and type) whose window held each kind/case."""
    rng = np.random.default_rng(SEED)
    rows, modes = [], {}
    for (cfg, etype), grp in events.groupby(["config", "event"], observed=True):
        cand = np.flatnonzero(index.config_code == index.configs.index(str(cfg)))
        if not len(cand):
            continue
        pick = rng.choice(cand, min(BACKGROUND_SAMPLES, len(cand)), replace=False)
        width = float(np.nanmedian(grp["hi"] - grp["lo"]))
        same = (grp["match"] == SAME_IMAGE).mean() >= 0.5
        modes[(str(cfg), etype)] = SAME_IMAGE if same else WINDOW
        t = index.t[pick]
        hashes = index.img["media"].to_numpy()[pick].astype(str)
        pseudo = pd.DataFrame(
            {
                "config": str(cfg),
                "trial": index.img["trial"].to_numpy()[pick],
                "lo": t - width,
                "hi": t,
                "mm_hash": hashes if same else None,
            }
        )
        e, r, _ = index.pairs(pseudo)
        seen = pd.DataFrame({"e": e, "kind": index.kind[r], "case": index.case[r]}).drop_duplicates()
        share = seen.groupby(["kind", "case"]).size() / len(pick)
        rows.append(share.rename("background_share").reset_index().assign(config=str(cfg), event=etype))
    bg = (
        pd.concat(rows, ignore_index=True)
        if rows
        else pd.DataFrame(columns=["kind", "case", "background_share", "config", "event"])
    )
    bg = bg.set_index(["config", "event", "kind", "case"])["background_share"]
    mode = pd.Series(modes, name="match", dtype=object)
    if len(mode):
        mode.index = mode.index.set_names(["config", "event"])
    return bg, mode
