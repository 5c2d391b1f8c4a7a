"""What happened to one request, decided once: its status, its outcome, its error text, whether it got what it
was built to get, and who caused it to fail. The recorder writes rows with these rules, the web UI panel counts
with them, the campaign runner and the analysis read rows with them."""

from __future__ import annotations

import json
import socket
import sys

import numpy as np

from mmchaos import schema

ERROR_CHARS = 200


def status_of(response) -> int | None:
    code = getattr(response, "status_code", None)
    return code if code else None  # FastHttp reports 0 when no HTTP answer arrived


def error_text(response, exception, status: int | None) -> str | None:
    """The server's error message (its JSON ``error.message`` when it sent one), else the exception; None on 2xx."""
    if status is not None and 200 <= status < 300:
        return None
    if status is not None:
        try:
            body = response.text or ""
        except Exception:  # a body that cannot be read is no reason to lose the row
            body = ""
        try:
            msg = json.loads(body).get("error", {})
            body = msg.get("message", body) if isinstance(msg, dict) else str(msg)
        except (ValueError, AttributeError):
            pass
        return (body or f"HTTP {status}")[:ERROR_CHARS]
    return f"{type(exception).__name__}: {exception}"[:ERROR_CHARS] if exception else None


def _root_cause(exception):
    """geventhttpclient wraps the socket error of a failed attempt as ``.original``: unwrap it."""
    seen = 0
    while getattr(exception, "original", None) is not None and seen < 5:
        exception, seen = exception.original, seen + 1
    return exception


def _is_timeout(exception) -> bool:
    if isinstance(exception, (socket.timeout, TimeoutError)) or "timed out" in str(exception).lower():
        return True
    gevent = sys.modules.get("gevent")  # without gevent loaded there is no gevent.Timeout to meet
    return gevent is not None and isinstance(exception, gevent.Timeout)


def outcome_of(status: int | None, exception, aborting: bool) -> str:
    if status is not None:
        return schema.OK if 200 <= status < 300 else schema.HTTP_ERROR
    exception = _root_cause(exception)
    if _is_timeout(exception):
        return schema.ABORTED if aborting else schema.TIMEOUT
    return schema.CONNECTION_ERROR


def as_built(status: int | None, outcome: str | None, expected_status: int | None) -> bool:
    """Got what it was built to get: a malformed case its expected status, an abort its disconnect, else a 2xx."""
    if outcome == schema.ABORTED:
        return True
    if expected_status is not None:
        return status == expected_status
    return outcome == schema.OK


def cause_of(status: int | None, outcome: str | None, expected_status: int | None) -> str | None:
    """Who made it fail (schema.CAUSES), or None when it succeeded as built (``outcome`` None: a row without one)."""
    if outcome == schema.CUT:
        return schema.HARNESS
    if as_built(status, outcome, expected_status):
        return None if outcome == schema.OK else schema.CLIENT
    return schema.SERVER


def causes(rows) -> np.ndarray:
    """:func:`cause_of` of every row of a REQUESTS DataFrame, applied once per distinct (status, outcome, expected
    status): a million rows hold a few dozen."""
    if not len(rows):
        return np.empty(0, dtype=object)
    outcome = rows["outcome"].astype("category")
    key = np.stack(
        [
            rows["status"].to_numpy(float, na_value=np.nan),
            outcome.cat.codes.to_numpy(float),
            rows["expected_status"].to_numpy(float, na_value=np.nan),
        ],
        axis=1,
    )
    uniq, inverse = np.unique(np.nan_to_num(key, nan=-1.0), axis=0, return_inverse=True)
    names = list(outcome.cat.categories)
    table = [cause_of(_int(st), names[int(oc)] if oc >= 0 else None, _int(ex)) for st, oc, ex in uniq]
    return np.array(table, dtype=object)[inverse.ravel()]


def _int(x: float) -> int | None:
    return None if x < 0 else int(x)


def unexpected(rows) -> np.ndarray:
    """Rows (a REQUESTS DataFrame) whose request failed because of the server: it did not get what it was built
    to get (the malformed 400s the mix sends on purpose, aborts and requests cut by the run's end are not)."""
    return causes(rows) == schema.SERVER
