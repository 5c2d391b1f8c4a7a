"""Request bodies from a route's own JSON Schema (the server's /openapi.json), drawn by Hypothesis.

Every field of the body form the draw picks is generated from its schema by hypothesis-jsonschema — the scalar and
structured parameters (``dimensions``, ``truncate_prompt_tokens``, ``mm_processor_kwargs`` ...) come from what the
server says it takes, not from a list of ours. The fields vLLM reads as media or prompts (``messages``, ``input``,
``queries``/``documents``, ``data_1``/``data_2``, Cohere's ``images``/``inputs``) are drawn by our media-aware
strategies instead: a generic JSON draw would almost never be a well-formed image, and a request that fails before
its image is processed cannot reach the cache. Optional fields are present or not as Hypothesis draws them
(``fixed_dictionaries(optional=...)``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from .hunt_media import Media

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


def _text() -> st.SearchStrategy[str]:
    return st.sampled_from(["a photo", "", "describe it", "x" * 64]) | st.text(max_size=24)


def content(images: st.SearchStrategy[Media]) -> st.SearchStrategy[list]:
    """A message's content: image parts and text parts in any order, most with an image."""
    part = st.one_of(
        images.map(lambda m: {"type": "image_url", "image_url": {"url": m.url}}),
        images.map(lambda m: {"type": "image_url", "image_url": {"url": m.url}}),
        _text().map(lambda t: {"type": "text", "text": t}),
    )
    return st.lists(part, min_size=1, max_size=3)


def messages(images: st.SearchStrategy[Media]) -> st.SearchStrategy[list]:
    return st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "user", "system"]), "content": content(images)}),
        min_size=1,
        max_size=2,
    )


def _media_value(name: str, images: st.SearchStrategy[Media], batch: bool) -> st.SearchStrategy[Any]:
    convo = messages(images)
    if name == "messages":
        return st.lists(convo, min_size=1, max_size=3) if batch else convo
    if name == "images":
        return st.lists(images.map(lambda m: m.url), min_size=1, max_size=2)
    if name == "inputs":  # Cohere: items of content parts
        return st.lists(st.fixed_dictionaries({"content": content(images)}), min_size=1, max_size=2)
    if name in ("texts", "text_1", "text_2"):
        return st.lists(_text(), min_size=1, max_size=2) if name == "texts" else _text()
    multimodal = st.fixed_dictionaries({"content": content(images)})
    # media first: Hypothesis starts from the first branch, and a prompt without an image cannot reach the cache
    if name in ("query", "data_1"):
        return st.one_of(multimodal, _text())
    if name == "input":
        return st.one_of(convo, _text(), st.lists(_text(), min_size=1, max_size=2))
    return st.one_of(multimodal, st.lists(st.one_of(multimodal, _text()), min_size=1, max_size=2))


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
    media: tuple[str, ...]  # drawn by the media-aware strategies
    batch: bool

    def bodies(self, images: st.SearchStrategy[Media]) -> st.SearchStrategy[dict]:
        """Bodies of this form whose media are drawn from ``images``; optional fields present or not, as
        Hypothesis draws them."""
        chosen = {**self.fields, **{n: _media_value(n, images, self.batch) for n in self.media}}
        required = {n: v for n, v in chosen.items() if n in self.required}
        optional = {n: v for n, v in chosen.items() if n not in self.required}
        return st.fixed_dictionaries({"model": st.just(self.model), **required}, optional=optional)


def form(schema: Mapping[str, Any], model: str, skipped: Callable[[str], None] = lambda name: None) -> Form:
    """The form of one object schema of a route, for ``model``; ``skipped`` hears of each field the schema library
    cannot draw from (it is left out, and the hunt says so)."""
    props: Mapping[str, Any] = schema.get("properties") or {}
    fields: dict[str, st.SearchStrategy[Any]] = {}
    media = []
    for name, field_schema in props.items():
        if name in NEVER:
            continue
        if name in MEDIA_FIELDS:
            media.append(name)
        elif (strategy := _field(field_schema)) is not None:
            fields[name] = strategy
        else:
            skipped(name)
    return Form(
        model, frozenset(schema.get("required") or ()), fields, tuple(media), "Batch" in str(schema.get("title", ""))
    )
