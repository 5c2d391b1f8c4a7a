"""One operator action: a POST to a route of the server under test, on a thread of its own, so the loop that
watches the server never waits on it (``/pause?mode=wait`` answers only once the requests in flight have drained)."""

from __future__ import annotations

import threading
import time

import requests

from mmchaos.auth import auth_headers

TIMEOUT_S = 60.0  # a drain or a sleep that takes longer is reported as not answered


class OperatorCall:
    def __init__(self, base_url: str, path: str, api_key: str | None = None, timeout: float = TIMEOUT_S):
        self.path = path
        self.t_sent = time.time()
        self.t_done: float | None = None
        self.status: int | None = None
        self.error = ""
        self._thread = threading.Thread(
            target=self._post, args=(base_url.rstrip("/") + path, auth_headers(api_key), timeout), daemon=True
        )
        self._thread.start()

    def _post(self, url: str, headers: dict, timeout: float) -> None:
        try:
            r = requests.post(url, headers=headers, timeout=timeout)
            self.status = r.status_code
            if not r.ok:
                self.error = " ".join(r.text.split())[:160]
        except requests.RequestException as e:
            self.error = type(e).__name__
        self.t_done = time.time()

    @property
    def done(self) -> bool:
        return self.t_done is not None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def wait(self, timeout: float = TIMEOUT_S) -> OperatorCall:
        self._thread.join(timeout)
        return self

    def says(self) -> str:
        """``POST /pause?mode=abort: 200 in 12 ms``, ``POST /resume: ConnectionError``."""
        if not self.done:
            return f"POST {self.path}: no answer"
        got = f"{self.status}" if self.status is not None else self.error
        if self.status is not None and self.error:
            got += f" {self.error}"
        if self.status == 404:
            got += " (is VLLM_SERVER_DEV_MODE=1 set?)"
        assert self.t_done is not None
        return f"POST {self.path}: {got} in {1000 * (self.t_done - self.t_sent):.0f} ms"
