"""The surface of a server's API: each value the schema names for each field of each route, each pair of values of
two enumerated fields, each message kind and content-part kind a conversation lists, each as one text-only body.

A case draws its bodies at random, and a few dozen cases meet few of a route's options: the encoding of an answer
(``encoding_format`` x ``embed_dtype`` x ``endianness``), a pooling ``task``, Cohere's ``embedding_types``, a
message of a tool or a part of audio. A schema-driven tool reaches them by sending thousands of requests; here the
hunt's ``sweep`` rule sends each once, a burst at a time, so the oracles judge every one and the cases spend their
time on what needs media, hang-ups and concurrency. Deterministic: a hunt run again resumes where it stopped."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import bodies

TEXT = "a photo"
NUMBERS = (0, 1, -1)  # besides the schema's own bounds
PAIR_VALUES = 8  # an enumerated field with more values than this is swept alone, not in pairs


@dataclass(frozen=True)
class Point:
    path: str
    label: str  # what the body tries: "encoding_format=base64", "message kind tool", "part kind input_audio"
    body: dict
    sets: dict  # what it sets on the route's simplest body: one field, two, or a conversation of one kind

    @property
    def pair(self) -> bool:  # two fields' values together
        return len(self.sets) == 2


def _json(v: Any) -> str:
    return json.dumps(v, sort_keys=True)


def _nullable(schema: Mapping[str, Any]) -> bool:
    alts = schema.get("anyOf") or schema.get("oneOf") or []
    t = schema.get("type")
    return any(isinstance(a, Mapping) and a.get("type") == "null" for a in alts) or (
        isinstance(t, list) and "null" in t
    )


def values(schema: Mapping[str, Any]) -> list[Any]:
    """The values a field's ``schema`` names or bounds: its enum's members and consts, both booleans, an integer or
    number at each stated bound and 0, 1, -1 within them, an empty and a short string, a one-item list of each
    member of a list's enum, and null where it is allowed. A free object or list names none."""
    out: list[Any] = []
    for m in bodies._members(schema):
        t = m.get("type")
        if "const" in m:
            out.append(m["const"])
        elif "enum" in m:
            out += list(m["enum"])
        elif t == "boolean":
            out += [True, False]
        elif t in ("integer", "number"):
            lo, hi = m.get("minimum"), m.get("maximum")
            out += [
                x for x in (lo, hi, *NUMBERS) if x is not None and (lo is None or x >= lo) and (hi is None or x <= hi)
            ]
            out += [0.5] if t == "number" else []
        elif t == "string":
            out += ["", "x"]
        elif t == "array" and isinstance(m.get("items"), Mapping):
            out += [[v] for v in values(m["items"]) if not isinstance(v, (list, dict))]
    out += [None] if _nullable(schema) else []
    return list({_json(v): v for v in out}.values())


def example(schema: Mapping[str, Any], depth: int = 4) -> Any:
    """One simple value of ``schema``: its first const or enum member, its required fields, a list of one item."""
    members = bodies._members(schema)
    if not members or depth == 0:
        return "x"
    m = members[0]
    if "const" in m:
        return m["const"]
    if "enum" in m:
        return m["enum"][0]
    t = m.get("type")
    if t == "object" or bodies._props(m):
        return {n: example(p, depth - 1) for n, p in bodies._props(m).items() if n in set(m.get("required") or ())}
    if t == "array":
        items = m.get("items")
        return [example(items, depth - 1)] if isinstance(items, Mapping) else []
    return {"integer": 0, "number": 0.0, "boolean": False}.get(t, "x") if isinstance(t, str) else "x"


PROMPTS: dict[
    str, Any
] = {  # a prompt field's simplest text, by the shape its schema admits (bodies._shape), first first
    "string": TEXT,
    "conversation": [{"role": "user", "content": TEXT}],
    "strings": [TEXT],
    "item": {"content": [{"type": "text", "text": TEXT}]},
    "items_or_texts": [TEXT],
    "conversations": [[{"role": "user", "content": TEXT}]],
    "items": [{"content": [{"type": "text", "text": TEXT}]}],
    "free": TEXT,
}


def _prompt(schema: Mapping[str, Any]) -> Any:
    shapes = bodies._shapes_of(schema)
    return next((v for s, v in PROMPTS.items() if s in shapes), None)


