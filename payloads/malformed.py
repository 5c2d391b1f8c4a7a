"""The malformed-request catalogue: loading ``malformed_cases.toml`` (plus users' own case files) and building
the concrete request of a case for a pool image. The file's header documents the case format."""

from __future__ import annotations

import base64
import copy
import functools
import re
import struct
import tomllib
import urllib.parse
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .images import DataURL, PoolImage
from .requests import (
    DEFAULT_INSTRUCTION,
    EMBEDDINGS_PATH,
    TOKENIZE_PATH,
    BuiltRequest,
    RequestMeta,
    image_request,
    tokenize_request,
)

BUILTIN_CASES = Path(__file__).with_name("malformed_cases.toml")
STAGES = ("pre_render", "post_render")
EVIDENCE = ("measured", "expected")
CONFIDENCE = ("high", "medium", "low")
ENDPOINTS = (EMBEDDINGS_PATH, TOKENIZE_PATH)
DEFAULT_TEXT = "A picture a user uploaded."

_REQUIRED = ("name", "stage", "expected_status", "carries_image", "description")
_OPTIONAL = ("evidence", "confidence", "source", "endpoint", "mutation", "params", "patch", "unset")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")  # ends up in a comma-free table column


class CaseFileError(ValueError):
    """A case file that cannot be used; the message names the file, the case and the key."""


# ---------------------------------------------------------------------------------------------------------------
# mutations: the changes that need code
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MutationContext:
    image: PoolImage
    model: str
    max_model_len: int | None
    text: str
    instruction: str | None
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Mutation:
    fn: Callable[[dict, MutationContext], dict]
    params: Mapping[str, Any] = field(default_factory=dict)  # accepted params and their defaults
    needs_max_model_len: bool = False
    doc: str = ""


def _image_parts(body: dict) -> Iterator[dict]:
    convs = body.get("messages") or []
    if convs and isinstance(convs[0], list):  # a batch: a list of conversations
        convs = [m for conv in convs for m in conv]
    for msg in convs:
        content = msg.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image_url":
                    yield part


def _set_first_image_url(body: dict, url: str) -> dict:
    for part in _image_parts(body):
        part["image_url"]["url"] = url
        return body
    raise ValueError("the request has no image_url part to mutate")


def _set_text(body: dict, text: str) -> dict:
    """Replace the user message's text part (added when missing)."""
    for msg in body.get("messages", []):
        if msg.get("role") == "user" and isinstance(msg.get("content"), list):
            parts = [p for p in msg["content"] if p.get("type") != "text"]
            msg["content"] = parts + [{"type": "text", "text": text}]
            return body
    raise ValueError("the request has no user message to put text in")


def _digits(n: int) -> str:
    # Qwen2/Qwen3 pre-tokenisation splits every digit on its own (\p{N}), so n digits are exactly n tokens
    # for the real model's tokenizer and for the tiny test model's byte-level BPE alike
    return ("0123456789" * (n // 10 + 1))[:n]


def _mut_bad_base64(body: dict, ctx: MutationContext) -> dict:
    return _set_first_image_url(body, _bad_base64_url(ctx.image))


def _mut_truncated_image(body: dict, ctx: MutationContext) -> dict:
    frac = float(ctx.params["keep_fraction"])
    if not 0.0 < frac < 1.0:
        raise ValueError(f"keep_fraction must be in (0, 1), got {frac}")
    data = ctx.image.data[: max(1, int(len(ctx.image.data) * frac))]
    return _set_first_image_url(body, DataURL(f"data:{ctx.image.mime};base64,{base64.b64encode(data).decode()}"))


def _mut_unsupported_format(body: dict, ctx: MutationContext) -> dict:
    fmt = ctx.params["format"]
    w, h = ctx.image.width, ctx.image.height
    if fmt == "svg":
        mime = "image/svg+xml"
        data = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}">'
            f'<rect width="{w}" height="{h}" fill="#3a7bd5"/><circle cx="{w // 2}" cy="{h // 2}" r="{min(w, h) // 4}" '
            'fill="#ffd200"/></svg>'
        ).encode()
    elif fmt == "pdf":
        mime = "application/pdf"
        data = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"
    else:
        raise ValueError(f"format must be 'svg' or 'pdf', got {fmt!r}")
    return _set_first_image_url(body, DataURL(f"data:{mime};base64,{base64.b64encode(data).decode()}"))


def _mut_data_url_not_base64(body: dict, ctx: MutationContext) -> dict:
    return _set_first_image_url(body, DataURL(f"data:{ctx.image.mime},{_percent_encoded(ctx.image.data)}"))


