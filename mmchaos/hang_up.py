"""The client that hangs up: a POST sent whole, then the connection closed if no answer came within a time, so the
server sees the client disconnect mid-request (as a user's closed tab or a timed-out SDK does). Standard library
only: the probes, the hunt and the standalone reproducers send it the same way."""

from __future__ import annotations

import http.client
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

HUNG_UP = "client hung up"  # the error of a request that was hung up on before any answer, as it was asked to


@dataclass(frozen=True)
class HangUp:
    status: int | None  # the answer's, when one came before the hang-up
    text: str  # the answer's body, or why there was none (HUNG_UP, or the connection error's name)
    ms: float  # from the start to the answer or the hang-up

    @property
    def hung_up(self) -> bool:
        return self.status is None and self.text == HUNG_UP


def hang_up(
    base_url: str, path: str, body: bytes, headers: dict, after_s: float, connect_s: float | None = None
) -> HangUp:
    """POST ``body`` to ``base_url`` + ``path``; hang up ``after_s`` seconds from the start if no answer came by
    then. ``connect_s``: a connection wait of its own, the hang-up's clock then starting once the request is sent
    (None: one deadline for all)."""
    url = urlsplit(base_url)
    cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    conn = cls(url.netloc, timeout=connect_s if connect_s is not None else after_s)
    t0 = time.perf_counter()
    try:
        conn.request("POST", url.path.rstrip("/") + path, body=body, headers=headers)
        assert conn.sock is not None
        spent = 0.0 if connect_s is not None else time.perf_counter() - t0
        conn.sock.settimeout(max(after_s - spent, 0.001))
        answer = conn.getresponse()
        return HangUp(answer.status, answer.read().decode(errors="replace"), (time.perf_counter() - t0) * 1000)
    except TimeoutError:
        return HangUp(None, HUNG_UP, (time.perf_counter() - t0) * 1000)
    except (OSError, http.client.HTTPException) as e:
        return HangUp(None, type(e).__name__, (time.perf_counter() - t0) * 1000)
    finally:
        conn.close()  # the hang-up: the server sees the client disconnect
