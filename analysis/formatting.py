"""Numbers as the report prints them: three significant digits, intervals, percentages, "—" for missing."""

from __future__ import annotations

import numpy as np
import pandas as pd


def num(x, unit: str = "") -> str:
    """Three significant digits, thousands separators, "—" for missing."""
    if x is None or (isinstance(x, float) and not np.isfinite(x)) or pd.isna(x):
        return "—"
    x = float(x)
    if x == 0:
        return "0" + unit
    x = round(x, 2 - int(np.floor(np.log10(abs(x)))))  # round first, so 0.99998 becomes 1.00, not 1.000
    digits = max(0, 2 - int(np.floor(np.log10(abs(x)))))
    return f"{x:,.{digits}f}{unit}"


def duration(seconds) -> str:
    """A span in the unit its magnitude reads best in: "25 s", "3.2 min", "1.4 h" (never "0.0394 min")."""
    if seconds is None or pd.isna(seconds):
        return "—"
    s = float(seconds)
    if abs(s) < 120:
        return num(s, " s")
    if abs(s) < 2 * 3600:
        return num(s / 60, " min")
    return num(s / 3600, " h")


def ci(est, lo, hi, unit: str = "") -> str:
    if est is None or pd.isna(est):
        return "—"
    return f"{num(est)}{unit} [{num(lo)}, {num(hi)}]"


def pct(x) -> str:
    if x is None or pd.isna(x):
        return "—"
    return f"{num(100 * x)} %" if 0 < abs(x) < 0.01 else f"{100 * x:.1f} %"  # 0.04 %, not 0.0 %


def pct_ci(est, lo, hi) -> str:
    return "—" if pd.isna(est) else f"{100 * est:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def ci_col(df: pd.DataFrame, col: str, unit: str = "", fmt=None) -> list[str]:
    """``col`` with its ``col_lo``/``col_hi`` interval, formatted, for each row."""
    fmt = fmt or (lambda e, lo, hi: ci(e, lo, hi, unit))
    return [fmt(*x) for x in df[[col, col + "_lo", col + "_hi"]].to_numpy()]


def integer(x) -> str:
    return "—" if x is None or pd.isna(x) else f"{int(x):,}"


def by_config(df: pd.DataFrame) -> dict[str, pd.Series]:
    return {str(r["config"]): r for _, r in df.iterrows()}