@functools.lru_cache(maxsize=64)
def _percent_encoded(data: bytes) -> str:
    # quote_from_bytes works byte by byte in Python (~5 ms for 100 kB); pool images come back again and again.
    # Its output is letters, digits, "_.-~/" and %XX: nothing JSON escapes (hence DataURL above)
    return urllib.parse.quote_from_bytes(data)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` but carries one short row: tiny to send, and anything that
    opens it sees the declared size before it could decode (and fail on) the missing rows."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    idat = zlib.compress(b"\x00" + b"\x80" * 3 * min(width, 64))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _mut_oversized_image(body: dict, ctx: MutationContext) -> dict:
    w, h = int(ctx.params["width"]), int(ctx.params["height"])
    if not (0 < w < 2**31 and 0 < h < 2**31):
        raise ValueError(f"width and height must be in [1, 2**31), got {w}x{h}")
    data = png_header_only(w, h)
    return _set_first_image_url(body, DataURL(f"data:image/png;base64,{base64.b64encode(data).decode()}"))


def _mut_prompt_over(body: dict, ctx: MutationContext) -> dict:
    assert ctx.max_model_len is not None
    margin = int(ctx.params["margin_tokens"])
    n = ctx.max_model_len - margin
    if n < 1:
        raise ValueError(f"max_model_len={ctx.max_model_len} leaves no room for text with margin_tokens={margin}")
    return _set_text(body, _digits(n))


def _mut_text_over(body: dict, ctx: MutationContext) -> dict:
    assert ctx.max_model_len is not None
    return _set_text(body, _digits(ctx.max_model_len + int(ctx.params["extra_tokens"])))


def _bad_base64_url(image: PoolImage) -> str:
    head, _, b64 = image.data_url.partition(",")
    mid = len(b64) // 2
    return DataURL(f"{head},{b64[:mid]}!*@~{b64[mid:]}")  # "!*@~": outside base64, nothing JSON escapes


def _mut_extra_bad_image(body: dict, ctx: MutationContext) -> dict:
    for msg in body.get("messages", []):
        if msg.get("role") == "user" and isinstance(msg.get("content"), list):
            content = msg["content"]
            at = max((i for i, p in enumerate(content) if p.get("type") == "image_url"), default=-1) + 1
            content.insert(at, {"type": "image_url", "image_url": {"url": _bad_base64_url(ctx.image)}})
            return body
    raise ValueError("the request has no user message to add an image to")


def _mut_batch_with_bad_item(body: dict, ctx: MutationContext) -> dict:
    good = body["messages"]
    bad = _set_first_image_url({"messages": copy.deepcopy(good)}, _bad_base64_url(ctx.image))["messages"]
    body["messages"] = [good, bad]  # the batch form: a list of conversations
    return body


MUTATIONS: dict[str, Mutation] = {
    "bad_base64": Mutation(_mut_bad_base64, doc="characters outside the base64 alphabet in the image data URL"),
    "truncated_image": Mutation(
        _mut_truncated_image, {"keep_fraction": 0.5}, doc="valid base64 of the first part of the image file"
    ),
    "unsupported_image_format": Mutation(
        _mut_unsupported_format, {"format": "svg"}, doc="an SVG or PDF data URL in place of the image"
    ),
    "data_url_not_base64": Mutation(_mut_data_url_not_base64, doc="a percent-encoded (not base64) data URL"),
    "oversized_image": Mutation(
        _mut_oversized_image,
        {"width": 20000, "height": 20000},
        doc="a PNG declaring width x height px with a tiny body",
    ),
    "extra_bad_image": Mutation(
        _mut_extra_bad_image, doc="a second, bad-base64 image after the valid one in the same message"
    ),
    "batch_with_bad_item": Mutation(
        _mut_batch_with_bad_item,
        doc="a batch of two conversations: the valid one, and a copy whose image is bad base64",
    ),
    "prompt_over_max_model_len": Mutation(
        _mut_prompt_over,
        # 64: more than the chat template's own tokens (system instruction, roles, vision markers, ~20-50) and
        # no more than the fewest tokens an image can take (Qwen3-VL: min_pixels 65536 / (32x32 px) = 64)
        {"margin_tokens": 64},
        needs_max_model_len=True,
        doc="text of max_model_len - margin_tokens tokens next to the image",
    ),
    "text_over_max_model_len": Mutation(
        _mut_text_over,
        {"extra_tokens": 64},
        needs_max_model_len=True,
        doc="text of max_model_len + extra_tokens tokens next to the image",
    ),
}

# ---------------------------------------------------------------------------------------------------------------
# placeholders and merge patches
# ---------------------------------------------------------------------------------------------------------------

PLACEHOLDERS = ("$IMAGE_URL", "$MODEL", "$INSTRUCTION", "$TEXT", "$MAX_MODEL_LEN", "$MAX_MODEL_LEN_PLUS_ONE")
_NEEDS_MML = ("$MAX_MODEL_LEN", "$MAX_MODEL_LEN_PLUS_ONE")


def _walk_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _walk_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk_strings(v)


def _substitute(value: Any, ctx: MutationContext) -> Any:
    if isinstance(value, str) and value.startswith("$"):
        if value == "$IMAGE_URL":
            return ctx.image.data_url
        if value == "$MODEL":
            return ctx.model
        if value == "$INSTRUCTION":
            return ctx.instruction
        if value == "$TEXT":
            return ctx.text
        if value == "$MAX_MODEL_LEN":
            return ctx.max_model_len
        if value == "$MAX_MODEL_LEN_PLUS_ONE":
            return None if ctx.max_model_len is None else ctx.max_model_len + 1
        return value
    if isinstance(value, Mapping):
        return {k: _substitute(v, ctx) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, ctx) for v in value]
    return value


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396 JSON merge patch (objects merge recursively, everything else replaces; no null-deletes)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for k, v in patch.items():
        out[k] = merge_patch(out.get(k), v)
    return out


def unset_path(body: dict, dotted: str) -> None:
    """Delete ``a.b.0.c`` from ``body`` (list items by index). KeyError naming the path when it is absent."""
    *parents, last = dotted.split(".")
    node: Any = body
    try:
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if isinstance(node, list):
            del node[int(last)]
        else:
            del node[last]
    except (KeyError, IndexError, ValueError, TypeError) as e:
        raise KeyError(f"cannot unset {dotted!r}: no such key in the request body") from e


# ---------------------------------------------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------------------------------------------


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
        return any(s in _NEEDS_MML for s in _walk_strings(self.patch))


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
        raise _fail(
            origin, label, f"unknown key {unknown[0]!r} (allowed: {', '.join(_REQUIRED + _OPTIONAL)})"
        )
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
    check("expected_status", isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599,
          "an HTTP status (integer 100-599)")
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
                raise _fail(origin, name, f"unknown params key {k!r} for mutation {mutation!r} "
                                          f"(allowed: {', '.join(allowed) or 'none'})")
            if not _same_type(v, allowed[k]):
                raise _fail(origin, name, f"params.{k} must be a {type(allowed[k]).__name__}, got {v!r}")
    patch = raw.get("patch", {})
    if "patch" in raw:
        check("patch", isinstance(patch, dict), "a table")
        for s in _walk_strings(patch):
            if s.startswith("$") and s not in PLACEHOLDERS:
                raise _fail(origin, name, f"unknown placeholder {s!r} in patch (known: {', '.join(PLACEHOLDERS)})")
    unset = raw.get("unset", [])
    if "unset" in raw:
        check("unset", isinstance(unset, list) and all(isinstance(u, str) and u for u in unset),
              "a list of dotted key paths")
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


def build_malformed_request(
    case: MalformedCase,
    image: PoolImage,
    model: str,
    *,
    max_model_len: int | None = None,
    text: str = DEFAULT_TEXT,
    instruction: str | None = DEFAULT_INSTRUCTION,
) -> BuiltRequest:
    """The concrete request of ``case`` built around pool image ``image``: the valid request (image + text,
    instruction as system message), then the mutation, ``unset`` and ``patch``. ``max_model_len`` (the server's
    --max-model-len) is required by the cases whose ``needs_max_model_len`` is true."""
    if case.needs_max_model_len and max_model_len is None:
        raise ValueError(f"malformed case {case.name!r} needs max_model_len (the server's --max-model-len)")
    if case.endpoint == TOKENIZE_PATH:
        base = tokenize_request(model, image, text, instruction=instruction)
    else:
        base = image_request(model, image, text, instruction=instruction)
    body = copy.deepcopy(base.body)
    ctx = MutationContext(image, model, max_model_len, text, instruction, case.params)
    if case.mutation:
        body = MUTATIONS[case.mutation].fn(body, ctx)
    for path in case.unset:
        unset_path(body, path)
    if case.patch:
        body = merge_patch(body, _substitute(case.patch, ctx))
    meta = RequestMeta(
        kind=case.kind,
        image_ids=(image.id,) if case.carries_image else (),
        image_hashes=(image.hash,) if case.carries_image else (),
        case=case.name,
        expected_status=case.expected_status,
    )
    return BuiltRequest(case.endpoint, body, meta)
