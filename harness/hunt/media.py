"""The hunt's media: images drawn by Hypothesis (format, size, content seed) and the damaged forms a client may send
(truncated, bytes of one format under another's type, not base64 at all), and now and then a short video clip
(mp4 or webm, intact or truncated: the cache keeps videos as it keeps images), each as the data URL a request
carries.
Drawn images are kept in a bundle by the hunt's cases, so a later request can send the same one again: reuse is
what the multimodal cache is about."""

from __future__ import annotations

import base64
import io
import re
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from hypothesis import strategies as st
from PIL import Image

from mmchaos.payloads import video
from mmchaos.payloads.pool import content_hash

FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif", "BMP": "image/bmp"}
SIDES = (16, 64, 128, 300)  # vLLM resizes to its own bounds: the tiny and the large both go through that
# now and then a side from a few pixels to past what the processor keeps (it resizes to its max_pixels): its edges
EDGE_SIDES = (1, 2, 7, 1024, 2048, 4096)
EDGE_ONE_IN = 6  # one side in this many is an edge side
UNCOMPRESSED, UNCOMPRESSED_MAX_PIXELS = ("BMP", "GIF"), 1024 * 1024  # formats whose large images stay large
BLOCK = 32  # a large image is noise in blocks of this many pixels: its bytes stay a few hundred kB, not megabytes
DAMAGE = ("none", "truncated", "wrong_mime", "not_base64", "empty", "huge_header")
HUGE_SIDE = 60000  # a PNG header claiming 60000 x 60000 pixels: over Pillow's decompression-bomb limit
VIDEO_ONE_IN = 8  # one medium in this many is a video clip (a few frames of 64x64: 4 patches of the tiny model each)
VIDEO_SIDE = 64
RENEWED_SIDE = 32  # renew: a new image in place of one whose size is not known
# How a content part carries a medium, as vLLM's chat parser reads them: its data URL under the part's type (most
# draws), under the Responses API's type, with no type at all, with the client's own id for it (``uuid``: vLLM's
# cache then keys the item by that id, not by its pixels), or by that id alone with no data (the server must hold
# the item already: a hit in the API server's cache is trusted to be in the engine's too)
FORMS = ("data", "data", "data", "data", "uuid", "uuid", "uuid_only", "input_image", "untyped")
UUID_PREFIX = "mm-"  # a medium's id is derived from its content, so one id never names two media
DATA_URL = re.compile(r"data:[a-z]+/[-\w.+]+;base64,[A-Za-z0-9+/=]+")  # a medium as a body carries it


@dataclass(frozen=True)
class Media:
    """One image as sent: its data URL and the hash of the URL's content (the image's identity in our rows)."""

    url: str
    hash: str
    damage: str
    format: str
    width: int
    height: int
    kind: str = "image"  # or "video": which content part carries it (image_url, video_url)

    def describe(self) -> str:
        extra = "" if self.damage == "none" else f", {self.damage}"
        return f"{self.format} {self.width}x{self.height}{extra} #{self.hash[:8]}"

    @property
    def part(self) -> dict:
        """The chat content part that carries it."""
        return self.as_part("data")

    @property
    def uuid(self) -> str:
        return UUID_PREFIX + self.hash

    @property
    def by_id(self) -> bool:
        """Whether the hunt's client names this medium by its id (a third of media, by hash): every use of a medium
        then meets the same cache entry (its id's, or its content's), so a failure on one use and a later use of it
        still meet, whatever forms they were drawn in."""
        return int(self.hash[:8], 16) % 3 == 0

    def keyed_form(self, form: str) -> str:
        """``form`` (drawn from FORMS) as this medium's keying takes it: by its id (``uuid``, ``uuid_only``) or by
        its content (the rest)."""
        if self.by_id:
            return form if form in ("uuid", "uuid_only") else "uuid"
        return "data" if form in ("uuid", "uuid_only") else form

    def as_part(self, form: str) -> dict:
        """The chat content part that carries it in ``form`` (one of FORMS; the Responses type is for images)."""
        key = "video_url" if self.kind == "video" else "image_url"
        if form == "uuid":
            return {"type": key, key: {"url": self.url}, "uuid": self.uuid}
        if form == "uuid_only":
            return {"type": key, key: None, "uuid": self.uuid}
        if form == "input_image" and self.kind == "image":
            return {"type": "input_image", "image_url": self.url, "detail": "auto"}
        if form == "untyped":
            return {key: {"url": self.url}}
        return {"type": key, key: {"url": self.url}}


def swap(text: str, old_url: str, new_url: str) -> str:
    """``text`` (a body's JSON) carrying the medium of ``new_url`` wherever it carried that of ``old_url``: its data
    and its id (a Media's hash is its URL's)."""
    old_id, new_id = (UUID_PREFIX + content_hash(u.encode()) for u in (old_url, new_url))
    return text.replace(old_url, new_url).replace(old_id, new_id)