def base(schema: Mapping[str, Any], model: str) -> tuple[dict, str | None] | None:
    """The simplest text-only body of a body form's ``schema`` and the conversation field it carries, if any; None
    when a required field takes no text."""
    props, required = bodies._props(schema), set(schema.get("required") or ())
    body: dict[str, Any] = {"model": model}
    prompts = [n for n in props if n in bodies.MEDIA_FIELDS and n != "images"]
    for n in [n for n in prompts if n in required] or prompts[:1]:
        if (text := _prompt(props[n])) is None:
            return None
        body[n] = text
    for n in required - body.keys() - bodies.NEVER:
        body[n] = example(props[n])
    conversation = next((n for n in body if bodies._conversation(props.get(n) or {}) is not None), None)
    return body, conversation


def _kinds(conversation: Mapping[str, Any]) -> Iterator[tuple[str, list]]:
    """Each message kind and each content-part kind ``conversation`` (a list-of-messages schema) lists, as a
    conversation that holds it (a user's text after a message of another kind)."""
    user = {"role": "user", "content": TEXT}
    seen: set[str] = set()
    for alt in bodies._members(conversation.get("items") or {}):
        props = bodies._props(alt)
        if "role" not in props:
            continue
        message = example(alt)
        if "content" in props:
            message["content"] = TEXT
        role = str(message.get("role"))
        if role not in seen:
            seen.add(role)
            yield f"message kind {role}", [message] if role == "user" else [message, user]
        for c in bodies._members(props.get("content") or {}):
            for part in bodies._members(c.get("items") or {}) if c.get("type") == "array" else []:
                kind = (bodies._props(part).get("type") or {}).get("const")
                if kind is not None and f"part:{kind}" not in seen:
                    seen.add(f"part:{kind}")
                    yield (
                        f"part kind {kind}",
                        [{"role": "user", "content": [example(part), {"type": "text", "text": TEXT}]}],
                    )


def points(routes: Sequence[tuple[str, Mapping[str, Any]]], model: str) -> list[Point]:
    """The surface of ``routes`` (a route's path and one body form's schema each, as the hunt builds its forms):
    per route, each field value and each pair of two enumerated fields' values once (on the first form that has
    the fields), and each message and part kind once. In the order they are swept: every route's single values and
    kinds before any pair, the routes in turn."""
    out: dict[tuple[str, str], Point] = {}
    for path, schema in routes:
        built = base(schema, model)
        if built is None:
            continue
        body, conversation = built
        fields = {
            n: vs
            for n, p in bodies._props(schema).items()
            if n not in bodies.NEVER and n not in bodies.MEDIA_FIELDS and n != "model" and (vs := values(p))
        }
        for n, vs in fields.items():
            for v in vs:
                out.setdefault((path, f"{n}={_json(v)}"), Point(path, f"{n}={_json(v)}", {**body, n: v}, {n: v}))
        paired = [n for n, vs in fields.items() if _enumerated(bodies._props(schema)[n]) and len(vs) <= PAIR_VALUES]
        for a, b in itertools.combinations(paired, 2):
            for va, vb in itertools.product(fields[a], fields[b]):
                label = f"{a}={_json(va)} {b}={_json(vb)}"
                out.setdefault((path, label), Point(path, label, {**body, a: va, b: vb}, {a: va, b: vb}))
        if conversation is not None:
            listed = bodies._conversation(bodies._props(schema)[conversation])
            assert listed is not None
            for label, messages in _kinds(listed):
                value = [messages] if _nested(body[conversation]) else messages
                out.setdefault((path, label), Point(path, label, {**body, conversation: value}, {conversation: value}))
    return _in_turn([p for p in out.values() if not p.pair]) + _in_turn([p for p in out.values() if p.pair])


def _in_turn(points: list[Point]) -> list[Point]:
    """``points``, one route's then the next's, in turn."""
    by_route: dict[str, list[Point]] = {}
    for p in points:
        by_route.setdefault(p.path, []).append(p)
    return [p for row in itertools.zip_longest(*by_route.values()) for p in row if p is not None]


def _enumerated(schema: Mapping[str, Any]) -> bool:
    return any("enum" in m or "enum" in (m.get("items") or {}) for m in bodies._members(schema))


def _nested(conversation: Any) -> bool:  # a list of conversations (a batch), not one
    return isinstance(conversation, list) and bool(conversation) and isinstance(conversation[0], list)


@dataclass
class Surface:
    """The points a hunt sweeps, in order, and how many it has sent."""

    points: list[Point] = field(default_factory=list)
    swept: int = 0

    @property
    def left(self) -> int:
        return len(self.points) - self.swept

    def take(self, n: int) -> list[Point]:
        taken = self.points[self.swept : self.swept + n]
        self.swept += len(taken)
        return taken
