"""Request builders for vLLM's OpenAI-compatible pooling endpoints.

Every builder returns a :class:`BuiltRequest` ``(path, body, meta)``: the endpoint path, the JSON body as a
dict, and :class:`RequestMeta` (kind, image ids and hashes, ...) whose :meth:`~RequestMeta.columns` are the
REQUESTS-table columns of :mod:`mmchaos.schema` (pass ``built.context()`` as Locust's request ``context``).

Shapes (vLLM 0.30 ``entrypoints/pooling/embed/protocol.py``):

* image (+ text): chat form, ``{"model", "messages": [system?, user], "encoding_format"}``; the user
  message's content lists the ``image_url`` parts (base64 data URLs) then the text part;
  Qwen3-VL-Embedding style: the instruction is a system message (default ``"Represent the user's input."``;
  ``instruction=None`` leaves it out).
* text only: completion form, ``{"model", "input": str | [str, ...], "encoding_format"}``.
* batch (several inputs in one request): ``"messages"`` is a list of conversations -- vLLM's
  ``EmbeddingBatchChatRequest`` (present in 0.30; older servers that only know ``EmbeddingChatRequest``
  reject it with a 400, which is itself worth recording).
* ``/tokenize``: ``{"model", "messages", "add_generation_prompt": false}`` -- the same conversation as the
  embedding request, rendered but never run.
* video (+ text): the chat form with ``video_url`` parts (data URLs, or file URLs the server may read).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from mmchaos import sameness, schema
from mmchaos.options import DEFAULT_INSTRUCTION

from .pool import DataURL, PoolImage
from .video import Video

EMBEDDINGS_PATH = "/v1/embeddings"
TOKENIZE_PATH = "/tokenize"
ENCODING_FORMATS = ("float", "base64")


@dataclass(frozen=True)
class RequestMeta:
    kind: str  # one of mmchaos.schema.KINDS
    image_ids: tuple[str, ...] = ()
    image_hashes: tuple[str, ...] = ()
    video_hashes: tuple[str, ...] = ()  # the videos' (payloads.video.digest), in order
    n_inputs: int = 1  # embeddings asked for (batch size; text list length)
    case: str | None = None  # malformed case name
    expected_status: int | None = None  # malformed cases: the status the catalogue expects

    def __post_init__(self) -> None:
        if self.kind not in schema.KINDS:
            raise ValueError(f"kind {self.kind!r} is not one of {schema.KINDS}")

    @property
    def n_images(self) -> int:
        return len(self.image_ids)

    def columns(self) -> dict[str, Any]:
        """This request's REQUESTS-table columns (ids and hashes comma-joined, as the schema stores them)."""
        return {
            "kind": self.kind,
            "case": self.case,
            "expected_status": self.expected_status,
            "n_images": self.n_images,
            "image_ids": ",".join(self.image_ids) or None,
            "image_hashes": ",".join(self.image_hashes) or None,
            "n_videos": len(self.video_hashes),
            "video_hashes": ",".join(self.video_hashes) or None,
        }


class BuiltRequest(NamedTuple):
    path: str
    body: dict
    meta: RequestMeta

    def payload(self) -> bytes:
        """The body as sent: compact JSON."""
        return encode_body(self.body)

    def template(self) -> tuple[bytes, list[DataURL]]:
        """The body as sent, split into its image URLs and the rest (:func:`body_template`)."""
        return body_template(self.body)

    def context(self, **extra: Any) -> dict[str, Any]:
        """Locust request context for the recorder: the meta columns, ``request_bytes``, and ``extra``."""
        return {**self.meta.columns(), "request_bytes": len(self.payload()), **extra}


@dataclass(frozen=True)
class EmbedInput:
    """One input of a batch: its images (in order) and optional text."""

    images: Sequence[PoolImage] = ()
    text: str | None = None


def encode_body(body: Mapping[str, Any]) -> bytes:
    """The body as compact JSON, UTF-8: exactly ``json.dumps(body, separators=(",", ":"), ensure_ascii=False)``.

    Image data URLs (:class:`.pool.DataURL`, ~99 % of a body's bytes) need no escaping: they are
    swapped for a placeholder, the small rest is serialised, and the URLs are copied in as bytes -- instead of
    JSON scanning ~100 kB of base64 per request."""
    return fill_template(*body_template(body))


