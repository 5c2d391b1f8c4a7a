"""When two answers must be the same, defined once: what makes two inputs the same, how close two embeddings of one
input must be (bf16), and when distinct inputs answering one vector is a collapse. The wrong-answer oracle of the
Locust mix (``locustfiles/plugin/consistency.py``) and the hunt's oracles use these rules.

An *input* is what one answer (one embedding) is computed from: the route's kind of answer, the model, the prompt
(a text, token ids, or a chat conversation: roles, texts and each media item by the hash of its content, in order)
and every request parameter that changes an answer. Forms that say the same thing share a key: a conversation in
``messages``, in ``input`` (vLLM >= 0.32), as one item of a batch of conversations, or a Cohere ``/v2/embed``
``inputs`` item (vLLM builds the same conversation from it); a text alone, in a list of texts. A parameter is
assumed to change the answer unless it is listed in :data:`IGNORED` (how the answer is written or scheduled): an
unknown field can only split keys apart, never make two different inputs look the same. A default written out
(``"normalize": true``) is another key than the field left out: the server's defaults depend on the model.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

# Same input asked again: the answers' cosine is at least this. bf16 keeps 8 bits of mantissa, so a value rounds by
# up to 2^-9 relative; batching or another kernel order moves a 64-dim normalised vector by a cosine of ~1e-5, and
# a wrong answer (another input's vector) sits far below.
COSINE_MIN = 0.999
# Distinct inputs whose answers agree this closely are one vector answered twice (the CLIP collapse upstream): above
# the closest two distinct images of the pool measured on the real engine, and above the noise of one input.
COLLAPSE_COSINE = 0.99999
# Two scores (a similarity in [-1, 1], or a reranker's relevance) of the same pair agree within this: bf16's rounding
# of a cosine near 1 (2^-9), with room for another kernel order.
SCORE_ATOL = 5e-3

# Fields that say how an answer is written or when it is scheduled, not what it is.
IGNORED = frozenset(
    {
        "encoding_format",
        "embed_dtype",
        "endianness",
        "embedding_types",  # the answer's encoding
        "user",
        "priority",
        "request_id",
        "cache_salt",  # who asks, when, and which prefix-cache pool
    }
)
# The kind of answer each route gives (routes giving the same kind of answer from the same input agree)
ANSWER_KINDS = {"/v1/embeddings": "embed", "/v2/embed": "embed"}
# Cohere's /v2/embed names of the OpenAI parameters
COHERE_PARAMS = {"output_dimension": "dimensions"}
MEDIA_PARTS = ("image_url", "video_url", "audio_url", "input_audio", "image_embeds")


def content_hash(data: bytes) -> str:
    """The hash the requests table keeps of a media item (sha256[:16] of its encoded bytes, as payloads.pool)."""
    return hashlib.sha256(data).hexdigest()[:16]


def media_hash(url: str) -> str:
    """A media URL's content hash: a data URL's decoded bytes, any other URL's text."""
    if url.startswith("data:") and "," in url:
        head, _, data = url.partition(",")
        try:
            raw = (
                base64.b64decode(data, validate=True)
                if head.endswith(";base64")
                else urllib.parse.unquote_to_bytes(data)
            )
            return content_hash(raw)
        except ValueError:
            pass
    return content_hash(url.encode("utf-8", "surrogatepass"))


class _Media:
    """Hands out the media hashes of a body in the order its items appear (the order the recorder stores them)."""

    def __init__(self, hashes: Sequence[str]):
        self.hashes, self.used = list(hashes), 0

    def next(self, url: Any) -> str:
        self.used += 1
        if self.used <= len(self.hashes):
            return self.hashes[self.used - 1]
        return media_hash(url) if isinstance(url, str) else content_hash(_canonical(url).encode())


def _part(part: Any, media: _Media) -> list:
    if isinstance(part, str):
        return ["text", part]
    if not isinstance(part, Mapping):
        return ["other", part]
    kind = part.get("type")
    if kind == "text":
        return ["text", part.get("text")]
    for name in MEDIA_PARTS:
        if name in part:
            value = part[name]
            url = value.get("url", value.get("data", value)) if isinstance(value, Mapping) else value
            return ["media", name, media.next(url)]
    return ["other", {k: v for k, v in part.items() if k != "uuid"}]


