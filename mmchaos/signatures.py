"""Classify server-log lines by a table of named signatures kept as data (signatures.toml): which lines are
fatal, which mean cache drift, and what a crash is called."""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

DEFAULT_FILE = Path(__file__).with_name("signatures.toml")
UNKNOWN = "unknown"
_KEYS = {"name", "pattern", "fatal", "drift", "rank", "description"}


class SignatureError(Exception):
    pass


@dataclass(frozen=True)
class Signature:
    name: str
    pattern: re.Pattern
    fatal: bool
    rank: int
    description: str
    drift: bool = False  # the line means P0/P1 cache drift (logged or answered)


@dataclass(frozen=True)
class Match:
    signature: Signature
    mm_hash: str | None
    line: str
    request_id: str | None = None


class Signatures:
    def __init__(self, signatures: list[Signature], mm_hash_pattern: str, request_id_pattern: str = r"$^"):
        self.signatures = signatures
        self.mm_hash = re.compile(mm_hash_pattern)
        self.request_id = re.compile(request_id_pattern)

    @classmethod
    @functools.cache
    def default(cls) -> "Signatures":
        """The default table (read once per process)."""
        return cls.load()

    @classmethod
    def load(cls, *files: Path | str) -> "Signatures":
        """The default table, extended by users' files (same shape; a user's name replaces a default one)."""
        by_name: dict[str, Signature] = {}
        mm_hash_pattern = request_id_pattern = None
        for f in (DEFAULT_FILE, *files):
            try:
                data = tomllib.loads(Path(f).read_text())
            except (OSError, tomllib.TOMLDecodeError) as e:
                raise SignatureError(f"cannot read signature file {f}: {e}") from e
            mm_hash_pattern = data.get("mm_hash_pattern", mm_hash_pattern)
            request_id_pattern = data.get("request_id_pattern", request_id_pattern)
            for i, s in enumerate(data.get("signature", [])):
                unknown = set(s) - _KEYS
                if unknown or not {"name", "pattern"} <= set(s):
                    raise SignatureError(
                        f"{f}: signature #{i + 1}: needs name and pattern; unknown keys: {sorted(unknown)}"
                    )
                try:
                    pat = re.compile(s["pattern"])
                except re.error as e:
                    raise SignatureError(f"{f}: signature {s['name']}: bad pattern ({e})") from e
                by_name[s["name"]] = Signature(s["name"], pat, bool(s.get("fatal", False)), int(s.get("rank", 50)),
                                               s.get("description", ""), bool(s.get("drift", False)))
        return cls(sorted(by_name.values(), key=lambda s: s.rank), mm_hash_pattern or r"$^",
                   request_id_pattern or r"$^")

    @property
    def drift_names(self) -> frozenset[str]:
        """The signatures that mean P0/P1 cache drift: what every drift count counts."""
        return frozenset(s.name for s in self.signatures if s.drift)

    def drift_answer(self, status: int | None, error: str | None) -> str | None:
        """The drift signature of an answer that says the server missed its cache (vLLM 0.32's retryable 503),
        else None."""
        m = self.match(error) if status == 503 and error else None
        return m.signature.name if m and m.signature.drift else None

    def match(self, line: str) -> Match | None:
        for s in self.signatures:
            if s.pattern.search(line):
                m = self.mm_hash.search(line)
                r = self.request_id.search(line)
                return Match(s, m.group(1) if m else None, line.rstrip()[:500], r.group(1) if r else None)
        return None

    def scan(self, text: str) -> list[Match]:
        return [m for m in map(self.match, text.splitlines()) if m]

    def classify_crash(self, matches: list[Match]) -> str:
        """The name of the most specific fatal signature among ``matches``, else 'unknown'."""
        fatal = [m.signature for m in matches if m.signature.fatal]
        return min(fatal, key=lambda s: s.rank).name if fatal else UNKNOWN