def meant(body: Any, seen: Mapping[str, Media]) -> Any:
    """``body`` as the server should read it: a part naming a medium of ``seen`` (by hash) by its id alone given
    that medium's data. The wrong-answer oracles compare what requests mean: a reference answers as its medium."""
    if isinstance(body, dict):
        ref = body.get("uuid")
        m = seen.get(ref.removeprefix(UUID_PREFIX)) if isinstance(ref, str) and ref.startswith(UUID_PREFIX) else None
        if m is not None and any(k in body and body[k] is None for k in ("image_url", "video_url")):
            return m.part
        return {k: meant(v, seen) for k, v in body.items()}
    if isinstance(body, list):
        return [meant(v, seen) for v in body]
    return body


def encode(fmt: str, width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    if width * height > 512 * 512:  # noise in blocks: the same pixels to the model's patches, far fewer bytes
        small = rng.integers(0, 256, size=(-(-height // BLOCK), -(-width // BLOCK), 3), dtype=np.uint8)
        pixels = np.kron(small, np.ones((BLOCK, BLOCK, 1), dtype=np.uint8))[:height, :width]
    else:
        pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def make(fmt: str, width: int, height: int, seed: int, damage: str) -> Media:
    while fmt in UNCOMPRESSED and width * height > UNCOMPRESSED_MAX_PIXELS:  # tens of MB a request: halved
        width, height = max(1, width // 2), max(1, height // 2)
    data, mime = encode(fmt, width, height, seed), FORMATS[fmt]
    if damage == "truncated":
        data = data[: max(1, len(data) // 2)]
    elif damage == "wrong_mime":
        mime = FORMATS["JPEG" if fmt != "JPEG" else "PNG"]
    elif damage == "empty":
        data = b""
    elif damage == "huge_header":
        data, mime = _huge_png_header(encode("PNG", width, height, seed)), FORMATS["PNG"]
    b64 = base64.b64encode(data).decode("ascii")
    if damage == "not_base64":
        b64 = b64[:16] + "!!" + b64[16:]
    url = f"data:{mime};base64,{b64}"
    return Media(url, content_hash(url.encode()), damage, fmt, width, height)


def renew(m: Media | None, salt: int) -> Media:
    """An image new to any server (its seed above every drawn one): ``m``'s format, size and damage with other
    pixels, or a RENEWED_SIDE-pixel PNG when ``m`` is not known."""
    if m is None:
        return make("PNG", RENEWED_SIDE, RENEWED_SIDE, 2**17 + salt, "none")
    fmt = m.format if m.kind == "image" and m.format in FORMATS else "PNG"
    return make(fmt, m.width, m.height, 2**17 + salt, m.damage)


def _huge_png_header(png: bytes) -> bytes:
    """``png`` with its IHDR claiming HUGE_SIDE x HUGE_SIDE pixels (its checksum made right, so only the size is
    wrong)."""
    ihdr = bytearray(png[12:29])  # chunk type and its 13 bytes of data
    ihdr[4:12] = struct.pack(">II", HUGE_SIDE, HUGE_SIDE)
    return png[:12] + bytes(ihdr) + struct.pack(">I", zlib.crc32(ihdr)) + png[33:]


def make_video(container: str, frames: int, seed: int, damage: str) -> Media:
    v = video.clip(video.VideoSpec(container, VIDEO_SIDE, VIDEO_SIDE, frames, 4, seed))
    if damage == "truncated":
        v = replace(v, data=v.data[: max(1, len(v.data) // 2)])
    url = str(v.data_url)
    return Media(url, content_hash(url.encode()), damage, container.upper(), VIDEO_SIDE, VIDEO_SIDE, kind="video")


def media(damaged: bool = True) -> st.SearchStrategy[Media]:
    """An image or now and then a video: mostly intact (a cache hit needs media the server accepted), sometimes
    damaged (never, with ``damaged=False``)."""
    intact = st.just("none")
    clip = st.builds(
        make_video,
        container=st.sampled_from(sorted(video.CONTAINERS)),
        frames=st.sampled_from((2, 4, 8, 16, 32, 64)),  # up to past what the video processor samples
        seed=st.integers(0, 2**16),
        damage=st.one_of(intact, intact, st.just("truncated")) if damaged else intact,
    )
    still = images(damaged)
    return st.integers(1, VIDEO_ONE_IN).flatmap(lambda k: clip if k == VIDEO_ONE_IN else still)


def images(damaged: bool = True) -> st.SearchStrategy[Media]:
    """An image: mostly intact, sometimes damaged (never, with ``damaged=False``)."""
    intact = st.just("none")
    return st.builds(
        make,
        fmt=st.sampled_from(sorted(FORMATS)),
        width=_side(),
        height=_side(),
        seed=st.integers(0, 2**16),
        damage=st.one_of(intact, intact, intact, st.sampled_from(DAMAGE[1:])) if damaged else intact,
    )


def _side() -> st.SearchStrategy[int]:
    """A side: a usual one, or one in EDGE_ONE_IN an edge side (first the usual: Hypothesis draws simply first)."""
    return st.integers(1, EDGE_ONE_IN).flatmap(
        lambda k: st.sampled_from(EDGE_SIDES) if k == EDGE_ONE_IN else st.sampled_from(SIDES)
    )
