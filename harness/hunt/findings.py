"""A finding of the hunt: one distinct failure, as state.json keeps it and the report, ``--versions``, a re-run and
the findings page read it. Its fingerprint (oracles.py makes it) says what makes two findings the same bug."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Finding:
    """One distinct finding of a hunt, as state.json keeps it and the report, --versions and a re-run read it."""

    oracle: str  # crash | hang | unknown_signature | server_error | drift | wrong_answer | bad_response
    fingerprint: str  # what makes two findings the same bug (made of the fields below)
    title: str
    detail: str = ""
    count: int = 1
    first_case: int = 0
    cases: list[int] = field(default_factory=list)
    step: int | None = None  # of an answer's finding: the step of its first case that got the answer
    route: str | None = None  # of an answer's finding: the route that answered
    status: int | None = None  # of a 5xx finding
    chain: str | None = None  # of a crash or hang: the log signatures that led to it, root first
    process: str | None = None  # of a log finding: the process whose log said it (APIServer, EngineCore, ...)
    exception: str | None = None  # of an unknown signature: the exception's name its log gave
    frames: list[str] = field(default_factory=list)  # of an unknown signature: its innermost vLLM frames
    flags: list[str] = field(default_factory=list)  # the server's flags it was found under (keys masked)
    # of a crash found under a --flags-axis set: the fewest of the set's flags it still needs (None: not shrunk)
    needs_flags: list[str] | None = None
    reproducer: str | None = None  # its standalone script, relative to the hunt's folder
    confirmed: bool | None = None  # the reproducer did it again on a fresh server (None: not tried)
    affected: list[dict] = field(default_factory=list)  # --versions: [{"spec": ..., "result": ...}]

    def row(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_row(cls, row: dict) -> Finding:
        """A finding as state.json holds it (a field an older hunt did not write keeps its default)."""
        return cls(**{k: v for k, v in row.items() if k in cls.__dataclass_fields__})
