"""What the typed records of mmchaos's own files share (the malformed catalogue, the signature table, request-log
lines, the options): pydantic models that name every key (``extra="forbid"``), and pydantic's errors put back
into the one-line words each file's readers have always given.

A model says what a key must be with ``Says`` in its annotation (as mmchaos/campaign_file.py does for campaign
files); :func:`first_error` picks the one error a reader reports, in the order a person fixes a file in: a key
that is not one, then a key that is missing, then the first bad value in the model's order, then what needs more
than one key (a model validator's own words, :func:`words`).
"""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ValidationError


class Says:
    """What a misshapen value of this key is told ("must be <text>, got <value>")."""

    def __init__(self, text: str):
        self.text = text


def says(model: type[BaseModel], key: str) -> str | None:
    """What ``key`` of ``model`` must be, from its ``Says`` (on the field, or on a member of its union: the X of
    ``Annotated[X, Says(...)] | None``)."""
    info = model.model_fields.get(key)
    if info is None:
        return None
    found = [m.text for m in info.metadata if isinstance(m, Says)]
    for member in get_args(info.annotation):
        found += [m.text for m in getattr(member, "__metadata__", ()) if isinstance(m, Says)]
    return found[0] if found else None


def first_error(error: ValidationError, model: type[BaseModel]) -> tuple[str, str, Any]:
    """(kind, key, pydantic's error) of the error to report: kind is "unknown" (the first unknown key, sorted),
    "missing" (the first missing key in the model's order), "value" (the first bad value in the model's order) or
    "rule" (a model validator's: key is "")."""
    errors = error.errors()
    keyed = [(str(e["loc"][0]) if e["loc"] else "", e) for e in errors]
    unknown = sorted((k, e) for k, e in keyed if e["type"] == "extra_forbidden")
    if unknown:
        return "unknown", unknown[0][0], unknown[0][1]
    order = {k: i for i, k in enumerate(model.model_fields)}
    missing = sorted(((k, e) for k, e in keyed if e["type"] == "missing"), key=lambda x: order.get(x[0], len(order)))
    if missing:
        return "missing", missing[0][0], missing[0][1]
    values = sorted(((k, e) for k, e in keyed if k), key=lambda x: order.get(x[0], len(order)))
    if values:
        return "value", values[0][0], values[0][1]
    return "rule", "", keyed[0][1]


def words(error: Any) -> str:
    """A model validator's own words (what it raised), without pydantic's "Value error, " before them."""
    ctx = error.get("ctx") or {}
    return str(ctx["error"]) if "error" in ctx else error["msg"]