def body_template(body: Mapping[str, Any]) -> tuple[bytes, list[DataURL]]:
    """The body as sent, split: the JSON with each :class:`.pool.DataURL` replaced by :data:`URL_SLOT`, and the
    URLs in order. ``fill_template`` joins them again, byte for byte (a trace keeps the two apart)."""
    urls: list[DataURL] = []
    skeleton = _swap_urls(body, urls)
    if not urls:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8"), []
    template = json.dumps(skeleton, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if template.count(URL_SLOT) != len(urls):  # the placeholder text also occurs in the request itself
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8"), []
    return template, urls


def slot_hashes(urls: Sequence[DataURL]) -> list[str]:
    """The content hash of each URL slot of a template, in order (what makes two inputs the same to the
    wrong-answer oracle: mmchaos.sameness): a pool image's own, any other URL's (a video's) from its bytes."""
    return [getattr(getattr(u, "ref", None), "hash", None) or sameness.media_hash(u) for u in urls]


def fill_template(template: bytes, urls: Sequence[str]) -> bytes:
    if not urls:
        return template
    parts = template.split(URL_SLOT)
    out = [parts[0]]
    for url, part in zip(urls, parts[1:]):
        out.append(url.encode("ascii"))
        out.append(part)
    return b"".join(out)


_URL_SLOT_TEXT = "\x01mmchaos-data-url\x01"
URL_SLOT = json.dumps(_URL_SLOT_TEXT, ensure_ascii=False)[1:-1].encode("utf-8")  # as it appears when serialised


def _swap_urls(node: Any, urls: list[DataURL]) -> Any:
    if isinstance(node, DataURL):
        urls.append(node)
        return _URL_SLOT_TEXT
    if type(node) is dict:
        return {k: _swap_urls(v, urls) for k, v in node.items()}
    if type(node) is list:
        return [_swap_urls(v, urls) for v in node]
    return node


def image_beside_text(node: Any) -> bool:
    """Whether some content list of a body (a message's, a Cohere input's, a document's) holds an image and a text:
    what a model that takes an image or a text, not both (CLIP), refuses before its cache."""
    if isinstance(node, dict):
        return any(image_beside_text(v) for v in node.values())
    if not isinstance(node, list):
        return False
    types = {p.get("type") for p in node if isinstance(p, dict)}
    return {"image_url", "text"} <= types or any(image_beside_text(v) for v in node)


def image_part(image: PoolImage) -> dict:
    return {"type": "image_url", "image_url": {"url": image.data_url}}


def text_part(text: str) -> dict:
    return {"type": "text", "text": text}


def video_part(url: str) -> dict:
    """A ``video_url`` part: a video's data URL (``Video.data_url``) or a file URL the server may read."""
    return {"type": "video_url", "video_url": {"url": url}}


def video_request(
    model: str,
    videos: Sequence[Video],
    text: str | None = None,
    *,
    instruction: str | None = DEFAULT_INSTRUCTION,
    encoding_format: str = "float",
    file_folder: Path | None = None,
    extra: Mapping[str, Any] | None = None,
) -> BuiltRequest:
    """One embedding of one or several videos (+ text) in one user message, chat form: kind ``video``. With
    ``file_folder`` (a folder the server allows: ``--allowed-local-media-path``) the videos go as file URLs."""
    if not videos:
        raise ValueError("video_request needs at least one video")
    content = [video_part(v.file_url(file_folder) if file_folder else v.data_url) for v in videos]
    if text is not None:
        content.append(text_part(text))
    messages = [{"role": "user", "content": content}]
    if instruction is not None:
        messages.insert(0, {"role": "system", "content": [text_part(instruction)]})
    body = _body(model, encoding_format, extra, messages=messages)
    meta = RequestMeta(kind="video", video_hashes=tuple(v.hash for v in videos))
    return BuiltRequest(EMBEDDINGS_PATH, body, meta)


def conversation(
    images: Sequence[PoolImage] = (), text: str | None = None, instruction: str | None = DEFAULT_INSTRUCTION
) -> list[dict]:
    """One chat conversation: optional system instruction, then a user message with images then text."""
    if not images and text is None:
        raise ValueError("an input needs at least one image or a text")
    content = [image_part(im) for im in images]
    if text is not None:
        content.append(text_part(text))
    messages = []
    if instruction is not None:
        messages.append({"role": "system", "content": [text_part(instruction)]})
    messages.append({"role": "user", "content": content})
    return messages


def _check_format(encoding_format: str) -> None:
    if encoding_format not in ENCODING_FORMATS:
        raise ValueError(f"encoding_format must be one of {ENCODING_FORMATS}, got {encoding_format!r}")


def _as_images(images: PoolImage | Sequence[PoolImage]) -> tuple[PoolImage, ...]:
    return (images,) if isinstance(images, PoolImage) else tuple(images)


def _meta(kind: str, images: Sequence[PoolImage], n_inputs: int = 1) -> RequestMeta:
    return RequestMeta(
        kind=kind,
        image_ids=tuple(im.id for im in images),
        image_hashes=tuple(im.hash for im in images),
        n_inputs=n_inputs,
    )


def _body(model: str, encoding_format: str, extra: Mapping[str, Any] | None, **fields: Any) -> dict:
    _check_format(encoding_format)
    body = {"model": model, **fields, "encoding_format": encoding_format}
    if extra:
        body.update(extra)  # dimensions, truncate_prompt_tokens, user, priority, mm_processor_kwargs, ...
    return body


def image_request(
    model: str,
    images: PoolImage | Sequence[PoolImage],
    text: str | None = None,
    *,
    instruction: str | None = DEFAULT_INSTRUCTION,
    encoding_format: str = "float",
    extra: Mapping[str, Any] | None = None,
) -> BuiltRequest:
    """One embedding of one or several images (+ text) in one user message. Kind ``valid_image`` for one
    image, ``multi_image`` for several."""
    ims = _as_images(images)
    if not ims:
        raise ValueError("image_request needs at least one image (use text_request for text only)")
    body = _body(model, encoding_format, extra, messages=conversation(ims, text, instruction))
    return BuiltRequest(EMBEDDINGS_PATH, body, _meta("valid_image" if len(ims) == 1 else "multi_image", ims))


def multi_image_request(
    model: str,
    images: Sequence[PoolImage],
    text: str | None = None,
    **kwargs: Any,
) -> BuiltRequest:
    """Several images in one message (one embedding)."""
    if len(images) < 2:
        raise ValueError(f"multi_image_request needs at least 2 images, got {len(images)}")
    return image_request(model, images, text, **kwargs)


def text_request(
    model: str,
    text: str | Sequence[str],
    *,
    encoding_format: str = "float",
    extra: Mapping[str, Any] | None = None,
) -> BuiltRequest:
    """Text only, the completion form: ``input`` is a string or a list of strings."""
    if isinstance(text, str):
        inp: str | list[str] = text
        n = 1
    else:
        inp = list(text)
        if not inp or not all(isinstance(t, str) for t in inp):
            raise ValueError("text_request needs a string or a non-empty list of strings")
        n = len(inp)
    body = _body(model, encoding_format, extra, input=inp)
    return BuiltRequest(EMBEDDINGS_PATH, body, _meta("text", (), n))


def batch_request(
    model: str,
    inputs: Sequence[EmbedInput],
    *,
    instruction: str | None = DEFAULT_INSTRUCTION,
    encoding_format: str = "float",
    extra: Mapping[str, Any] | None = None,
) -> BuiltRequest:
    """Several inputs (one embedding each) in one request: ``messages`` is a list of conversations."""
    if not inputs:
        raise ValueError("batch_request needs at least one input")
    convs = [conversation(tuple(i.images), i.text, instruction) for i in inputs]
    body = _body(model, encoding_format, extra, messages=convs)
    ims = [im for i in inputs for im in i.images]
    return BuiltRequest(EMBEDDINGS_PATH, body, _meta("batch", ims, len(inputs)))


def tokenize_request(
    model: str,
    images: PoolImage | Sequence[PoolImage],
    text: str | None = None,
    *,
    instruction: str | None = DEFAULT_INSTRUCTION,
    extra: Mapping[str, Any] | None = None,
) -> BuiltRequest:
    """``/tokenize`` of the conversation an image request would send (renders the images, runs nothing)."""
    ims = _as_images(images)
    body: dict[str, Any] = {
        "model": model,
        "messages": conversation(ims, text, instruction),
        # the embedding request renders without a generation prompt; /tokenize defaults to adding one
        "add_generation_prompt": False,
    }
    if extra:
        body.update(extra)
    return BuiltRequest(TOKENIZE_PATH, body, _meta("tokenize", ims))
