"""The hunt's media: an image pool drawn with reuse, in several formats and sizes, and broken ones (corrupt bytes,
a truncated file, a huge-header PNG). Each case salts its pool, so its images are new to a server that has served
other cases: the cache holds nothing of them when the case starts (the known state a case needs, without a restart).

Own images on purpose: the hunt uses neither the malformed catalogue nor the probes' images."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np
from hypothesis import strategies as st
from PIL import Image

# (format, side) of the well-formed kinds; the broken kinds come after them
GOOD = (("PNG", 64), ("PNG", 256), ("JPEG", 128), ("WEBP", 96))
BROKEN = ("corrupt", "truncated", "huge_header")
KINDS = tuple(f"{f.lower()}{s}" for f, s in GOOD) + BROKEN
POOL_SLOTS = 4  # distinct images a case draws from: small, so requests reuse them


def _picture(salt: int, slot: int, side: int) -> Image.Image:
    rng = np.random.default_rng([salt, slot])
    y, x = np.mgrid[0:side, 0:side]
    tint = rng.integers(0, 256, size=3)
    arr = np.stack([(x * 255 // side + tint[0]) % 256, (y * 255 // side + tint[1]) % 256,
                    ((x + y) * 127 // side + tint[2]) % 256], axis=-1).astype(np.uint8)
    arr[:8, :8] = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)  # the salt lives in the corner
    return Image.fromarray(arr)


def image_bytes(salt: int, slot: int, kind: str) -> tuple[bytes, str]:
    """The bytes and MIME type of pool image ``slot`` of kind ``kind`` for a case salted ``salt``."""
    if kind in BROKEN:
        good, _ = image_bytes(salt, slot, "png64")
        if kind == "corrupt":
            return good[:16] + np.random.default_rng([salt, slot, 7]).bytes(len(good) - 16), "image/png"
        if kind == "truncated":
            return good[: len(good) // 2], "image/png"
        # a PNG whose header claims 60000 x 60000 pixels over a tiny body
        ihdr = struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0)
        chunk = b"IHDR" + ihdr
        return (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk
                + struct.pack(">I", zlib.crc32(chunk)) + good[33:]), "image/png"
    fmt, side = next((f, s) for f, s in GOOD if f"{f.lower()}{s}" == kind)
    buf = io.BytesIO()
    _picture(salt, slot, side).save(buf, format=fmt)
    return buf.getvalue(), f"image/{fmt.lower()}"


def data_url(salt: int, slot: int, kind: str) -> str:
    data, mime = image_bytes(salt, slot, kind)
    return f"data:{mime};base64," + base64.b64encode(data).decode()


# slot, then kind: the same slot and kind is the same image (reuse); well-formed kinds come first so they shrink to
# them, and a slot's kind is mostly its first (png64) so reuse is common
slots = st.integers(0, POOL_SLOTS - 1)
kinds = st.one_of(st.just(KINDS[0]), st.sampled_from(KINDS))
