"""Classify server-log lines by a table of named signatures kept as data (signatures.toml): which lines are
fatal, which mean cache drift, and what a crash is called."""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mmchaos.errors import MmchaosError
from mmchaos.options import did_you_mean
from mmchaos.records import Says, first_error, says, words

DEFAULT_FILE = Path(__file__).with_name("signatures.toml")
UNKNOWN = "unknown"
CHAIN_SEP = " → "  # between the links of a crash's chain: cache_drift → detokenizer_assert
# Log lines read this long before the server was last seen healthy belong to its past, not to its crash's chain
# (a server that answered drift with 503s for an hour and then ran out of memory died of the memory).
CHAIN_LOOKBACK_S = 5.0


class SignatureError(MmchaosError):
    pass


def _regex(value: Any) -> Any:
    if not isinstance(value, str):
        return value  # the field's type says what it must be
    try:
        return re.compile(value)
    except re.error as e:
        raise ValueError(f"bad pattern ({e})") from None


class Signature(BaseModel):
    """One [[signature]] of a signature table (signatures.toml's header says what each key means)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: Annotated[str, Field(min_length=1)]
    pattern: Annotated[re.Pattern, Says("a regular expression")]
    fatal: Annotated[bool, Says("true or false")] = False
    rank: Annotated[int, Says("an integer (lower: more specific)")] = 50
    description: Annotated[str, Says("a string")] = ""
    drift: Annotated[bool, Says("true or false")] = False  # the line means P0/P1 cache drift (logged or answered)

    _compile = field_validator("pattern", mode="before")(_regex)


class SignatureFile(BaseModel):
    """A signature file: the patterns that pull an mm_hash and a request id out of a line, and [[signature]]
    tables (each read as a Signature, told apart by its position)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    mm_hash_pattern: Annotated[re.Pattern | None, Says("a regular expression")] = None
    request_id_pattern: Annotated[re.Pattern | None, Says("a regular expression")] = None
    signature: Annotated[list[dict[str, Any]], Says("[[signature]] tables")] = []

    _compile = field_validator("mm_hash_pattern", "request_id_pattern", mode="before")(_regex)


def _problem(error: ValidationError, model: type[BaseModel], raw: dict) -> str:
    """pydantic's first error in a signature file's words (a key, then what it must be)."""
    kind, key, e = first_error(error, model)
    if kind == "unknown":
        return f"unknown key '{key}'; {did_you_mean(key, model.model_fields)}"
    if e["type"] == "value_error":  # a pattern that does not compile
        return words(e) if model is Signature else f"{key}: {words(e)}"
    return f"'{key}' must be {says(model, key) or 'something else'}, not {raw.get(key)!r}"


@dataclass(frozen=True)
class Match:
    signature: Signature
    mm_hash: str | None
    line: str
    request_id: str | None = None


class Signatures:
    def __init__(
        self,
        signatures: list[Signature],
        mm_hash_pattern: str | re.Pattern,
        request_id_pattern: str | re.Pattern = r"$^",
    ):
        self.signatures = signatures
        self.mm_hash = re.compile(mm_hash_pattern)
        self.request_id = re.compile(request_id_pattern)

    @classmethod
    @functools.cache
    def default(cls) -> Signatures:
        """The default table (read once per process)."""
        return cls.load()

    @classmethod
    def load(cls, *files: Path | str) -> Signatures:
        """The default table, extended by users' files (same shape; a user's name replaces a default one)."""
        by_name: dict[str, Signature] = {}
        mm_hash_pattern = request_id_pattern = None
        for f in (DEFAULT_FILE, *files):
            try:
                data = tomllib.loads(Path(f).read_text())
            except (OSError, tomllib.TOMLDecodeError) as e:
                raise SignatureError(f"cannot read signature file {f}: {e}") from e
            try:
                table = SignatureFile.model_validate(data)
            except ValidationError as e:
                raise SignatureError(f"{f}: {_problem(e, SignatureFile, data)}") from None
            if "mm_hash_pattern" in table.model_fields_set:
                mm_hash_pattern = table.mm_hash_pattern
            if "request_id_pattern" in table.model_fields_set:
                request_id_pattern = table.request_id_pattern
            for i, s in enumerate(table.signature):
                try:
                    sig = Signature.model_validate(s)
                except ValidationError as e:
                    kind, key, _ = first_error(e, Signature)
                    if kind == "unknown" or (kind == "missing" and key in ("name", "pattern")):
                        unknown = sorted(set(s) - set(Signature.model_fields))
                        raise SignatureError(
                            f"{f}: signature #{i + 1}: needs name and pattern; unknown keys: {unknown}"
                        ) from None
                    label = s["name"] if isinstance(s.get("name"), str) else f"#{i + 1}"
                    raise SignatureError(f"{f}: signature {label}: {_problem(e, Signature, s)}") from None
                by_name[sig.name] = sig
        return cls(
            sorted(by_name.values(), key=lambda s: s.rank), mm_hash_pattern or r"$^", request_id_pattern or r"$^"
        )

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

    def chain(self, items, crash: str | None = None) -> str:
        """A crash named by its chain: the signatures of the lines that led to it, in the order they were first
        logged, root first, ending in the crash's own signature: ``cache_drift → detokenizer_assert`` (the drift
        warning, then the assertion it led to) is another mechanism than ``expected_cached_item`` (the engine
        asserting on the miss itself), though both can end in the same assertion.

        ``items``: Matches or signature names, in log order, of the dying server's lines (the harness passes
        those from CHAIN_LOOKBACK_S before it was last healthy). ``crash``: its signature (default: the most
        specific fatal one among them; ``hang`` or ``unknown`` end the chain when no line named the death).
        Fatal lines less specific (by rank) than the crash's signature that are no drift only restate the same
        death from further out (``output_handler_failed`` heads the assertion's traceback, ``engine_dead``
        follows it), so they are left out: one mechanism gets one chain, whichever of them a death happened to
        print. Drift lines are causes and always stay."""
        by_name = {s.name: s for s in self.signatures}
        sigs = [
            by_name[n] for n in (i.signature.name if isinstance(i, Match) else str(i) for i in items) if n in by_name
        ]
        if crash is None:
            fatal = [s for s in sigs if s.fatal]
            crash = min(fatal, key=lambda s: s.rank).name if fatal else UNKNOWN
        own = by_name[crash].rank if crash in by_name else float("inf")
        links: list[str] = []
        for s in sigs:
            if not (s.fatal or s.drift):
                continue  # a line that names neither a death nor drift (a logged refusal) is no cause
            if s.name not in links and not (s.fatal and not s.drift and s.name != crash and s.rank > own):
                links.append(s.name)
            if s.name == crash:
                break  # what the dying server logged after its death is not a cause
        if crash not in links:
            links.append(crash)
        return CHAIN_SEP.join(links)
