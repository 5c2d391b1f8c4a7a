"""Request bodies from a route's own JSON Schema (the server's /openapi.json), drawn by Hypothesis.

The scalar and structured parameters (``dimensions``, ``truncate_prompt_tokens``, ``use_activation`` ...) are drawn
from what the server says it takes, by hypothesis-jsonschema, not from a list of ours. The fields that carry the
prompt (``messages``, ``input``, ``queries``/``documents``, ``data_1``/``data_2``, Cohere's ``images``/``inputs``
...) are drawn by media-aware strategies instead, in the shapes the field's own schema admits (a conversation only
where the schema takes one, a content item where it takes ``{"content": [...]}``, a list of URLs where it takes
strings): a generic JSON draw would almost never be a well-formed image, and a request that fails before its
image is processed cannot reach the multimodal cache.

A body is drawn at one of three depths, so that most requests get as far as the image's processing and the effect
of each parameter shows on its own: *minimal* (the required fields and one prompt field), *a few* (that and one or
two optional parameters), or *any* (each optional field present or not, as Hypothesis draws it)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from .media import FORMS, Media

# the fields a media-aware strategy draws, by name (the same names mean the same thing on every pooling route)
MEDIA_FIELDS = frozenset(
    {
        "messages",
        "input",
        "queries",
        "documents",
        "items",
        "query",
        "data_1",
        "data_2",
        "images",
        "inputs",
        "texts",
        "text_1",
        "text_2",
        "data",
    }
)
NEVER = frozenset({"model", "request_id", "priority"})  # ours: the served model, our own ids, the scheduler's class
MINIMAL, FEW, ANY = "minimal", "few", "any"
DEPTHS = (MINIMAL, FEW, ANY)  # Hypothesis starts from the first: minimal bodies first
FEW_MAX = 2  # optional parameters in a body of depth FEW


def _text() -> st.SearchStrategy[str]:
    return st.sampled_from(["a photo", "", "describe it", "x" * 64]) | st.text(max_size=24)


# words in a long text: around and past a small model's length (the tiny models take 4,096 tokens; a word is a token
# or two), so the tokenizer's and the truncation's code runs, not only the short path
LONG_WORDS = (300, 2_000, 4_100, 9_000)


def _long_texts() -> st.SearchStrategy[str]:
    """Texts of a prompt: mostly short, one in four near or past the model's length."""
    long = st.builds(lambda n, w: " ".join([w] * n), st.sampled_from(LONG_WORDS), st.sampled_from(["a", "photo"]))
    return st.one_of(_text(), _text(), _text(), long)


def content(
    images: st.SearchStrategy[Media], with_image: bool = False, texts: st.SearchStrategy[str] | None = None
) -> st.SearchStrategy[list]:
    """A message's content: image parts and text parts in any order, most with an image (with ``with_image``: an
    image, then perhaps a text)."""
    image = st.tuples(images, st.sampled_from(FORMS)).map(lambda x: x[0].as_part(x[0].keyed_form(x[1])))
    text = (texts if texts is not None else _text()).map(lambda t: {"type": "text", "text": t})
    if with_image:
        return st.tuples(image, st.lists(text, max_size=1)).map(lambda x: [x[0], *x[1]])
    return st.lists(st.one_of(image, image, text), min_size=1, max_size=3)


def messages(parts: st.SearchStrategy[list]) -> st.SearchStrategy[list]:
    """A conversation of one or two messages whose contents are drawn from ``parts``."""
    return st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "user", "system"]), "content": parts}),
        min_size=1,
        max_size=2,
    )


def roles(
    schema: Mapping[str, Any], parts: st.SearchStrategy[list], texts: st.SearchStrategy[str]
) -> st.SearchStrategy[list] | None:
    """A conversation of the message kinds a conversation's ``schema`` lists (developer, assistant, tool ...): each
    kind's role and its other fields as the schema draws them (``name``, ``tool_call_id``, ``refusal`` ...), its
    content ours (a text, or parts from ``parts``) where it takes one. None when the schema lists no kind with a
    role. hypothesis-jsonschema cannot draw vLLM's content unions, so a kind is drawn field by field."""
    listed_parts = _part_kinds(schema)
    content = st.one_of(
        texts, parts, *([st.lists(st.one_of(listed_parts), min_size=1, max_size=2)] if listed_parts else [])
    )
    kinds = [
        st.fixed_dictionaries(
            {**fixed, **({"content": content} if takes == "required" else {})},
            optional={**optional, **({"content": content} if takes == "optional" else {})},
        )
        for fixed, optional, takes in _kinds(schema)
    ]
    return st.lists(st.one_of(kinds), min_size=1, max_size=3) if kinds else None


