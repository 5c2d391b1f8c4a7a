"""The malformed-request catalogue: ``malformed_cases.toml`` plus users' own case files, validated. The file's
header documents the case format."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mmchaos.errors import MmchaosError
from mmchaos.records import Says, first_error, says, words

from .bodies import EMBEDDINGS_PATH, TOKENIZE_PATH
from .mutations import MUTATIONS
from .patches import NEEDS_MAX_MODEL_LEN, PLACEHOLDERS, walk_strings
from .routes import PATHS as ROUTE_PATHS

BUILTIN_CASES = Path(__file__).with_name("malformed_cases.toml")
STAGES = ("pre_render", "post_render")
EVIDENCE = ("measured", "expected")
CONFIDENCE = ("high", "medium", "low")
ENDPOINTS = (EMBEDDINGS_PATH, TOKENIZE_PATH, *ROUTE_PATHS)

_REQUIRED = ("name", "stage", "expected_status", "carries_image", "description")
_OPTIONAL = ("evidence", "confidence", "source", "endpoint", "mutation", "params", "patch", "unset")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")  # ends up in a comma-free table column
_NAME_WORDS = "'name' must be a non-empty string of letters, digits, '_', '.', '-'"


class CaseFileError(MmchaosError, ValueError):
    """A case file that cannot be used; the message names the file, the case and the key."""


class MalformedCase(BaseModel):
    """One [[case]] of a case file (the keys malformed_cases.toml's header documents), checked as it is read:
    TOML's types as they are (a status written "400" is no status), every key named, and what needs more than
    one key (params for the case's mutation, placeholders a patch may use, a case that changes something)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: Annotated[str, Field(pattern=_NAME_RE.pattern)]
    stage: Annotated[Literal[STAGES], Says(f"one of {STAGES}")]  # type: ignore[valid-type]
    expected_status: Annotated[int, Field(ge=100, le=599), Says("an HTTP status (integer 100-599)")]
    carries_image: Annotated[bool, Says("true or false")]
    description: Annotated[str, Says("a string")]
    evidence: Annotated[Literal[EVIDENCE], Says(f"one of {EVIDENCE}")] = "expected"  # type: ignore[valid-type]
    confidence: Annotated[Literal[CONFIDENCE], Says(f"one of {CONFIDENCE}")] = "medium"  # type: ignore[valid-type]
    source: Annotated[str, Says("a string")] = ""
    endpoint: Annotated[Literal[ENDPOINTS], Says(f"one of {ENDPOINTS}")] = EMBEDDINGS_PATH  # type: ignore[valid-type]
    mutation: Annotated[Literal[tuple(MUTATIONS)] | None, Says(f"one of {sorted(MUTATIONS)}")] = None  # type: ignore[valid-type]
    # the mutation's params: those given over the mutation's defaults (the defaults are filled in as it is read)
    params: Annotated[dict[str, Any], Says("a table")] = {}
    patch: Annotated[dict[str, Any], Says("a table")] = {}
    unset: Annotated[
        tuple[Annotated[str, Field(min_length=1)], ...], Field(strict=False), Says("a list of dotted key paths")
    ] = ()
    origin: str = ""  # the file it was loaded from (set by the reader, not a key of the file)

    @model_validator(mode="before")
    @classmethod
    def _mutation_defaults(cls, raw: Any) -> Any:
        """A mutation's params: its defaults, then those the case gives (checked after, key by key)."""
        if isinstance(raw, dict) and raw.get("mutation") in MUTATIONS and isinstance(raw.get("params", {}), dict):
            return {**raw, "params": {**MUTATIONS[raw["mutation"]].params, **raw.get("params", {})}}
        return raw

    @model_validator(mode="after")
    def _keys_together(self) -> MalformedCase:
        given = self.model_fields_set
        if "params" in given:
            if self.mutation is None:
                raise ValueError("'params' given without a 'mutation'")
            allowed = MUTATIONS[self.mutation].params
            for k, v in self.params.items():
                if k not in allowed:
                    known = ", ".join(allowed) or "none"
                    raise ValueError(f"unknown params key {k!r} for mutation {self.mutation!r} (allowed: {known})")
                if not _same_type(v, allowed[k]):
                    raise ValueError(f"params.{k} must be a {type(allowed[k]).__name__}, got {v!r}")
        for s in walk_strings(self.patch):
            if s.startswith("$") and s not in PLACEHOLDERS:
                raise ValueError(f"unknown placeholder {s!r} in patch (known: {', '.join(PLACEHOLDERS)})")
        if self.mutation is None and not self.patch and not self.unset:
            raise ValueError("changes nothing: give a 'mutation', a 'patch' or 'unset'")
        return self

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
        self,
        max_model_len: int | None,
        names: Sequence[str] = (),
        weighted: Sequence[str] = (),
        served: Sequence[str] | None = None,
    ) -> dict[str, list[MalformedCase]]:
        """The cases each malformed kind of the mix draws from (``names``: only those; ``served``: the other pooling
        routes the server lists, None for all), checked: an unknown name, or a kind in ``weighted`` left with no
        case, is a ValueError."""
        unknown = [n for n in names if n not in self._cases]
        if unknown:
            raise ValueError(f"unknown malformed case(s) {unknown}; known: {', '.join(self._cases)}")
        usable = [
            c
            for c in self.usable(max_model_len)
            if (not names or c.name in names)
            and (served is None or c.endpoint not in ROUTE_PATHS or c.endpoint in served)
        ]
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


class CaseFile(BaseModel):
    """A case file: [[case]] tables, at least one (each read as a MalformedCase, told apart by its position)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    case: Annotated[list[Any], Field(min_length=1)]


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
    if "origin" in raw:  # ours, not the file's
        raise _fail(origin, label, f"unknown key 'origin' (allowed: {', '.join(_REQUIRED + _OPTIONAL)})")
    try:
        return MalformedCase.model_validate({**raw, "origin": origin})
    except ValidationError as e:
        raise _fail(origin, label, _problem(e, raw)) from None


def _problem(error: ValidationError, raw: dict) -> str:
    """pydantic's first error as the case file's words."""
    kind, key, e = first_error(error, MalformedCase)
    if kind == "unknown":
        return f"unknown key {key!r} (allowed: {', '.join(_REQUIRED + _OPTIONAL)})"
    if kind == "missing":
        return f"missing required key {key!r}"
    if kind == "rule":
        return words(e)
    if key == "name":
        return _NAME_WORDS
    return f"{key!r} must be {says(MalformedCase, key)}, got {raw[key]!r}"


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
    try:
        raw_cases = CaseFile.model_validate(doc).case
    except ValidationError as e:
        kind, key, _ = first_error(e, CaseFile)
        if kind == "unknown":
            raise _fail(
                origin, None, f"unknown top-level key {key!r} (a case file holds [[case]] tables only)"
            ) from None
        raise _fail(origin, None, "no cases (expected one or more [[case]] tables)") from None
    return [_parse_case(raw, origin, i + 1) for i, raw in enumerate(raw_cases)]


def load_cases(*extra_files: str | Path, include_builtin: bool = True) -> Catalogue:
    """The built-in catalogue plus the cases of ``extra_files`` (a name defined twice is an error)."""
    files: list[str | Path] = [*([BUILTIN_CASES] if include_builtin else []), *extra_files]
    cases: list[MalformedCase] = []
    seen: dict[str, str] = {}
    for f in files:
        for c in read_case_file(f):
            if c.name in seen:
                raise _fail(c.origin, c.name, f"duplicate case name (already defined in {seen[c.name]})")
            seen[c.name] = c.origin
            cases.append(c)
    return Catalogue(cases)
