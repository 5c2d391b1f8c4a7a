"""What happened to one request, decided once: its status, its outcome, its error text, and whether it got what
it was built to get. The recorder writes rows with these rules, the web UI panel counts with them, the campaign
runner and the analysis read rows with them."""

from __future__ import annotations

import json
import socket
import sys

from mmchaos import schema

ERROR_CHARS = 200


class StoppedByLocust(Exception):
    """A request still in flight when Locust stopped its user: the client gave up on it."""


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
    if isinstance(exception, StoppedByLocust):
        return schema.ABORTED
    exception = _root_cause(exception)
    if _is_timeout(exception):
        return schema.ABORTED if aborting else schema.TIMEOUT
    return schema.CONNECTION_ERROR


def unexpected(rows):
    """Requests (a REQUESTS DataFrame) that did not get what they were built to get: a malformed case's expected
    status, an abort's disconnect, else a 2xx. (The malformed 400s the mix sends on purpose are not errors.)"""
    expected = rows["expected_status"]
    return ~(((rows["outcome"] == schema.OK) & expected.isna())
             | (rows["status"] == expected)
             | (rows["outcome"] == schema.ABORTED))
