"""The hunt's differential oracle: a second server (``--reference``) is sent every request the target answered with
vectors or scores, and the two answers must agree (mmchaos/sameness.py: vectors by cosine, scores by difference).

The reference is the same engine launched with other flags (``--reference "--mm-processor-cache-gb 0"``: no cache
to drift from), or a server already running (``--reference http://127.0.0.1:8001``). It is sent only what the target
answered 200, one request at a time, after the case (so its own state follows the target's requests, not its
timing). A reference that does not answer 200 says nothing: only two answers are compared.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import requests

from mmchaos import sameness
from mmchaos.auth import auth_headers

from ..servers.server import Server, ServerError, Target
from .oracles import embeddings


def reference_target(spec: str, target: Target) -> Target:
    """``spec``: a URL to attach to, or vLLM flags for the target's engine (``--engine`` targets only)."""
    if spec.startswith(("http://", "https://")):
        return Target(mode="attach", url=spec)
    if target.mode != "engine":
        raise ServerError("--reference FLAGS launches the target's engine with those flags: give --engine, or a URL")
    return Target(mode="engine", engine=target.engine, model=target.model, flags=shlex.split(spec), env=target.env)


@dataclass
class Reference:
    spec: str  # as findings say it
    server: Server
    model: str = ""
    timeout: float = 60.0

    @classmethod
    def start(cls, spec: str, target: Target, log: Path, startup_timeout: float, label: str) -> Reference:
        """The reference server of ``spec``, started; ``label``: ``spec`` as findings say it (keys masked)."""
        server = Server(reference_target(spec, target), log)
        try:
            server.start()
            server.wait_healthy(startup_timeout)
        except ServerError:
            server.stop()
            raise
        return cls(label, server, server.model_name())

    def stop(self) -> None:
        self.server.stop()

    def disagreements(self, path: str, body: dict, answer: dict) -> list[str]:
        """Why the reference's answer to ``body`` is not the target's ``answer`` (one line per input that differs):
        vectors by cosine, scores by their difference."""
        ours_v, ours_s = embeddings(answer, body), _scores(answer)
        if ours_v is None and ours_s is None:
            return []  # neither vectors nor scores: nothing to compare
        theirs = self._answer(path, body)
        if theirs is None:
            return []
        if ours_v is not None:
            other = embeddings(theirs, body)
            if other is None or len(other) != len(ours_v):
                return []
            return [
                f"the reference ({self.spec}) answered input {i} of {path} otherwise "
                f"(cosine {sameness.cosine(a, b):.4f} < {sameness.COSINE_MIN})"
                for i, (a, b) in enumerate(zip(ours_v, other))
                if not sameness.agree(a, b)
            ]
        other_s = _scores(theirs)
        if other_s is None or ours_s is None or len(other_s) != len(ours_s):
            return []
        return [
            f"the reference ({self.spec}) scored pair {i} of {path} otherwise ({a:.4f} vs {b:.4f})"
            for i, (a, b) in enumerate(zip(ours_s, other_s))
            if not sameness.scores_agree(a, b)
        ]

    def _answer(self, path: str, body: dict) -> dict | None:
        """The reference's 200 answer to ``body`` (None: another status, or no answer)."""
        sent = {**body, "model": self.model} if "model" in body else body
        headers = auth_headers(self.server.api_key) if self.server.api_key else {}
        try:
            r = requests.post(self.server.base_url + path, json=sent, headers=headers, timeout=self.timeout)
            out = r.json() if r.status_code == 200 else None
        except (requests.RequestException, ValueError):
            return None
        return out if isinstance(out, dict) else None


def _scores(answer: object) -> list[float] | None:
    try:
        return sameness.scores(answer)  # type: ignore[arg-type]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
