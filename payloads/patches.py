"""The data side of malformed cases: placeholders in a case's ``patch``, JSON merge patches and ``unset`` paths."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

from .mutations import MutationContext

PLACEHOLDERS = ("$IMAGE_URL", "$MODEL", "$INSTRUCTION", "$TEXT", "$MAX_MODEL_LEN", "$MAX_MODEL_LEN_PLUS_ONE")
NEEDS_MAX_MODEL_LEN = ("$MAX_MODEL_LEN", "$MAX_MODEL_LEN_PLUS_ONE")


def walk_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from walk_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from walk_strings(v)


def substitute(value: Any, ctx: MutationContext) -> Any:
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
        return {k: substitute(v, ctx) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, ctx) for v in value]
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