def _conversation(messages: Sequence[Any], media: _Media) -> list:
    out = []
    for m in messages:
        if not isinstance(m, Mapping):
            out.append(["other", m])
            continue
        content = m.get("content")
        parts = [content] if isinstance(content, str) else content or []
        out.append([m.get("role"), _parts(parts, media)])
    return out


def _parts(parts: Sequence[Any], media: _Media) -> list:
    # an empty text part renders to nothing: the same prompt as without it
    return [x for x in (_part(p, media) for p in parts) if x != ["text", ""]]


def _is_message(x: Any) -> bool:
    return isinstance(x, Mapping) and "role" in x


def _prompts(path: str, body: Mapping[str, Any], media: _Media) -> Iterator[list]:
    """Each input of the body, canonical (one per answer), in the order the body lists them."""
    if "messages" in body:
        msgs = body["messages"]
        if msgs and all(isinstance(c, list) for c in msgs):  # a batch of conversations
            for conv in msgs:
                yield ["chat", _conversation(conv, media)]
        else:
            yield ["chat", _conversation(msgs, media)]
    elif path == "/v2/embed" and any(k in body for k in ("images", "inputs", "texts")):
        yield from _cohere(body, media)
    elif "input" in body:
        inp = body["input"]
        if isinstance(inp, str):
            yield ["text", inp]
        elif inp and all(_is_message(m) for m in inp):
            yield ["chat", _conversation(inp, media)]
        elif inp and all(isinstance(c, list) and c and all(_is_message(m) for m in c) for c in inp):
            for conv in inp:
                yield ["chat", _conversation(conv, media)]
        elif inp and all(isinstance(t, int) for t in inp):
            yield ["tokens", list(inp)]
        else:
            for item in inp or []:
                yield ["text", item] if isinstance(item, str) else ["tokens", item]
    else:  # a form not known here: the whole body (its media hashed) is one input
        yield ["body", _with_media(dict(body), media)]


def _cohere(body: Mapping[str, Any], media: _Media) -> Iterator[list]:
    # vLLM (0.32 embed/io_processor.py) makes each image and each `inputs` item a user message, after a system
    # message of the input_type's task prefix when the model defines one; texts without a prefix are plain prompts
    system = [["input_type", body["input_type"]]] if body.get("input_type") is not None else []
    if body.get("images") is not None:
        for url in body["images"]:
            yield ["chat", system + [["user", [["media", "image_url", media.next(url)]]]]]
    elif body.get("inputs") is not None:
        for item in body["inputs"]:
            content = item.get("content", []) if isinstance(item, Mapping) else []
            yield ["chat", system + [["user", _parts(content, media)]]]
    else:
        for text in body.get("texts") or []:
            yield ["chat", system + [["user", [["text", text]]]]] if system else ["text", text]


def _with_media(node: Any, media: _Media) -> Any:
    if isinstance(node, Mapping):
        return {
            k: (["media", media.next(v)] if k == "url" and isinstance(v, str) else _with_media(v, media))
            for k, v in node.items()
            if k not in IGNORED
        }
    if isinstance(node, list):
        return [_with_media(v, media) for v in node]
    return node


_INPUT_FIELDS = ("messages", "input", "model", "images", "inputs", "texts")


def _params(path: str, body: Mapping[str, Any]) -> dict:
    out = {}
    for k, v in body.items():
        if k in IGNORED or k in _INPUT_FIELDS:
            continue
        out[COHERE_PARAMS.get(k, k) if path == "/v2/embed" else k] = v
    return out


def _canonical(x: Any) -> str:
    return json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _key(x: Any) -> str:
    return hashlib.sha256(_canonical(x).encode("utf-8", "surrogatepass")).hexdigest()[:32]


