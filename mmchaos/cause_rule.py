"""What caused a drift or a crash, in the server's own words, defined once: the report (analysis/attribution.py)
and the web UI's panel (locustfiles/panel.py) both apply it.

vLLM names the image it missed: its drift line carries the request (our X-Request-Id) and the item's ``mm_hash``.
That image's earlier uses in the same server's life tell what happened: a request that carried it and failed
*after* its image was processed (a post-render 4xx, a client that hung up, a timeout) left the API server's cache
believing the engine holds it. The cause is the first such failure since the image's last answered use: what
followed it until the event could only find the drifted entry. A use answered after the poison would itself
have met the drift. No such failure, no cause: a pre-render case, which by our catalogue cannot poison, is never
named by this rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from mmchaos import schema
from mmchaos.verdict_rule import is_poison


@dataclass(frozen=True)
class Use:
    """One request that carried the image."""

    t: float  # when it was sent (epoch seconds)
    kind: str
    case: str | None
    status: int | None
    outcome: str
    request_id: str | None = None


def failed_after_render(kind: str | None, case: str | None, outcome: str) -> bool:
    """A use that can leave P0's cache ahead of P1's: a poison kind that did not succeed (a post-render 4xx, an
    abort), or any request the client gave up on (a timeout hangs up as an abort does)."""
    if outcome in (schema.OK, schema.CUT):
        return False
    return is_poison(kind, case) or outcome == schema.TIMEOUT


def causes(
    event: ArrayLike, t: ArrayLike, t_event: ArrayLike, failed: ArrayLike, answered: ArrayLike
) -> dict[int, int]:
    """For many events at once: ``event[i]`` is the event use ``i`` belongs to (a use of one of its images, in
    its server's life), ``t[i]`` when it was sent, ``t_event[i]`` its event's time, ``failed[i]`` whether it
    failed after render, ``answered[i]`` whether it was answered (ok, and no failure). Returns {event: the index
    of its cause}: the first failure sent after the event's last answered use before it."""
    event, t, t_event = np.asarray(event), np.asarray(t, dtype=float), np.asarray(t_event, dtype=float)
    before = t < t_event
    failed, answered = np.asarray(failed, dtype=bool) & before, np.asarray(answered, dtype=bool) & before
    last_ok = pd.Series(t[answered]).groupby(event[answered]).max()
    since = t > pd.Series(event).map(last_ok).fillna(-np.inf).to_numpy()
    pick = np.flatnonzero(failed & since)
    order = pick[np.lexsort((t[pick], event[pick]))]
    first = pd.Series(order).groupby(event[order]).first()
    return {int(e): int(i) for e, i in first.items()}


def cause(uses: Iterable[Use], t_event: float) -> Use | None:
    """The cause of an event at ``t_event`` among the image's ``uses`` in the same server's life (any order):
    the first use that failed after render, sent after the last answered use before the event."""
    uses = list(uses)
    if not uses:
        return None
    failed = [failed_after_render(u.kind, u.case, u.outcome) for u in uses]
    answered = [u.outcome == schema.OK and not f for u, f in zip(uses, failed)]
    found = causes(np.zeros(len(uses), dtype=int), [u.t for u in uses], np.full(len(uses), t_event), failed, answered)
    return uses[found[0]] if found else None


def label(u: Use) -> str:
    """``malformed_post/dimensions_unsupported`` (the kind, and its case when it has one)."""
    return u.kind + (f"/{u.case}" if u.case else "")


def describe(u: Use, t_event: float) -> str:
    """``malformed_post/dimensions_unsupported (HTTP 400), 1.0 s before``."""
    got = f"HTTP {u.status}" if u.status is not None else u.outcome
    return f"{label(u)} ({got}), {t_event - u.t:.1f} s before"
