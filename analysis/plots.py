"""The report's figures (matplotlib, Agg). Each function returns PNG bytes; nothing touches the screen."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display, no GUI toolkit

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator

from mmchaos import schema as S
from mmchaos.outcomes import unexpected

from .results import CampaignResults
from .stats import drift_events, round_bin

DPI = 96
RUNNING_METRIC = r"num_requests_running$"  # vllm:num_requests_running (the prefix varies between versions)
RUNNING_LABEL = "requests running on the server (vLLM /metrics)"
MAX_TIMELINE_TRIALS = 10  # per configuration; the rest are listed in the text
SECONDS_UP_TO = 180.0  # a time axis spanning up to 3 minutes is in seconds, a longer one in minutes


def time_unit(span_s: float) -> tuple[float, str]:
    """The divisor and name of the unit of a time axis spanning ``span_s`` seconds, the one rule of every time axis
    in the report: seconds up to ``SECONDS_UP_TO`` (a trial that crashed in 5 s is not squashed near 0), minutes
    beyond (a 30-minute trial is not read in thousands of seconds)."""
    if not np.isfinite(span_s) or span_s <= SECONDS_UP_TO:
        return 1.0, "seconds"
    return 60.0, "minutes"


def _span(*times) -> tuple[float, float]:
    """(earliest, latest) of the finite times given (arrays or scalars), 0 included; (0, 0) when there are none."""
    t = np.concatenate([np.atleast_1d(np.asarray(x, dtype=float)) for x in times] + [np.zeros(1)])
    t = t[np.isfinite(t)]
    return float(t.min()), float(t.max())


def colors(configs: list[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10" if len(configs) <= 10 else "tab20")
    return {c: cmap(i % cmap.N) for i, c in enumerate(configs)}


def styles(configs: list[str]) -> dict[str, str]:
    """Line styles too, so configurations with identical curves (e.g. no crash at all) stay visible."""
    return {c: ("-", "--", "-.", ":")[i % 4] for i, c in enumerate(configs)}


def empty(message: str) -> bytes:
    fig, ax = plt.subplots(figsize=(6, 1))
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=10, color="grey")
    return to_png(fig)


def line_png(x, y, xlabel: str, ylabel: str) -> bytes:
    """One line over a count (e.g. the hunt's coverage over its cases), as a small PNG."""
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.step(x, y, where="post", color="tab:blue", lw=1.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.25)
    return to_png(fig)


def to_png(fig, tight: bool = True) -> bytes:
    """PNG bytes. ``tight=False`` for figures that set their own margins (saves a full layout pass)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight" if tight else None)
    plt.close(fig)
    return buf.getvalue()


def crash_rates(crash: pd.DataFrame, configs: list[str]) -> bytes:
    """Crash rate per 1,000 answered requests and per hour of uptime with their exact intervals, one row per
    config (refusals and down time while a server restarts are no exposure)."""
    col = colors(configs)
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.5 * len(crash) + 1.6), sharey=True)
    y = np.arange(len(crash))[::-1]
    for ax, (key, title) in zip(
        axes,
        (("per_1k_answered", "crashes per 1,000 answered requests"), ("per_hour_up", "crashes per hour of uptime")),
    ):
        est, lo, hi = crash[key].to_numpy(float), crash[key + "_lo"].to_numpy(float), crash[key + "_hi"].to_numpy(float)
        for yi, cfg, e, a, b in zip(y, crash["config"].astype(str), est, lo, hi):
            ax.errorbar(e, yi, xerr=[[e - a], [b - e]], fmt="o", color=col[cfg], capsize=4)
        ax.set_title(title, fontsize=10)
        ax.set_xlim(left=0)
        ax.set_ylim(-0.6, len(crash) - 0.4)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y, crash["config"].astype(str))
    fig.suptitle(
        "Crash rate (dot) with 95 % exact Poisson interval (bar)", fontsize=10, y=1.0 + 0.3 / fig.get_figheight()
    )
    return to_png(fig)


def tradeoff(crash: pd.DataFrame, cost: pd.DataFrame, configs: list[str], baseline: str) -> bytes:
    """What each configuration buys and pays: crashes per hour of uptime (95 % exact interval) against its latency
    p50 and its throughput, each a ratio to the baseline's (95 % bootstrap interval); the baseline at 1."""
    col = colors(configs)
    rates = crash.set_index(crash["config"].astype(str))
    fig, axes = plt.subplots(1, 2, figsize=(10, 2.4), sharey=True)  # short: it is on the first screen
    for ax, (key, label) in zip(
        axes, (("p50_ratio", f"latency p50, × {baseline}'s"), ("throughput_ratio", f"throughput, × {baseline}'s"))
    ):
        for i, cfg in enumerate(configs):
            if cfg not in rates.index or cfg not in cost.index:
                continue
            r, k = rates.loc[cfg], cost.loc[cfg]
            y, x = float(r["per_hour_up"]), float(k[key])
            yerr = [[y - float(r["per_hour_up_lo"])], [float(r["per_hour_up_hi"]) - y]]
            xerr = [[x - float(k[key + "_lo"])], [float(k[key + "_hi"]) - x]]
            ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="o", color=col[cfg], capsize=3, label=cfg)
            # labels staggered: configurations that cost alike sit at one point
            ax.annotate(cfg, (x, y), textcoords="offset points", xytext=(6, 6 + 11 * (i % 3)), fontsize=8)
        ax.axvline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xlabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("crashes per hour of uptime")
    fig.suptitle("Crash rate against cost (dots; bars: 95 % intervals)", fontsize=10)
    return to_png(fig)