def input_keys(endpoint: str, body: Mapping[str, Any], image_hashes: Sequence[str] = ()) -> list[str]:
    """One key per answer the body asks for, in the order the answers come back. ``image_hashes``: the content
    hashes of the body's media items in the order they appear (as the requests table keeps them); items beyond
    them are hashed from their URLs (:func:`media_hash`)."""
    path = urllib.parse.urlsplit(endpoint).path or endpoint
    if not isinstance(body, Mapping):
        return [_key(["body", path, body])]
    media = _Media(image_hashes)
    prompts = list(_prompts(path, body, media))
    if media.used < len(media.hashes):
        raise ValueError(f"{len(media.hashes)} media hashes given for a body of {media.used} media items")
    head = [ANSWER_KINDS.get(path, path), body.get("model"), _params(path, body)]
    return [_key([*head, p]) for p in prompts]


def input_key(endpoint: str, body: Mapping[str, Any], image_hashes: Sequence[str] = ()) -> str:
    """What makes two requests the same: the key of their one input (:func:`input_keys`), or of all their inputs
    in order when they ask for several."""
    keys = input_keys(endpoint, body, image_hashes)
    return keys[0] if len(keys) == 1 else _key(keys)


def cosine(a: ArrayLike, b: ArrayLike) -> float:
    """Cosine similarity; nan when the lengths differ or a value is not finite; 1 for two zero vectors."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or not (np.isfinite(x).all() and np.isfinite(y).all()):
        return math.nan
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx == 0 or ny == 0:
        return 1.0 if nx == ny else 0.0
    return float(np.dot(x, y) / (nx * ny))


def agree(a: ArrayLike, b: ArrayLike) -> bool:
    """Two answers to the same input are the same answer (within bf16's rounding)."""
    return cosine(a, b) >= COSINE_MIN  # nan compares false: a vector of another length never agrees


def collapsed(a: ArrayLike, b: ArrayLike) -> bool:
    """Two answers to distinct inputs are one vector."""
    return cosine(a, b) >= COLLAPSE_COSINE


_DTYPES = {"float32": "f4", "float16": "f2"}


def _decode(text: str, body: Mapping[str, Any]) -> np.ndarray:
    raw = base64.b64decode(text)
    dtype, order = body.get("embed_dtype") or "float32", body.get("endianness") or "native"
    prefix = {"little": "<", "big": ">"}.get(order, "=")
    if dtype == "bfloat16":  # the high half of a float32
        halves = np.frombuffer(raw, dtype=prefix + "u2").astype(np.uint32)
        return (halves << 16).view(np.float32)
    if dtype not in _DTYPES:
        raise ValueError(f"embed_dtype {dtype!r} is not decoded here")
    return np.frombuffer(raw, dtype=prefix + _DTYPES[dtype]).astype(np.float32)


def vectors(answer: Mapping[str, Any], body: Mapping[str, Any] | None = None) -> list[np.ndarray]:
    """The embeddings of an answer, in the order of the inputs (``data[i].index``), floats or base64 (the request
    ``body`` says how base64 was written); Cohere's ``embeddings.float``. ValueError on anything else."""
    body = body or {}
    if isinstance(answer.get("data"), list):
        items = sorted(answer["data"], key=lambda d: d.get("index", 0))
        out = []
        for d in items:
            e = d.get("embedding", d.get("data"))
            out.append(_decode(e, body) if isinstance(e, str) else np.asarray(e, dtype=np.float32).ravel())
        return out
    by_type = answer.get("embeddings")
    if isinstance(by_type, Mapping) and by_type.get("float") is not None:
        return [np.asarray(e, dtype=np.float32) for e in by_type["float"]]
    raise ValueError("no embeddings in the answer")


def scores(answer: Mapping[str, Any]) -> list[float]:
    """The scores of a /score or /rerank answer, in the order of the pairs or documents (``index``): ``data[i].score``
    or ``results[i].relevance_score``. ValueError on anything else."""
    if isinstance(answer.get("data"), list) and answer["data"] and "score" in answer["data"][0]:
        items, field = answer["data"], "score"
    elif isinstance(answer.get("results"), list) and answer["results"]:
        items, field = answer["results"], "relevance_score"
    else:
        raise ValueError("no scores in the answer")
    return [float(d[field]) for d in sorted(items, key=lambda d: d.get("index", 0))]


def scores_agree(a: float, b: float) -> bool:
    """Two scores of the same pair are the same answer (within bf16's rounding)."""
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= SCORE_ATOL
