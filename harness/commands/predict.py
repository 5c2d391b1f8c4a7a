"""`mmchaos predict`: how often each configuration of a (sweep) campaign would crash at a user's traffic, from
its crash hazard per poison event; and the same traffic flags for `mmchaos report`."""

from __future__ import annotations

import argparse
import sys

from .. import arg_types
from .common import CommandError, say


def _share(text: str) -> float:
    from mmchaos.analysis.prediction import parse_share

    try:
        return parse_share(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _rps(text: str) -> float:
    try:
        return arg_types.positive_number(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a request rate above 0 (requests per second)") from None


def add_traffic_args(p, required: bool) -> None:
    """The user's traffic: for `predict` (required) and `report` (optional: a prediction in the report)."""
    p.add_argument("--rps", type=_rps, required=required, help="your requests per second")
    p.add_argument(
        "--post-render-4xx",
        type=_share,
        metavar="SHARE",
        help="share of your requests that fail after rendering their images (a 400 on a valid image, "
        "e.g. an unsupported dimensions): 0.5%% or 0.005",
    )
    p.add_argument(
        "--disconnects",
        type=_share,
        metavar="SHARE",
        help="share of your requests the client abandons in flight (timeouts, cancelled calls): 1%% or 0.01",
    )
    p.add_argument(
        "--reuse",
        type=_share,
        metavar="SHARE",
        help="share of those requests' images sent again later (default: each configuration's measured share)",
    )
    p.add_argument(
        "--at",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="your value of a knob the sweep varied, e.g. users=32 (p is taken at the closest measured "
        "value); repeatable",
    )


def traffic(a) -> dict | None:
    """The keyword arguments of analysis.prediction.predict from the flags; None when no --rps was given."""
    if a.rps is None:
        given = [
            f
            for f, v in (
                ("--post-render-4xx", a.post_render_4xx),
                ("--disconnects", a.disconnects),
                ("--reuse", a.reuse),
                ("--at", a.at),
            )
            if v
        ]
        if given:
            raise CommandError(
                f"{', '.join(given)} {'need' if len(given) > 1 else 'needs'} --rps (your requests per second)"
            )
        return None
    if not a.post_render_4xx and not a.disconnects:
        raise CommandError(
            "say how much of your traffic can poison the cache: --post-render-4xx and/or --disconnects (e.g. 0.5%)"
        )
    knobs = {}
    for pair in a.at:
        k, sep, v = pair.partition("=")
        try:
            knobs[k.strip()] = float(v)
        except ValueError:
            k = ""
        if not sep or not k.strip():
            raise CommandError(f"--at {pair!r}: write KNOB=NUMBER, e.g. users=32")
    share_sum = (a.post_render_4xx or 0.0) + (a.disconnects or 0.0)
    if share_sum > 1:
        raise CommandError(f"--post-render-4xx and --disconnects add up to {share_sum:.0%}: more than all requests")
    return {
        "rps": a.rps,
        "post_render_share": a.post_render_4xx or 0.0,
        "disconnect_share": a.disconnects or 0.0,
        "reuse": a.reuse,
        "knobs": knobs,
    }


def _load_check(folder: str | None):
    """predict --check's campaign, loaded before anything is fitted or printed: a bad folder is one line."""
    from mmchaos.analysis.results import LoadError, load_results

    if not folder:
        return None
    try:
        return load_results(folder)
    except LoadError as e:
        raise CommandError(f"--check: {e}") from e


def _rate_check(fits, check, folder: str) -> None:
    """predict --check: the fit against a campaign it never saw, run at a rate of its own."""
    from mmchaos.analysis import prediction

    table = prediction.rate_check(fits, check)
    if not len(table):
        raise CommandError(f"--check {folder}: none of its configurations is in the fit, or none has a trial")
    print(
        f"checked at a measured rate ({int(table['inside'].sum())} of {len(table)} inside): {folder}, not part "
        "of the fit"
    )
    for r in table.itertuples(index=False):
        print(
            f"  {r.config} at {r.rate} requests/s: measured {r.measured} crashes in {r.uptime_h:.2g} h of uptime "
            f"= {r.per_hour:.3g}/h [{r.per_hour_lo:.3g}, {r.per_hour_hi:.3g}]; predicted from its "
            f"{r.poison_events:,.0f} poison events {r.predicted_per_hour:.3g}/h [{r.predicted_per_hour_lo:.3g}, "
            f"{r.predicted_per_hour_hi:.3g}]{'' if r.inside else ' — OUTSIDE'}"
        )


def add_parser(sub) -> None:
    p = sub.add_parser(
        "predict",
        help="mean time between crashes at your traffic, per configuration, from a (sweep) campaign",
        description="Fits each configuration's crash hazard (the chance that one poison event, a post-render 4xx "
        "or a client disconnect whose image is sent again, crashes the server) and turns it into the "
        "mean time between crashes at your rates, with its 95 % interval and the caveats; then checks "
        "the model on each sweep point it was not fitted on.",
    )
    p.add_argument("results_dir", help="a campaign folder: results/<campaign> (best: a [sweep] campaign)")
    add_traffic_args(p, required=True)
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="NAME",
        help="only this configuration (repeatable; default: all)",
    )
    p.add_argument(
        "--check",
        metavar="CAMPAIGN_DIR",
        help="a campaign of the same configurations run at your rate (open loop: [workload] rate), not "
        "part of the fit: its crashes per hour, measured, against those the fit predicts there",
    )
    p.set_defaults(func=run)


def run(a) -> int:
    from mmchaos.analysis import hazard, prediction
    from mmchaos.analysis.exposure import exposure
    from mmchaos.analysis.results import LoadError, load_results
    from mmchaos.schema import sweep_label

    kw = traffic(a)
    assert kw is not None  # predict's --rps is required
    try:
        prediction.check_traffic(**kw)
    except ValueError as e:
        raise CommandError(str(e)) from e
    try:
        c = load_results(a.results_dir)
    except LoadError as e:
        raise CommandError(str(e)) from e
    check = _load_check(a.check)
    configs = [str(x) for x in c.configs]
    unknown = [n for n in a.config if n not in configs]
    if unknown:
        raise CommandError(f"--config {unknown[0]}: no such configuration (have: {', '.join(configs)})")
    say(f"fitting the crash hazard of {len(a.config or configs)} configuration(s), {len(c.trials)} trials")
    exp = exposure(c)
    fits = hazard.fit_exposure(exp, a.config or configs)
    pr = prediction.predict(fits, **kw)
    print(
        f"at {kw['rps']:g} requests/s, {kw['post_render_share']:.3%} post-render 4xx, "
        f"{kw['disconnect_share']:.3%} client disconnects"
        + (f", {kw['reuse']:.1%} of their images sent again" if kw["reuse"] is not None else "")
    )
    for line in pr.lines():
        print(line)
    held = prediction.held_out_table(exp, fits)
    if len(held):
        print(
            f"held-out check ({int(held['inside'].sum())} of {len(held)} inside): each sweep point predicted by "
            "the fit of the other points"
        )
        for r in held.itertuples(index=False):
            print(
                f"  {r.config} at {sweep_label(r.point)}: measured {r.measured} crashes in {r.poison_events:,.0f} "
                f"poison events, predicted {r.predicted:.3g} [{r.lo:.0f}, {r.hi:.0f}]"
                f"{'' if r.inside else ' — OUTSIDE'}"
            )
    else:
        print("held-out check: not possible (no configuration with poison events at two or more sweep points)")
    if check is not None:
        _rate_check(fits, check, a.check)
    sys.stdout.flush()
    return 0