def survival(curves: dict[str, dict[str, pd.DataFrame]], durations: pd.DataFrame, configs: list[str]) -> bytes:
    """Kaplan–Meier: share of trials still without a crash, by time and by requests sent."""
    col, sty = colors(configs), styles(configs)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    scale, unit = time_unit(_span(durations["time_s"])[1])
    panels = (("time_s", f"{unit} of load", scale), ("requests", "requests sent", 1.0))
    for ax, (what, xlabel, scale) in zip(axes, panels):
        for cfg in configs:
            if cfg not in curves:
                continue
            km = curves[cfg][what]
            x = km["t"].to_numpy() / scale
            ax.step(x, km["survival"], where="post", color=col[cfg], ls=sty[cfg], label=cfg)
            ax.fill_between(x, km["lo"], km["hi"], step="post", color=col[cfg], alpha=0.12)
            d = durations[(durations["config"] == cfg) & ~durations["crashed"]]
            if len(d):  # censoring marks: trials that ended without a crash
                xs = d[what].to_numpy() / scale
                ys = np.interp(xs, x, km["survival"].to_numpy(), right=km["survival"].iat[-1])
                ax.plot(xs, ys, "|", color=col[cfg], markersize=10, mew=1.5)
        ax.set_xlabel(xlabel)
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of trials without a crash")
    axes[1].legend(fontsize=8, loc="lower left")
    fig.suptitle(
        "Survival until the first crash (Kaplan–Meier; | = trial ended without crashing; band = 95 %)", fontsize=10
    )
    return to_png(fig)


def latency_ecdf(grid: pd.DataFrame, configs: list[str]) -> bytes:
    """ECDF of successful-request latency per kind, one line per config, log scale."""
    col, sty = colors(configs), styles(configs)
    if not len(grid):
        return empty("no successful request: no latency to show")
    kinds = [k for k in S.KINDS if k in set(grid["kind"])] + sorted(set(grid["kind"]) - set(S.KINDS))
    n = max(len(kinds), 1)
    ncol = min(3, n)
    nrow = int(np.ceil(n / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.0 * nrow), squeeze=False)
    for ax, kind in zip(axes.flat, kinds):
        g = grid[grid["kind"] == kind]
        for cfg in configs:
            s = g[g["config"] == cfg]
            if len(s):
                ax.plot(s["latency_ms"], s["p"], color=col[cfg], ls=sty[cfg], label=cfg, lw=1.4)
        ax.set_xscale("log")
        # labelled 1-2-5 ticks, no minor ticks: readable on narrow ranges and much cheaper to draw
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_title(kind, fontsize=10)
        ax.set_xlabel("latency (ms)")
        ax.grid(alpha=0.3)
        for q in (0.5, 0.95):
            ax.axhline(q, color="grey", lw=0.6, ls=":")
    for ax in list(axes.flat)[len(kinds) :]:
        ax.axis("off")
    axes[0, 0].set_ylabel("share of requests faster")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.suptitle("Latency of successful requests (ECDF; dotted lines at p50 and p95)", fontsize=10)
    bottom = 0.45 / fig.get_figheight()  # room for the legend, in inches
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.legend(
        handles,
        labels,
        loc="lower center",
        ncol=min(len(labels), 4),
        fontsize=8,
        bbox_to_anchor=(0.5, 0.0),
        frameon=False,
    )
    return to_png(fig, tight=False)