def _conversation(schema: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The member of a prompt field's schema that is a conversation (a list of messages), if any."""
    return next((m for m in _members(schema) if _array_of(m, _is_message)), None)


def _per_schema(build: Callable[[Mapping[str, Any]], Any]) -> Callable[[Mapping[str, Any]], Any]:
    """``build`` run once per schema object (building strategies is the slow part); each schema is kept beside its
    result, so its id is never reused for another."""
    done: dict[int, tuple[Mapping[str, Any], Any]] = {}

    @functools.wraps(build)
    def once(schema: Mapping[str, Any]) -> Any:
        if id(schema) not in done:
            done[id(schema)] = (schema, build(schema))
        return done[id(schema)][1]

    return once


OURS = frozenset({"text", "image_url", "video_url", None})  # the part types content() makes


@_per_schema
def _part_kinds(schema: Mapping[str, Any]) -> list[st.SearchStrategy[dict]]:
    """The content parts a conversation's ``schema`` lists that content() does not make (audio, files, refusals,
    embeddings, thinking ...), each drawn field by field where it can be."""
    found: dict[Any, st.SearchStrategy[dict]] = {}
    for alt in _members(schema.get("items") or {}):
        for c in _members(_props(alt).get("content") or {}):
            for part in _members(c.get("items") or {}) if c.get("type") == "array" else []:
                kind = (_props(part).get("type") or {}).get("const")
                if kind not in OURS and kind not in found and (s := _object(part)) is not None:
                    found[kind] = s
    return list(found.values())


def _object(schema: Mapping[str, Any], depth: int = 2) -> st.SearchStrategy[Any] | None:
    """``schema``'s strategy; an object the schema library cannot draw whole is drawn field by field (``depth``
    levels down), its undrawable optional fields left out; None when a required one cannot be drawn."""
    if (whole := _field(schema)) is not None or depth == 0 or not _props(schema):
        return whole
    required = set(schema.get("required") or ())
    fields = {n: _object(p, depth - 1) for n, p in _props(schema).items()}
    if any(fields[n] is None for n in required if n in fields):
        return None
    return st.fixed_dictionaries(
        {n: s for n, s in fields.items() if n in required and s is not None},
        optional={n: s for n, s in fields.items() if n not in required and s is not None},
    )


@_per_schema
def _kinds(schema: Mapping[str, Any]) -> list[tuple[dict, dict, str]]:
    """Per message kind of a conversation's schema: its fields' strategies, required and optional, but its content,
    and whether it takes content ("required", "optional" or "")."""
    kinds = []
    for alt in _members(schema.get("items") or {}):
        props, required = _props(alt), set(alt.get("required") or ())
        if "role" not in props or (role := _field(props["role"])) is None:
            continue
        fixed: dict[str, Any] = {"role": role}
        optional: dict[str, Any] = {}
        for name, p in props.items():
            if name not in ("role", "content") and (s := _field(p)) is not None:
                (fixed if name in required else optional)[name] = s
        takes = "" if "content" not in props else "required" if "content" in required else "optional"
        if required - {"content"} <= fixed.keys():
            kinds.append((fixed, optional, takes))
    return kinds


# -- the shapes a prompt field's schema admits ------------------------------------------------------------------
def _members(schema: Any) -> list[Mapping[str, Any]]:
    """The alternatives of a schema (anyOf/oneOf members, flattened), without null."""
    if not isinstance(schema, Mapping):
        return []
    alternatives = schema.get("anyOf") or schema.get("oneOf")
    if alternatives:
        return [m for a in alternatives for m in _members(a)]
    return [] if schema.get("type") == "null" else [schema]


def _props(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    return schema.get("properties") or {}


def _is_message(schema: Mapping[str, Any]) -> bool:
    return any("content" in _props(m) and "role" in _props(m) for m in _members(schema))


def _is_item(schema: Mapping[str, Any]) -> bool:  # {"content": [parts]}: a score/rerank/Cohere item
    return any("content" in _props(m) and "role" not in _props(m) for m in _members(schema))


def _array_of(schema: Mapping[str, Any], test: Callable[[Mapping[str, Any]], bool]) -> bool:
    return schema.get("type") == "array" and isinstance(schema.get("items"), Mapping) and test(schema["items"])


def _is_string(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") == "string"


def _free(schema: Mapping[str, Any]) -> bool:
    """A schema that says nothing of its value's shape (``{"title": "Data"}``)."""
    return not any(k in schema for k in ("type", "properties", "items", "enum", "const", "anyOf", "oneOf"))


def _shape(m: Mapping[str, Any]) -> str:
    """The prompt shape one alternative of a field's schema admits."""
    if _free(m):
        return "free"
    if m.get("type") == "array" and not isinstance(m.get("items"), Mapping):
        return "array"  # of anything
    if _array_of(m, lambda i: _array_of(i, _is_message)):
        return "conversations"
    if _array_of(m, _is_message):
        return "conversation"
    if _is_item(m):
        return "item"
    if _array_of(m, _is_item):
        return "items_or_texts" if any(_is_string(x) for x in _members(m["items"])) else "items"
    if _array_of(m, _is_string):
        return "strings"
    return "string" if _is_string(m) else "other"


MEDIA_SHAPES = ("conversation", "conversations", "item", "items", "items_or_texts")
FREE_SHAPES = frozenset({"conversation", "conversations", "item", "items_or_texts", "string"})


def _shapes_of(schema: Mapping[str, Any]) -> set[str]:
    found = {_shape(m) for m in (_members(schema) or [{}])}
    if "array" in found:
        found |= {"conversation", "conversations", "items_or_texts"}
    return set(FREE_SHAPES) if "free" in found else found


def carries_media(name: str, schema: Mapping[str, Any]) -> bool:
    """Whether prompt field ``name`` can carry an image, by its schema."""
    return name == "images" or bool(_shapes_of(schema) & set(MEDIA_SHAPES))


def shapes(
    name: str,
    schema: Mapping[str, Any],
    images: st.SearchStrategy[Media],
    media_only: bool = False,
    texts: st.SearchStrategy[str] | None = None,
) -> list[st.SearchStrategy[Any]]:
    """Strategies for the values of prompt field ``name`` that its ``schema`` admits, those that carry images first
    and twice (Hypothesis starts from the first); with ``media_only``, only those, each carrying an image. A field
    whose schema says nothing of its shape takes any of them. ``texts``: the texts drawn (short ones by default)."""
    text = texts if texts is not None else _text()
    parts = content(images, with_image=media_only, texts=text)
    convo, item = messages(parts), st.fixed_dictionaries({"content": parts})
    found = _shapes_of(schema)
    listed = _conversation(schema)
    if not media_only and listed is not None and (kinds := roles(listed, parts, text)) is not None:
        convo = st.one_of(convo, kinds)  # ours first: Hypothesis starts from the first
    urls = st.lists(images.map(lambda x: x.url), min_size=1, max_size=2)
    made = {
        "conversation": convo,
        "conversations": st.lists(convo, min_size=1, max_size=3),
        "item": item,
        "items": st.lists(item, min_size=1, max_size=2),
        "items_or_texts": st.lists(item if media_only else st.one_of(item, text), min_size=1, max_size=2),
    }
    media = [made[k] for k in MEDIA_SHAPES if k in found] + ([urls] if name == "images" else [])
    if media_only and media:
        return media
    rest: list[st.SearchStrategy[Any]] = []
    if "strings" in found and name != "images":
        rest.append(st.lists(text, min_size=1, max_size=2))
    rest += [text] if "string" in found else []
    # a shape none of ours fits (token ids, say): as the schema library draws it
    return media + media + rest or [_field(schema) or st.nothing()]


def _field(schema: Mapping[str, Any]) -> st.SearchStrategy[Any] | None:
    """The field's strategy, or None when the library cannot draw from its schema (tried once: hypothesis-jsonschema
    0.23 cannot draw free-form objects with the Hypothesis we pin, e.g. ``mm_processor_kwargs``)."""
    try:
        strategy = from_schema(dict(schema))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            strategy.example()
    except Exception:
        return None
    return strategy


@dataclass
class Form:
    """One body form of a route, its fields' strategies built once (building them is the slow part)."""

    model: str
    required: frozenset[str]
    fields: dict[str, st.SearchStrategy[Any]]  # generated from the schema
    prompts: dict[str, Mapping[str, Any]]  # the prompt fields, drawn by the media-aware strategies, and their schema

    @property
    def takes_media(self) -> bool:
        return any(carries_media(n, s) for n, s in self.prompts.items())

    def bodies(
        self, images: st.SearchStrategy[Media], depth: str = ANY, media_only: bool = False
    ) -> st.SearchStrategy[dict]:
        """Bodies of this form whose images are drawn from ``images``, at ``depth`` (MINIMAL, FEW or ANY); with
        ``media_only``, each prompt field that can carry an image carries one."""
        return self._bodies(images, depth, media_only, None)

    def text_bodies(self) -> st.SearchStrategy[dict]:
        """Bodies without media, any optional field, texts up to past the model's length: fast requests that run
        the validation, tokenizing and truncation code an image request passes by."""
        return self._bodies(st.nothing(), ANY, False, _long_texts())

    def _bodies(
        self, images: st.SearchStrategy[Media], depth: str, media_only: bool, texts: st.SearchStrategy[str] | None
    ) -> st.SearchStrategy[dict]:
        def prompt(n: str) -> st.SearchStrategy[Any]:
            media_field = media_only and carries_media(n, self.prompts[n])
            return st.one_of(shapes(n, self.prompts[n], images, media_field, texts))

        text_only = texts is not None
        # a field that takes only image URLs (Cohere's ``images``) has no text form
        prompts = [n for n in self.prompts if not (text_only and n == "images")]
        required_prompts = [n for n in prompts if n in self.required]
        # a form that needs no prompt field (Cohere's: exactly one of texts, images, inputs) gets one; media first
        optional_prompts = sorted(
            (n for n in prompts if n not in self.required),
            key=lambda n: not carries_media(n, self.prompts[n]),
        )
        base = {n: v for n, v in self.fields.items() if n in self.required}
        optional = {n: v for n, v in self.fields.items() if n not in self.required}

        @st.composite
        def draw(take) -> dict:
            body: dict[str, Any] = {"model": self.model}
            for n in required_prompts:
                body[n] = take(prompt(n))
            if not required_prompts and optional_prompts:
                media = [n for n in optional_prompts if carries_media(n, self.prompts[n])]
                n = take(st.sampled_from(media if media_only and media else optional_prompts))
                body[n] = take(prompt(n))
            for n, strategy in base.items():
                body[n] = take(strategy)
            if depth == ANY:
                body.update(take(st.fixed_dictionaries({}, optional=optional)))
            elif depth == FEW and optional:
                for n in take(st.lists(st.sampled_from(sorted(optional)), min_size=1, max_size=FEW_MAX, unique=True)):
                    body[n] = take(optional[n])
            return body

        return draw()


def form(schema: Mapping[str, Any], model: str, skipped: Callable[[str], None] = lambda name: None) -> Form:
    """The form of one object schema of a route, for ``model``; ``skipped`` hears of each field the schema library
    cannot draw from (it is left out, and the hunt says so)."""
    props: Mapping[str, Any] = schema.get("properties") or {}
    fields: dict[str, st.SearchStrategy[Any]] = {}
    prompts: dict[str, Mapping[str, Any]] = {}
    for name, field_schema in props.items():
        if name in NEVER:
            continue
        if name in MEDIA_FIELDS:
            prompts[name] = field_schema if isinstance(field_schema, Mapping) else {}
        elif (strategy := _field(field_schema)) is not None:
            fields[name] = strategy
        else:
            skipped(name)
    for prompt in prompts.values():
        # built now, outside any draw: _field tries each strategy with .example(), which Hypothesis refuses inside
        # a draw, so a first build during a case would find no kind drawable, and keep that
        if (listed := _conversation(prompt)) is not None:
            _kinds(listed)
            _part_kinds(listed)
    return Form(model, frozenset(schema.get("required") or ()), fields, prompts)
