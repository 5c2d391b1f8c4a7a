"""How a client retries, defined once: which failed attempts it sends again, and after how long.

``openai`` is the OpenAI Python SDK's default behaviour (``_base_client.py``: 2 retries; connection errors,
timeouts, 408, 409, 429 and >= 500 are retried unless the server says ``x-should-retry: false``; the delay is
0.5 s doubling up to 8 s, minus up to 25 % jitter, or the server's ``retry-after-ms`` / ``retry-after`` (seconds or
an HTTP date) when it is within (0, 120] s; a longer ``retry-after`` means no retry). ``none`` sends every request once.
The verdict uses :func:`retryable` too: a failure a retrying client would retry is a retryable error.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Mapping

from mmchaos import schema

NONE, OPENAI = "none", "openai"
POLICIES = (NONE, OPENAI)
OPENAI_MAX_RETRIES = 2
INITIAL_DELAY_S = 0.5
MAX_DELAY_S = 8.0
MAX_RETRY_AFTER_S = 120.0
_UNANSWERED = (schema.CONNECTION_ERROR, schema.TIMEOUT)


def retryable(status: int | None, outcome: str) -> bool:
    """A failed attempt a retrying client sends again (headers aside)."""
    if outcome in _UNANSWERED:
        return True
    return status is not None and (status in (408, 409, 429) or status >= 500)


def retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """The server's requested delay in seconds: ``retry-after-ms``, else ``retry-after`` in seconds or as an
    HTTP date (RFC 9110; the SDK's ``_parse_retry_after_header`` reads both, the date against the clock)."""
    if not headers:
        return None
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) / divisor
        except ValueError:
            pass
        if name == "retry-after":
            date = email.utils.parsedate_tz(value)
            if date is not None:
                return float(email.utils.mktime_tz(date)) - (time.time() if now is None else now)
    return None


def should_retry(
    policy: str, retries_done: int, status: int | None, outcome: str, headers: Mapping[str, str] | None = None
) -> bool:
    if policy != OPENAI or retries_done >= OPENAI_MAX_RETRIES:
        return False
    if outcome not in _UNANSWERED:
        after = retry_after(headers)
        if after is not None and math.isfinite(after) and after > MAX_RETRY_AFTER_S:
            return False
        flag = (headers or {}).get("x-should-retry")
        if flag in ("true", "false"):
            return flag == "true"
    return retryable(status, outcome)


def delay(retries_done: int, u: float, headers: Mapping[str, str] | None = None) -> float:
    """Seconds to wait before retry number ``retries_done + 1``; ``u`` uniform in [0, 1) (the jitter)."""
    after = retry_after(headers)
    if after is not None and math.isfinite(after) and 0 < after <= MAX_RETRY_AFTER_S:
        return after
    return min(INITIAL_DELAY_S * 2.0**retries_done, MAX_DELAY_S) * (1 - 0.25 * u)