def throughput_over_time(tp: pd.DataFrame, configs: list[str]) -> bytes:
    col, sty = colors(configs), styles(configs)
    fig, ax = plt.subplots(figsize=(11, 3.4))
    starts = np.unique(tp["t"].to_numpy(float))
    bin_s = float(np.diff(starts).min()) if len(starts) > 1 else 0.0
    scale, unit = time_unit(_span(starts)[1] + bin_s)  # the end of the last bin: the longest trial, rounded up
    for cfg in configs:
        s = tp[tp["config"] == cfg]
        if len(s):
            ax.plot(
                s["t"] / scale, s["ok_per_s"], color=col[cfg], ls=sty[cfg], label=cfg, lw=1.3, drawstyle="steps-post"
            )
    ax.set_xlabel(f"{unit} since trial start")
    ax.set_ylabel("successful requests / s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Throughput over time (mean over the trials still running)", fontsize=10)
    return to_png(fig)


def timelines(c: CampaignResults, cfg: str, max_trials: int = MAX_TIMELINE_TRIALS) -> tuple[bytes, list[int]]:
    """One panel per trial of ``cfg``: successes and unexpected failures per second, crashes, failed
    /health polls, drift lines, and requests running on the server. Returns (png, trials not drawn)."""
    trials = c.trials[c.trials["config"] == cfg].sort_values("trial")
    shown, hidden = trials.head(max_trials), trials["trial"].iloc[max_trials:].tolist()
    r = c.requests
    r = r.loc[r["config"] == cfg, ["trial", "t_rel", "outcome", "status", "expected_status", "kind"]]
    h = c.health[(c.health["config"] == cfg) & ~c.health["ok"].fillna(False).astype(bool)]
    cr = c.crashes[c.crashes["config"] == cfg]
    fl = c.faults[(c.faults["config"] == cfg) & c.faults["t_injected"].notna()] if len(c.faults) else c.faults
    dr = drift_events(c)
    dr = dr[dr["config"] == cfg]
    m = c.metrics[(c.metrics["config"] == cfg) & c.metrics["name"].astype(str).str.contains(RUNNING_METRIC)]
    running = m.groupby(["trial", "t_rel"])["value"].sum()  # summed over its labels (model, engine)
    # one unit for all panels (they share the x axis): the longest trial drawn, or the latest thing drawn in it
    ids = set(shown["trial"])
    t_lo, t_hi = _span(
        shown["duration_s"],
        *(f.loc[f["trial"].isin(ids), "t_rel"] for f in (r, h, cr, dr, fl) if len(f)),
        running[running.index.get_level_values(0).isin(ids)].index.get_level_values(1),
    )
    scale, unit = time_unit(t_hi)
    t_hi = max(t_hi, t_lo + 1)
    x_lo, x_hi = t_lo / scale, (t_hi + 0.02 * (t_hi - t_lo)) / scale  # a little room: a crash at the end shows
    bin_s = round_bin(t_hi, target_bins=120)  # these trials' bins (a 5 s trial's are not a 30-minute one's)
    good = r["outcome"] == S.OK
    # an expected failure (a malformed request answered with its expected status, an abort) is not news
    r = r.assign(bin=(r["t_rel"] // bin_s).astype(int), good=good, bad=~good & unexpected(r))
    per_bin = r.groupby(["trial", "bin"])[["good", "bad"]].sum()

    n = max(len(shown), 1)
    height = 1.9 * n + 1.1
    fig, axes = plt.subplots(n, 1, figsize=(11, height), sharex=True, squeeze=False)
    # fixed margins in inches instead of tight_layout: layout passes are most of the drawing time here
    fig.subplots_adjust(left=0.07, right=0.93, top=1 - 0.35 / height, bottom=0.85 / height, hspace=0.18)
    for ax, (_, tr) in zip(axes[:, 0], shown.iterrows()):
        t = tr["trial"]
        if t in per_bin.index.get_level_values(0):
            pb = per_bin.loc[t]
            pb = pb.reindex(np.arange(pb.index.max() + 1), fill_value=0)
            edges = np.arange(len(pb) + 1) * bin_s / scale
            # stairs: one artist per series (a bar per bin is hundreds of patches and slow to draw)
            ax.stairs(pb["good"] / bin_s, edges, color="tab:green", lw=1, label="ok / s", baseline=None)
            ax.stairs(pb["bad"] / bin_s, edges, fill=True, color="tab:red", alpha=0.7, label="unexpected failures / s")
        ct = cr.loc[cr["trial"] == t, "t_rel"].to_numpy() / scale
        for x in ct:
            ax.axvline(x, color="darkred", ls="--", lw=1.5)
            if len(ct) <= 3:  # with many crashes the labels only overlap; the legend says what the line is
                ax.annotate(
                    " crash ",
                    (x, 1),
                    xycoords=("data", "axes fraction"),
                    color="darkred",
                    fontsize=7,
                    ha="right" if x > x_lo + 0.9 * (x_hi - x_lo) else "left",  # near the end: inside the panel
                    va="top",
                )
        for f in fl[fl["trial"] == t].itertuples() if len(fl) else ():
            x0 = f.t_rel / scale
            x1 = x0 + (f.t_cleared - f.t_injected) / scale if not pd.isna(f.t_cleared) else None
            if x1 is not None and x1 > x0:
                ax.axvspan(x0, x1, color="tab:purple", alpha=0.12, lw=0)
            ax.axvline(x0, color="tab:purple", lw=1.5)
            ax.annotate(
                f" {f.kind} ",
                (x0, 0.85),
                xycoords=("data", "axes fraction"),
                color="tab:purple",
                fontsize=7,
                ha="right" if x0 > x_lo + 0.9 * (x_hi - x_lo) else "left",
                va="top",
            )
        ht = h.loc[h["trial"] == t, "t_rel"].to_numpy() / scale
        if len(ht):
            ax.plot(ht, np.zeros(len(ht)), "|", color="black", markersize=8, label="failed /health poll")
        dt = dr.loc[dr["trial"] == t, "t_rel"].to_numpy() / scale
        if len(dt):
            ax.plot(
                dt,
                np.full(len(dt), 0.95),
                "v",
                color="tab:orange",
                markersize=5,
                transform=ax.get_xaxis_transform(),
                label="cache drift logged",
            )
        if t in running.index.get_level_values(0):
            rs = running.loc[t]
            ax2 = ax.twinx()
            ax2.plot(rs.index.to_numpy() / scale, rs.to_numpy(), color="tab:blue", lw=1.0, alpha=0.8)
            # what it counts, in the line's colour and the size of the left axis' label
            ax2.set_ylabel("requests running\n(vLLM /metrics)", fontsize=8, color="tab:blue")
            ax2.tick_params(axis="y", labelsize=8, colors="tab:blue")
            ax2.spines["right"].set_color("tab:blue")
            ax2.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))  # a count: whole numbers
            ax2.set_ylim(bottom=0)
        ax.set_ylim(bottom=0)
        ax.set_ylabel(f"trial {t}\nreq/s", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.25)
        if tr["status"] != "completed":
            ax.text(0.99, 0.8, str(tr["status"]), transform=ax.transAxes, ha="right", fontsize=8, color="grey")
    axes[0, 0].set_xlim(x_lo, x_hi)  # shared: the whole of the longest trial, from its start
    axes[-1, 0].set_xlabel(f"{unit} since trial start")
    handles: dict = {}
    for ax in axes[:, 0]:
        for hd, lb in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lb, hd)
    handles["crash detected"] = plt.Line2D([], [], color="darkred", ls="--")
    if len(fl):
        handles["fault injected (shaded while it lasts)"] = plt.Line2D([], [], color="tab:purple", lw=1.5)
    handles[RUNNING_LABEL] = plt.Line2D([], [], color="tab:blue", lw=1.0, alpha=0.8)
    axes[0, 0].set_title(f"{cfg}: timeline per trial ({bin_s:g} s bins)", fontsize=10)
    fig.legend(
        list(handles.values()),
        list(handles.keys()),
        loc="lower center",
        ncol=6,
        fontsize=7,
        bbox_to_anchor=(0.5, 0.0),
        frameon=False,
    )
    return to_png(fig, tight=False), hidden
