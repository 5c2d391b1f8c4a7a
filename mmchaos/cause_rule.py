"""What caused a drift or a crash, in the server's own words, defined once: the report (analysis/attribution.py)
and the web UI's panel (locustfiles/plugin/live_state.py) both apply it.

vLLM names the image it missed: its drift line carries the request (our X-Request-Id) and the item's ``mm_hash``.
That image's earlier uses in the same server's life tell what happened: a request that carried it and failed
*after* its image was processed (a post-render 4xx, a client that hung up, a timeout) left the API server's cache
believing the engine holds it. The cause is the first such failure since the image's last answered use: what
followed it until the event could only find the drifted entry. A use answered after the poison would itself
have met the drift. No such failure, no cause: a pre-render case, which by our catalogue cannot poison, is never
named by this rule.

One more cause needs no failure at all (measured on 0.30.0 with no poison in the mix, docs/findings.md): the
image's first two uses at once. P0 renders requests concurrently and P1 takes them one at a time: the first to be
rendered stores the image in P0's cache and carries its data; the second finds P0's entry and goes without data;
when it reaches the engine first, the engine misses it. So when no use of the image was answered before the missed
request was sent, a use in flight beside it (sent before it was answered, answered after it was sent) is the
cause, named as :data:`AT_ONCE`.
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
    t_end: float | None = None  # when its answer or failure came (None: not known)
    endpoint: str | None = None  # the route it was sent to: a poison on one route poisons every route


AT_ONCE = "first_use_at_once"  # the cause's kind when two requests carried a new image at once


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


def at_once(answered_end: ArrayLike, t: ArrayLike, t_end: ArrayLike, named_t: float, named_end: float) -> int | None:
    """Of an event's other uses (sent before its drift line), the index of the first one in flight beside the missed
    request (sent at ``named_t``, answered at ``named_end``): when none of them had been answered before it was
    sent. ``answered_end[i]`` is when use ``i`` was answered (NaN: not answered), ``t_end[i]`` when it ended (NaN:
    never)."""
    answered_end, t = np.asarray(answered_end, dtype=float), np.asarray(t, dtype=float)
    t_end = np.asarray(t_end, dtype=float)
    if (answered_end <= named_t).any():  # the engine had the image before: no race of first uses
        return None
    beside = np.flatnonzero((t <= named_end) & ~(t_end < named_t))  # NaN end: still in flight
    return int(beside[np.argmin(t[beside])]) if len(beside) else None


def first_use_at_once(uses: Iterable[Use], named: Use) -> Use | None:
    """The use that rendered the image beside the missed request ``named`` (see the module), or None."""
    uses = [u for u in uses if u.request_id is None or u.request_id != named.request_id]
    nan = float("nan")
    ok_end = [u.t_end if u.outcome == schema.OK and u.t_end is not None else nan for u in uses]
    ends = [u.t_end if u.t_end is not None else nan for u in uses]
    end = named.t_end if named.t_end is not None else float("inf")
    k = at_once(ok_end, [u.t for u in uses], ends, named.t, end)
    return None if k is None else uses[k]


def label(u: Use) -> str:
    """``malformed_post/dimensions_unsupported`` (the kind, and its case when it has one)."""
    return u.kind + (f"/{u.case}" if u.case else "")


def describe(u: Use, t_event: float, at_once: bool = False) -> str:
    """``malformed_post/dimensions_unsupported on /v1/embeddings (HTTP 400), 1.0 s before``; for a race of first
    uses, ``the image's first use at once with batch on /v1/embeddings (HTTP 500), 0.0 s before``."""
    got = f"HTTP {u.status}" if u.status is not None else u.outcome
    route = f" on {u.endpoint}" if u.endpoint else ""
    said = f"{label(u)}{route} ({got}), {t_event - u.t:.1f} s before"
    return f"the image's first use at once with {said}" if at_once else said
