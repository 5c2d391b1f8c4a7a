"""The mutations of malformed cases: changes to a valid request body that need code (a case file names one with
``mutation = "<name>"`` and sets its ``params``)."""

from __future__ import annotations

import base64
import copy
import struct
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .pool import DataURL, PoolImage, derived_url, percent_encoded


@dataclass(frozen=True)
class MutationContext:
    image: PoolImage
    model: str
    max_model_len: int | None
    text: str | None  # None: the model takes an image alone (no text beside it)
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
    return _set_first_image_url(
        body, derived_url(f"data:{ctx.image.mime};base64,{base64.b64encode(data).decode()}", ctx.image)
    )


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
    return _set_first_image_url(
        body, derived_url(f"data:{ctx.image.mime},{percent_encoded(ctx.image.data)}", ctx.image, "percent")
    )


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
    return derived_url(f"{head},{b64[:mid]}!*@~{b64[mid:]}", image)  # "!*@~": outside base64, nothing JSON escapes


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
