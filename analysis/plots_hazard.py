"""The crash-hazard figure: measured crashes per poison event per sweep point, with the fitted curve."""

from __future__ import annotations

import math

import numpy as np

from .hazard import NO_DATA, HazardFit, curves
from .plots import empty, plt, to_png

GROUP_COLORS = plt.get_cmap("tab10")


def hazard_curves(fit: HazardFit) -> bytes:
    """One panel per configuration: dots with exact Poisson bars (measured, per sweep point; a triangle marks the
    upper bound where nothing crashed), the fitted p over the first modelled knob (one curve per value of the
    second) with its 95 % band; without a modelled knob, p and its interval as a line and band."""
    shown = [cfg for cfg in fit.configs if fit[cfg].model != NO_DATA]
    if not shown:
        return empty("no poison event in any configuration: no hazard to draw")
    ncol = min(3, len(shown))
    nrow = math.ceil(len(shown) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.4 * ncol, 3.3 * nrow), squeeze=False)
    for ax in axes.ravel()[len(shown) :]:
        ax.axis("off")
    for ax, cfg in zip(axes.ravel(), shown):
        _panel(ax, fit[cfg])
    fig.suptitle("Crashes per poison event: measured (dots, 95 % exact) and fitted (line, 95 % band)", fontsize=10)
    fig.tight_layout()
    return to_png(fig)


def _panel(ax, f) -> None:
    pts = f.points
    keys = f.terms or list(f.ranges)  # modelled knobs, else the knobs that varied
    knob = keys[0] if keys else None
    group = keys[1] if len(keys) > 1 else None
    levels = sorted(pts[group].unique()) if group else [None]
    x_all = pts[knob].to_numpy(float) if knob else np.zeros(len(pts))
    span = (x_all.max() - x_all.min()) or 1.0
    for i, level in enumerate(levels):
        color = GROUP_COLORS(i % 10)
        sel = pts[pts[group] == level] if group else pts
        x = (sel[knob].to_numpy(float) if knob else np.zeros(len(sel))) + (i - (len(levels) - 1) / 2) * 0.012 * span
        label = f"{group}={level:g}" if group else None
        crashed = sel["crashes"].to_numpy() > 0
        est, lo, hi = (sel[c].to_numpy(float) for c in ("p", "p_lo", "p_hi"))
        ax.errorbar(
            x[crashed],
            est[crashed],
            yerr=[est[crashed] - lo[crashed], hi[crashed] - est[crashed]],
            fmt="o",
            color=color,
            capsize=3,
            ms=4,
            label=label,
        )
        ax.plot(x[~crashed], hi[~crashed], "v", color=color, ms=6)  # no crash: only an upper bound
    cv = curves(f)
    if len(cv):
        for i, level in enumerate(levels):
            c = cv[cv["group"] == level] if group else cv
            ax.plot(c["x"], c["p"], color=GROUP_COLORS(i % 10), lw=1.5)
            ax.fill_between(c["x"], c["lo"], c["hi"], color=GROUP_COLORS(i % 10), alpha=0.15, lw=0)
    else:  # one p for every point (intercept only or an exact bound)
        lo_x, hi_x = (x_all.min() - 0.05 * span, x_all.max() + 0.05 * span) if knob else (-0.5, 0.5)
        ax.plot([lo_x, hi_x], [f.p, f.p], color="black", lw=1.5)
        ax.fill_between([lo_x, hi_x], [f.p_lo] * 2, [f.p_hi] * 2, color="black", alpha=0.12, lw=0)
    ax.set_xlabel(knob or "all trials pooled", fontsize=9)
    if not knob:
        ax.set_xticks([])
    ax.set_ylabel("crashes per poison event", fontsize=8)
    ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1.05) if f.p_hi >= 0.95 else None)  # keep p = 1 in sight
    ax.set_title(f"{f.config} ({f.model})", fontsize=9)
    ax.grid(alpha=0.3)
    if group:
        ax.legend(fontsize=7)
