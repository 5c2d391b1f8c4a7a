"""The malformed-request catalogue: ``malformed_cases.toml`` plus users' own case files, validated. The file's
header documents the case format."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmchaos.errors import MmchaosError

from .bodies import EMBEDDINGS_PATH, TOKENIZE_PATH
from .mutations import MUTATIONS
from .patches import NEEDS_MAX_MODEL_LEN, PLACEHOLDERS, walk_strings

BUILTIN_CASES = Path(__file__).with_name("malformed_cases.toml")
STAGES = ("pre_render", "post_render")
EVIDENCE = ("measured", "expected")
CONFIDENCE = ("high", "medium", "low")
ENDPOINTS = (EMBEDDINGS_PATH, TOKENIZE_PATH)

_REQUIRED = ("name", "stage", "expected_status", "carries_image", "description")
_OPTIONAL = ("evidence", "confidence", "source", "endpoint", "mutation", "params", "patch", "unset")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")  # ends up in a comma-free table column


class CaseFileError(MmchaosError, ValueError):
    """A case file that cannot be used; the message names the file, the case and the key."""


@dataclass(frozen=True)
class MalformedCase:
    name: str
    stage: str
    expected_status: int
    carries_image: bool
    description: str
    evidence: str = "expected"
    confidence: str = "medium"
    source: str = ""
    endpoint: str = EMBEDDINGS_PATH
    mutation: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    patch: Mapping[str, Any] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    origin: str = ""  # the file it was loaded from

    @property
    def poisons(self) -> bool:
        """Whether the case can leave P0's cache ahead of P1's (the failure happens after render)."""
        return self.stage == "post_render"

    @property
    def kind(self) -> str:
        return "malformed_post" if self.poisons else "malformed_pre"

    @property
    def needs_max_model_len(self) -> bool:
        if self.mutation and MUTATIONS[self.mutation].needs_max_model_len:
            return True
        return any(s in NEEDS_MAX_MODEL_LEN for s in walk_strings(self.patch))


class Catalogue(Mapping[str, MalformedCase]):
    """Cases by name, in file order (built-in first)."""

    def __init__(self, cases: Sequence[MalformedCase]):
        self._cases = {c.name: c for c in cases}

    def __getitem__(self, name: str) -> MalformedCase:
        try:
            return self._cases[name]
        except KeyError:
            raise KeyError(f"no malformed case {name!r}; known: {', '.join(self._cases)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._cases)

    def __len__(self) -> int:
        return len(self._cases)

    def stage(self, stage: str) -> list[MalformedCase]:
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
        return [c for c in self._cases.values() if c.stage == stage]

    def usable(self, max_model_len: int | None) -> list[MalformedCase]:
        """The cases that can be built without / with a known max_model_len."""
        return [c for c in self._cases.values() if max_model_len is not None or not c.needs_max_model_len]

    def by_kind(
        self, max_model_len: int | None, names: Sequence[str] = (), weighted: Sequence[str] = ()
    ) -> dict[str, list[MalformedCase]]:
        """The cases each malformed kind of the mix draws from (``names``: only those), checked: an unknown name,
        or a kind in ``weighted`` left with no case, is a ValueError."""
        unknown = [n for n in names if n not in self._cases]
        if unknown:
            raise ValueError(f"unknown malformed case(s) {unknown}; known: {', '.join(self._cases)}")
        usable = [c for c in self.usable(max_model_len) if not names or c.name in names]
        out = {
            "malformed_pre": [c for c in usable if not c.poisons],
            "malformed_post": [c for c in usable if c.poisons and c.carries_image],
        }
        for kind in weighted:
            if kind in out and not out[kind]:
                stage = "after" if kind == "malformed_post" else "before"
                raise ValueError(
                    f"{kind} has weight but none of the selected malformed cases fails {stage} "
                    f"rendering: select one, or set its weight to 0"
                )
        return out


def _fail(origin: str, case: str | None, msg: str) -> CaseFileError:
    where = f"{origin}: case {case!r}" if case else origin
    return CaseFileError(f"{where}: {msg}")


def _same_type(value: Any, default: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def _parse_case(raw: Any, origin: str, position: int) -> MalformedCase:
    if not isinstance(raw, dict):
        raise _fail(origin, None, f"[[case]] #{position} is not a table")
    name = raw.get("name")
    label = name if isinstance(name, str) else f"#{position}"
    unknown = sorted(set(raw) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise _fail(origin, label, f"unknown key {unknown[0]!r} (allowed: {', '.join(_REQUIRED + _OPTIONAL)})")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise _fail(origin, label, f"missing required key {missing[0]!r}")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise _fail(origin, label, "'name' must be a non-empty string of letters, digits, '_', '.', '-'")

    def check(key: str, ok: bool, want: str) -> None:
        if not ok:
            raise _fail(origin, name, f"{key!r} must be {want}, got {raw[key]!r}")

    check("stage", raw["stage"] in STAGES, f"one of {STAGES}")
    status = raw["expected_status"]
    check(
        "expected_status",
        isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599,
        "an HTTP status (integer 100-599)",
    )
    check("carries_image", isinstance(raw["carries_image"], bool), "true or false")
    check("description", isinstance(raw["description"], str), "a string")
    if "evidence" in raw:
        check("evidence", raw["evidence"] in EVIDENCE, f"one of {EVIDENCE}")
    if "confidence" in raw:
        check("confidence", raw["confidence"] in CONFIDENCE, f"one of {CONFIDENCE}")
    if "source" in raw:
        check("source", isinstance(raw["source"], str), "a string")
    if "endpoint" in raw:
        check("endpoint", raw["endpoint"] in ENDPOINTS, f"one of {ENDPOINTS}")
    mutation = raw.get("mutation")
    if mutation is not None:
        check("mutation", mutation in MUTATIONS, f"one of {sorted(MUTATIONS)}")
    params = raw.get("params", {})
    if "params" in raw:
        check("params", isinstance(params, dict), "a table")
        if mutation is None:
            raise _fail(origin, name, "'params' given without a 'mutation'")
        allowed = MUTATIONS[mutation].params
        for k, v in params.items():
            if k not in allowed:
                raise _fail(
                    origin,
                    name,
                    f"unknown params key {k!r} for mutation {mutation!r} (allowed: {', '.join(allowed) or 'none'})",
                )
            if not _same_type(v, allowed[k]):
                raise _fail(origin, name, f"params.{k} must be a {type(allowed[k]).__name__}, got {v!r}")
    patch = raw.get("patch", {})
    if "patch" in raw:
        check("patch", isinstance(patch, dict), "a table")
        for s in walk_strings(patch):
            if s.startswith("$") and s not in PLACEHOLDERS:
                raise _fail(origin, name, f"unknown placeholder {s!r} in patch (known: {', '.join(PLACEHOLDERS)})")
    unset = raw.get("unset", [])
    if "unset" in raw:
        check(
            "unset",
            isinstance(unset, list) and all(isinstance(u, str) and u for u in unset),
            "a list of dotted key paths",
        )
    if mutation is None and not patch and not unset:
        raise _fail(origin, name, "changes nothing: give a 'mutation', a 'patch' or 'unset'")
    return MalformedCase(
        name=name,
        stage=raw["stage"],
        expected_status=status,
        carries_image=raw["carries_image"],
        description=raw["description"],
        evidence=raw.get("evidence", "expected"),
        confidence=raw.get("confidence", "medium"),
        source=raw.get("source", ""),
        endpoint=raw.get("endpoint", EMBEDDINGS_PATH),
        mutation=mutation,
        params={**(MUTATIONS[mutation].params if mutation else {}), **params},
        patch=patch,
        unset=tuple(unset),
        origin=origin,
    )


def read_case_file(path: str | Path) -> list[MalformedCase]:
    """The cases of one TOML file, validated (CaseFileError naming file, case and key on any problem)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"malformed case file {str(p)!r} does not exist")
    origin = str(p)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise _fail(origin, None, f"not valid TOML: {e}") from e
    extra = sorted(set(doc) - {"case"})
    if extra:
        raise _fail(origin, None, f"unknown top-level key {extra[0]!r} (a case file holds [[case]] tables only)")
    raw_cases = doc.get("case", [])
    if not isinstance(raw_cases, list) or not raw_cases:
        raise _fail(origin, None, "no cases (expected one or more [[case]] tables)")
    return [_parse_case(raw, origin, i + 1) for i, raw in enumerate(raw_cases)]


def load_cases(*extra_files: str | Path, include_builtin: bool = True) -> Catalogue:
    """The built-in catalogue plus the cases of ``extra_files`` (a name defined twice is an error)."""
    files: list[str | Path] = ([BUILTIN_CASES] if include_builtin else []) + list(extra_files)
    cases: list[MalformedCase] = []
    seen: dict[str, str] = {}
    for f in files:
        for c in read_case_file(f):
            if c.name in seen:
                raise _fail(c.origin, c.name, f"duplicate case name (already defined in {seen[c.name]})")
            seen[c.name] = c.origin
            cases.append(c)
    return Catalogue(cases)
