"""When a server that answered /health has crashed or hung: one rule for the campaign's crash watch and the web
UI's panel.

An answer other than 200, or a refused connection, after the server was healthy is a crash (``health_failed``);
no answer at all for ``hang_after`` seconds after it was healthy is a hang. A server that was never healthy has
not crashed (it did not start). After a crash, the next ok poll means the server is back (a restart).
"""

from __future__ import annotations

HANG_AFTER = 10.0  # seconds of /health not answering at all, after ok, that count as a crash (hang)
HEALTH_FAILED, HANG = "health_failed", "hang"
OK, REFUSED, NO_ANSWER = "ok", "refused", "no answer"


def health_state(ok: bool, status: int | None, error: str | None) -> str:
    """ok, "HTTP <status>", no answer (timed out) or refused (nobody listening, or the connection reset)."""
    if ok:
        return OK
    if status is not None:
        return f"HTTP {status}"
    err = (error or "").lower()
    return NO_ANSWER if "timeout" in err or "timed out" in err else REFUSED


class HealthRule:
    """Feed it /health observations in time order; it says when one of them is a crash or a hang."""

    def __init__(self, hang_after: float = HANG_AFTER):
        self.hang_after = hang_after
        self.last_ok: float | None = None
        self.silent_since: float | None = None
        self.down = False  # a crash was reported and the server has not answered ok since

    def observe(self, t: float, state: str) -> str | None:
        """``state`` from :func:`health_state`; returns HEALTH_FAILED or HANG when this observation is a crash."""
        if state == OK:
            self.last_ok, self.silent_since, self.down = t, None, False
            return None
        if self.last_ok is None or self.down:
            return None
        if state == NO_ANSWER:
            self.silent_since = self.silent_since or t  # hung, or just busy?
            if t - self.silent_since < self.hang_after:
                return None
            self.down = True
            return HANG
        self.silent_since = None
        self.down = True
        return HEALTH_FAILED
