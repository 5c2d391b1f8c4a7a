"""The campaign report: ``report.md`` (+ PNG plots beside it) and one self-contained ``report.html``.

    mmchaos report RESULTS_DIR [--baseline CONFIG] [--compare OTHER_DIR] [--out DIR]

RESULTS_DIR is one campaign folder (``results/<campaign>``). Everything is computed in memory first and the
files are written last, each to a temporary name and renamed, so a failure never leaves half a report. The
sections are laid out by the ``sections_*`` modules.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from mmchaos.errors import MmchaosError
from mmchaos.files import write_files_atomic

from . import (
    hazard,
    open_loop,
    prediction,
    sections_faults,
    sections_hazard,
    sections_incidents,
    sections_performance,
    sections_run,
    sections_verdict,
    stats,
)
from .attribution import DEFAULT_WINDOW_S, attribute
from .document import Doc
from .exposure import exposure
from .fault_effects import FAILS as FAULT_FAILS
from .fault_effects import fault_effects
from .results import CampaignResults, LoadError, combine, find_trials, load_results
from .survival import first_crash_durations, kaplan_meier
from .verdict import verdicts

REPORT_MD = "report.md"
REPORT_HTML = "report.html"
DEFAULT_OUT = "report"  # inside the campaign folder


class ReportError(MmchaosError, ValueError):
    """Bad input: said in one line by the CLI."""

    prefix = "mmchaos report"


@dataclass
class ReportResult:
    out_dir: Path
    files: list[Path]
    timings: dict[str, float] = field(default_factory=dict)
    verdicts: dict[str, str] = field(default_factory=dict)  # configuration -> fails / retryable / clean
    failed_faults: list[str] = field(default_factory=list)  # one line per fault that failed its bounds

    @property
    def html(self) -> Path:
        return self.out_dir / REPORT_HTML

    @property
    def markdown(self) -> Path:
        return self.out_dir / REPORT_MD


def write_report(
    campaign_dir: str | Path,
    out_dir: str | Path | None = None,
    baseline: str | None = None,
    compare_with: str | Path | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    progress: Callable[[str], None] | None = None,
    traffic: dict | None = None,
    fault_bounds: dict[str, float] | None = None,
) -> ReportResult:
    """Load ``campaign_dir`` (and ``compare_with``), compute everything, write the report; return the paths.

    ``baseline`` names the configuration the workaround cost is measured against (default: the one
    without extra flags). With ``compare_with``, configurations are named ``<campaign>/<config>`` and a
    side-by-side section pairs the configurations the two campaigns share. ``traffic``: a user's traffic, the
    keyword arguments of analysis.prediction.predict after the fit (rps, post_render_share, disconnect_share,
    reuse, knobs): the crash-hazard section then gives the mean time between crashes at it. ``fault_bounds``:
    the keyword arguments of analysis.fault_effects.fault_effects (wedge_s, recover_s) a fault is judged by.
    """
    say = progress or (lambda _msg: None)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t0
        now = time.perf_counter()
        timings[name] = now - t0
        t0 = now

    _precheck(campaign_dir, compare_with, baseline)  # bad input fails here, before any progress line
    if traffic:
        try:
            prediction.check_traffic(**traffic)
        except (TypeError, ValueError) as e:
            raise ReportError(f"traffic to predict at: {e}") from e
    say(f"loading {campaign_dir}")
    try:
        main_c = load_results(campaign_dir)
        c = main_c
        if compare_with is not None:
            say(f"loading {compare_with}")
            c = combine([main_c, load_results(compare_with)])
    except LoadError as e:
        raise ReportError(str(e)) from e
    lap("load")
    base = _resolve_baseline(c, baseline, compared=compare_with is not None)
    say(f"computing statistics for {len(c.configs)} configuration(s), {len(c.requests):,} requests")
    doc, verdict, effects = build(
        c,
        base,
        window_s,
        compared=compare_with is not None,
        timings=timings,
        lap=lap,
        say=say,
        traffic=traffic,
        fault_bounds=fault_bounds,
    )
    markdown, html_text = doc.to_markdown(), doc.to_html()
    lap("render")
    out = Path(out_dir) if out_dir is not None else Path(campaign_dir) / DEFAULT_OUT
    try:
        files = write_files_atomic(out, {REPORT_MD: markdown.encode(), REPORT_HTML: html_text.encode(), **doc.images()})
    except OSError as e:
        raise ReportError(f"cannot write the report into {out}: {e.strerror or e}") from e
    lap("write")
    say(f"wrote {out / REPORT_HTML}")
    failed = effects[effects["verdict"] == FAULT_FAILS] if not effects.empty else effects
    return ReportResult(
        out,
        files,
        timings,
        dict(zip(verdict["config"].astype(str), verdict["verdict"])),
        [f"{x.config} trial {x.trial}, {x.fault}: {x.why}" for x in failed.itertuples()],
    )


def _precheck(campaign_dir, compare_with, baseline: str | None) -> None:
    """Cheap checks on the folders alone: they exist, hold trials, and the baseline names one of their configs."""
    configs = []
    for d in [campaign_dir] + ([compare_with] if compare_with is not None else []):
        d = Path(d)
        if not d.is_dir():
            raise ReportError(f"{d} is not a folder (expected results/<campaign>)")
        found = find_trials(d)
        if not found:
            try:
                load_results(d)  # says why, with a hint
            except LoadError as e:
                raise ReportError(str(e)) from e
        configs += [cfg for cfg, _, _ in found] + [f"{d.resolve().name}/{cfg}" for cfg, _, _ in found]
    if baseline is not None and baseline not in configs:
        have = sorted({cfg for cfg, _, _ in find_trials(Path(campaign_dir))})
        raise ReportError(f"baseline {baseline!r} is not a configuration of this campaign (have: {', '.join(have)})")


def _resolve_baseline(c: CampaignResults, baseline: str | None, compared: bool) -> str:
    if baseline is None:
        return stats.default_baseline(c)
    if baseline in c.configs:
        return baseline
    if compared:  # an unprefixed name: that config of the main campaign, else of the other one
        for cfg in c.configs:
            if cfg.split("/", 1)[1] == baseline:
                return cfg
    raise ReportError(f"baseline {baseline!r} is not a configuration of this campaign (have: {', '.join(c.configs)})")


def build(
    c: CampaignResults,
    baseline: str,
    window_s: float = DEFAULT_WINDOW_S,
    compared: bool = False,
    timings=None,
    lap=lambda _n: None,
    say=lambda _m: None,
    traffic: dict | None = None,
    fault_bounds: dict[str, float] | None = None,
) -> tuple[Doc, pd.DataFrame, pd.DataFrame]:
    """Compute every table and figure and lay them out; returns the document, the verdicts and the faults'
    effects."""
    from . import plots, plots_hazard  # matplotlib is slow to import: only when a report is really built

    exp = exposure(c)
    crash = stats.crash_stats(c, exp=exp)
    fits = hazard.fit_exposure(exp, [str(x) for x in c.configs])
    held = prediction.held_out_table(exp, fits)
    predicted = prediction.predict(fits, **traffic) if traffic else None
    drift = stats.drift_stats(c)
    retried = stats.retry_success(c)
    groups = stats._ok_latency_groups(c)
    lat = stats.latency_table(c, _groups=groups)
    tput = stats.throughput(c)
    cost = stats.workaround_cost(c, baseline, _groups=groups)
    effects = fault_effects(c, **(fault_bounds or {}))
    verdict = verdicts(c, effects)
    durations = first_crash_durations(c.trials, c.requests, c.crashes)
    curves = {
        cfg: {w: kaplan_meier(d[w], d["crashed"]) for w in ("time_s", "requests")}
        for cfg, d in durations.groupby("config", observed=True)
    }
    events, attribution = attribute(c, window_s)
    lap("stats")

    say("drawing plots")
    figs = {
        "crash_rates": plots.crash_rates(crash, c.configs),
        "survival": plots.survival(curves, durations, c.configs),
        "latency": plots.latency_ecdf(stats.latency_quantile_grid(c), c.configs),
        "throughput": plots.throughput_over_time(stats.throughput_over_time(c), c.configs),
    }
    # with one configuration there is nothing to trade
    many = len(c.configs) > 1
    tradeoff = plots.tradeoff(crash, stats.pooled_cost(cost), c.configs, baseline) if many else None
    timeline_figs = {cfg: plots.timelines(c, cfg) for cfg in c.configs}
    lap("plots")

    doc = Doc(f"mmchaos report — {c.name}")
    sections_verdict.intro(doc, c, baseline, window_s, compared)
    sections_verdict.cards(doc, c, verdict, crash, cost, baseline, events)  # the first screen: the cards and the figure
    if tradeoff is not None:
        doc.image("tradeoff.png", tradeoff, "crash rate against latency and throughput cost, per configuration")
    sections_verdict.explanation(doc, c, baseline, window_s)
    sections_verdict.summary(doc, c, verdict, crash, drift, retried, lat, tput, cost, attribution, baseline)
    sections_verdict.verdicts(doc, verdict)
    sections_run.what_was_run(doc, c)
    if compared:
        sections_run.side_by_side(doc, c, verdict, crash, lat, tput)
    sections_faults.faults(doc, effects)
    sections_incidents.crashes(doc, c, crash, figs["crash_rates"])
    hazard_fig = plots_hazard.hazard_curves(fits) if sections_hazard.swept(c) else None  # a curve needs a sweep
    sections_hazard.hazard_section(doc, c, fits, hazard_fig, held, predicted)
    sections_incidents.survival(doc, durations, curves, figs["survival"], c.configs)
    sections_incidents.attribution(doc, events, attribution, window_s)
    sections_incidents.drift(doc, drift)
    sections_incidents.errors(doc, c)
    open_loop.section(doc, c)
    sections_performance.latency(doc, lat, figs["latency"])
    sections_performance.throughput(doc, tput, figs["throughput"])
    sections_performance.cost(doc, cost, baseline)
    sections_performance.timelines(doc, timeline_figs)
    sections_run.trials(doc, c, durations)
    return doc, verdict, effects
