"""Bodies just off a route's schema: one valid body with one thing made wrong.

A generator of valid bodies never runs the code that refuses an invalid one, and a server's refusals are code too:
a 5xx where a 400 was due, or a refusal that comes after the prompt was processed (the stage the report's crash
needs), is found only by sending what the schema does not allow. One change per body, so an answer says which change
it was: a field dropped, a value of another JSON type, a number at a machine boundary, a list emptied or made long,
a field the schema does not name, another model's name."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

# values of each JSON type, and the numbers where integer and float handling breaks
OTHER_TYPES: tuple[Any, ...] = (None, True, "x", "", [], {}, [None], {"a": 1})
BOUNDARIES: tuple[Any, ...] = (0, -1, 1, 2**31, -(2**31) - 1, 2**63, 1e308, -1e-308, 0.5)
LONG_LIST = 512  # items in a list made long: past every per-request limit vLLM sets by default
SMALL = 2_000  # characters a list may take to be made long (a body stays under a megabyte)
CHANGES = ("drop", "retype", "boundary", "empty", "long", "unknown", "model")


@st.composite
def off_schema(draw, body: dict, required: frozenset[str]) -> dict:
    """``body`` with one change the route's schema does not allow (or allows only at its edge)."""
    out = dict(body)
    fields = sorted(k for k in out if k != "model")
    change = draw(st.sampled_from(CHANGES), label="change")
    if change == "drop" and fields:
        droppable = sorted(required - {"model"} & set(fields)) or fields
        del out[draw(st.sampled_from(droppable), label="dropped")]
    elif change in ("retype", "boundary") and fields:
        name = draw(st.sampled_from(fields), label="field")
        out[name] = draw(st.sampled_from(OTHER_TYPES if change == "retype" else BOUNDARIES), label="value")
    elif change in ("empty", "long") and (lists := [k for k in fields if _short_list(out[k], change)]):
        name = draw(st.sampled_from(lists), label="list")
        out[name] = [] if change == "empty" else (out[name] * LONG_LIST)[:LONG_LIST]
    elif change == "model":
        out["model"] = draw(st.sampled_from(["", "no-such-model", "x" * 300]), label="model")
    else:
        out[draw(st.sampled_from(["extra", "mm_processor_kwargs", "lora_request", "add_generation_prompt"]))] = draw(
            st.sampled_from(OTHER_TYPES + BOUNDARIES[:3]), label="value"
        )
    return out


def _short_list(value: Any, change: str) -> bool:
    return isinstance(value, list) and bool(value) and (change == "empty" or len(json.dumps(value)) < SMALL)
