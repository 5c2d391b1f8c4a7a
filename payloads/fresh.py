"""Fresh images, cheaply: a pool image with a unique stamp in its top-left corner, without re-encoding the image.

:func:`fresh_image` defines what a fresh image is: the base image decoded, a 16x8-cell
black/white stamp (128 bits of a token's sha256) pasted at its top-left corner, encoded again in the base's
format and quality. Decoding and encoding a whole 1-4 Mpx image costs 5-50 ms, which made fresh images most of
a load generator's CPU. The stamp touches the top ~36 rows only, so this module re-encodes those and reuses the
rest, encoded once per base image (a *template*, cached):

- PNG (8-bit RGB / RGBA, not interlaced, as generated): the pixels of the fresh image are exactly those of the
  full re-encode (PNG is lossless). The zlib stream is the stamped top rows, compressed per fresh image and
  sync-flushed, followed by the rest of the rows compressed once per base; the Adler-32 is combined from the
  two parts' checksums.
- JPEG: the template is the decoded base encoded once more (as the full re-encode would), with a restart
  marker every k MCUs such that the top-left MCUs form whole restart intervals. A fresh image re-encodes only
  the small top-left strip under the stamp, with the same settings, and swaps its intervals in. Restart
  intervals are coded independently (DC prediction restarts, byte-aligned), and the quantised DCT coefficients
  of a block depend only on that block's pixels (and, for chroma, on its own 2x2 neighbourhood, which lies in
  the same MCU), so the result decodes to the same pixels as the full re-encode of the stamped image.
- Anything else (WebP, user images of other kinds, images too small for a strip): the full re-encode, from a
  cached decode of the base.

Templates live in a process-wide LRU bounded by bytes (:data:`CACHE_BYTES`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import struct
import threading
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
from PIL import Image

from .encode import encode
from .pool import PoolImage, content_hash

CACHE_BYTES = 256 * 2**20  # templates and decoded bases kept per process
STAMP_COLS, STAMP_ROWS = 16, 8
PNG_SIG = b"\x89PNG\r\n\x1a\n"
_ADLER_BASE = 65521


# ---------------------------------------------------------------------------------------------------------------
# the stamp (one definition)
# ---------------------------------------------------------------------------------------------------------------


def stamp_geometry(w: int, h: int) -> tuple[int, int]:
    """(cell size px, offset px) of the stamp on a w x h image."""
    cell = max(1, min(4, w // (STAMP_COLS + 2), h // (STAMP_ROWS + 2)))
    # one cell of margin when there is room; images smaller than the stamp get what fits (fewer distinct stamps)
    off = cell if (w >= (STAMP_COLS + 1) * cell and h >= (STAMP_ROWS + 1) * cell) else 0
    return cell, off


def stamp_array(digest: bytes, w: int, h: int) -> tuple[np.ndarray, int]:
    """The stamp (uint8 0/255, at most 8*cell x 16*cell, clipped to the image) and its offset."""
    cell, off = stamp_geometry(w, h)
    bits = np.unpackbits(np.frombuffer(digest[:16], dtype=np.uint8)).reshape(STAMP_ROWS, STAMP_COLS)
    stamp = np.kron(bits * 255, np.ones((cell, cell), dtype=np.uint8)).astype(np.uint8)
    return np.ascontiguousarray(stamp[: h - off, : w - off]), off


def apply_stamp(arr: np.ndarray, stamp: np.ndarray, off: int) -> None:
    """Paste the stamp into an (h, w, 3|4) uint8 array in place, as Pillow pastes an L image converted to the
    array's mode: grey in the colour channels, alpha 255."""
    sh, sw = stamp.shape
    region = arr[off : off + sh, off : off + sw]
    region[..., :3] = stamp[..., None]
    if arr.shape[2] == 4:
        region[..., 3] = 255


# ---------------------------------------------------------------------------------------------------------------
# the cache
# ---------------------------------------------------------------------------------------------------------------


class _LRU:
    def __init__(self, limit: int):
        self.limit = limit
        self.items: OrderedDict = OrderedDict()
        self.size = 0
        self.lock = threading.Lock()

    def get(self, key):
        with self.lock:
            v = self.items.get(key)
            if v is not None:
                self.items.move_to_end(key)
            return v

    def put(self, key, value, nbytes: int):
        with self.lock:
            if key in self.items:
                return
            self.items[key] = (value, nbytes)
            self.size += nbytes
            while self.size > self.limit and len(self.items) > 1:
                _, (_, n) = self.items.popitem(last=False)
                self.size -= n

    def clear(self):
        with self.lock:
            self.items.clear()
            self.size = 0


_cache = _LRU(CACHE_BYTES)


def clear_cache() -> None:
    _cache.clear()


def _cached(kind: str, base, build):
    key = (kind, base.id, base.hash)
    hit = _cache.get(key)
    if hit is not None:
        return hit[0]
    value, nbytes = build()
    _cache.put(key, value, nbytes)
    return value


def decoded(base, keep: bool = True) -> np.ndarray:
    """The base image decoded as fresh_image converts it (RGB, or RGBA for images with alpha), as a
    read-only array; kept in the cache when ``keep`` (the formats re-encoded whole need it every time, the
    templates only once)."""

    def build():
        with Image.open(io.BytesIO(base.data)) as src:
            src.load()
            im = src.convert("RGBA" if src.mode in ("RGBA", "LA", "PA") else "RGB")
        arr = np.asarray(im)
        arr.flags.writeable = False
        return arr, arr.nbytes

    if keep:
        return _cached("decoded", base, build)
    hit = _cache.get(("decoded", base.id, base.hash))
    return hit[0] if hit is not None else build()[0]


# ---------------------------------------------------------------------------------------------------------------
# PNG
# ---------------------------------------------------------------------------------------------------------------


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(data, zlib.crc32(kind)))


def _png_chunks(data: bytes):
    if not data.startswith(PNG_SIG):
        return None
    out, i = [], len(PNG_SIG)
    while i + 8 <= len(data):
        (n,) = struct.unpack(">I", data[i : i + 4])
        out.append((data[i + 4 : i + 8], data[i + 8 : i + 8 + n]))
        i += 12 + n
    return out


def adler32_combine(a1: int, a2: int, len2: int) -> int:
    """Adler-32 of A+B from adler32(A), adler32(B) and len(B) (zlib's adler32_combine)."""
    rem = len2 % _ADLER_BASE
    sum1 = a1 & 0xFFFF
    sum2 = (rem * sum1) % _ADLER_BASE
    sum1 += (a2 & 0xFFFF) + _ADLER_BASE - 1
    sum2 += ((a1 >> 16) & 0xFFFF) + ((a2 >> 16) & 0xFFFF) + _ADLER_BASE - rem
    if sum1 >= _ADLER_BASE:
        sum1 -= _ADLER_BASE
    if sum1 >= _ADLER_BASE:
        sum1 -= _ADLER_BASE
    if sum2 >= (_ADLER_BASE << 1):
        sum2 -= _ADLER_BASE << 1
    if sum2 >= _ADLER_BASE:
        sum2 -= _ADLER_BASE
    return sum1 | (sum2 << 16)


@dataclass(frozen=True)
class _PngTemplate:
    head: bytes  # signature + IHDR
    top: np.ndarray  # rows [0, n_top) as pixels (h, w, c); the stamp lies in them, the last one is unchanged
    tail_chunk: bytes  # IDAT chunk: raw deflate of the filtered rows [n_top, h), final block
    tail_adler: int
    tail_len: int


def _png_template(base) -> _PngTemplate | None:
    chunks = _png_chunks(base.data)
    if not chunks or chunks[0][0] != b"IHDR" or {k for k, _ in chunks} - {b"IHDR", b"IDAT", b"IEND"}:
        return None  # ancillary chunks (colour profiles, text, ...): leave such files to the full re-encode
    w, h, depth, ctype, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    channels = {2: 3, 6: 4}.get(ctype)
    if depth != 8 or channels is None or comp or filt or interlace or (w, h) != (base.width, base.height):
        return None
    stamp, off = stamp_array(bytes(16), w, h)
    n_top = off + stamp.shape[0] + 1  # one unchanged row below the stamp: the next row may filter against it
    if n_top >= h:
        return None
    pixels = decoded(base, keep=False)
    if pixels.shape != (h, w, channels):
        return None
    filtered = zlib.decompress(b"".join(d for k, d in chunks if k == b"IDAT"))
    stride = 1 + w * channels
    if len(filtered) != h * stride:
        return None
    tail = filtered[n_top * stride :]
    c = zlib.compressobj(3, zlib.DEFLATED, -15)  # the level encode.encode uses for PNG
    deflated = c.compress(tail) + c.flush()
    top = np.array(pixels[:n_top])
    head = PNG_SIG + _png_chunk(b"IHDR", chunks[0][1])
    return _PngTemplate(head, top, _png_chunk(b"IDAT", deflated), zlib.adler32(tail), len(tail))


def _fresh_png(base, digest: bytes) -> tuple[bytes, str] | None:
    def build():
        t = _png_template(base)
        return t, (len(t.tail_chunk) + t.top.nbytes if t else 0)

    t = _cached("png", base, build)
    if t is None:
        return None
    rows = t.top.copy()
    stamp, off = stamp_array(digest, base.width, base.height)
    apply_stamp(rows, stamp, off)
    n, w, ch = rows.shape
    raw = np.zeros((n, 1 + w * ch), dtype=np.uint8)  # filter type 0 (None) for each of these rows
    raw[:, 1:] = rows.reshape(n, w * ch)
    raw_bytes = raw.tobytes()
    c = zlib.compressobj(3, zlib.DEFLATED, -15)
    head = b"\x78\x5e" + c.compress(raw_bytes) + c.flush(zlib.Z_SYNC_FLUSH)  # byte-aligned, not final
    adler = adler32_combine(zlib.adler32(raw_bytes), t.tail_adler, t.tail_len)
    data = b"".join(
        (
            t.head,
            _png_chunk(b"IDAT", head),
            t.tail_chunk,
            _png_chunk(b"IDAT", struct.pack(">I", adler)),
            _png_chunk(b"IEND", b""),
        )
    )
    return data, "RGBA" if ch == 4 else "RGB"


# ---------------------------------------------------------------------------------------------------------------
# JPEG
# ---------------------------------------------------------------------------------------------------------------


def _jpeg_save(im: Image.Image, quality: int, restart_blocks: int) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality, restart_marker_blocks=restart_blocks)  # as encode.encode, + restarts
    return buf.getvalue()


def _jpeg_scan(data: bytes):
    """(bytes up to the entropy-coded data, [restart interval bodies], sampling (hmax, vmax)) of a baseline
    single-scan JPEG, or None."""
    i, hv = 2, None
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        (n,) = struct.unpack(">H", data[i + 2 : i + 4])
        if marker == 0xC0:  # SOF0: baseline
            nc = data[i + 9]
            comps = [data[i + 10 + 3 * k + 1] for k in range(nc)]
            hv = (max(s >> 4 for s in comps), max(s & 15 for s in comps))
        elif marker in (0xC1, 0xC2, 0xC3) or (0xC5 <= marker <= 0xCF and marker != 0xCC):
            return None
        elif marker == 0xDA:
            start = i + 2 + n
            end = data.rfind(b"\xff\xd9")
            if hv is None or end < start:
                return None
            body = data[start:end]
            parts, j, last = [], 0, 0
            while True:
                j = body.find(b"\xff", j)
                if j < 0 or j + 1 >= len(body):
                    break
                if 0xD0 <= body[j + 1] <= 0xD7:
                    parts.append(body[last:j])
                    last = j + 2
                j += 2  # 0xFF00 (stuffed byte) or a marker: skip both bytes
            parts.append(body[last:])
            return data[:start], parts, hv
        i += 2 + n
    return None


@dataclass(frozen=True)
class _JpegTemplate:
    prefix: bytes  # up to and including the SOS header
    intervals: tuple[bytes, ...]
    per_row: int  # restart intervals per MCU row
    blocks: int  # MCUs per restart interval
    strip: np.ndarray  # the top-left pixels the stamp may touch: whole intervals, whole MCU rows
    mcu_h: int
    quality: int


def _jpeg_template(base) -> _JpegTemplate | None:
    pixels = decoded(base, keep=False)
    h, w, ch = pixels.shape
    if ch != 3:
        return None
    quality = base.quality or 90  # as encode.encode
    probe = _jpeg_scan(_jpeg_save(Image.new("RGB", (16, 16)), quality, 1))
    if probe is None:
        return None
    mcu_w, mcu_h = 8 * probe[2][0], 8 * probe[2][1]
    stamp, off = stamp_array(bytes(16), w, h)
    rows = -(-(off + stamp.shape[0]) // mcu_h)
    if rows * mcu_h >= h:
        return None
    w_mcu = -(-w // mcu_w)
    need = -(-(off + stamp.shape[1]) // mcu_w)
    blocks = next(d for d in range(need, w_mcu + 1) if w_mcu % d == 0)  # whole intervals per MCU row
    data = _jpeg_save(Image.fromarray(pixels), quality, blocks)
    scan = _jpeg_scan(data)
    per_row = w_mcu // blocks
    if scan is None or len(scan[1]) != per_row * -(-h // mcu_h):
        return None
    strip_w = blocks * mcu_w if blocks < w_mcu else w
    strip = np.array(pixels[: rows * mcu_h, :strip_w])
    return _JpegTemplate(scan[0], tuple(scan[1]), per_row, blocks, strip, mcu_h, quality)


def _fresh_jpeg(base, digest: bytes) -> bytes | None:
    def build():
        t = _jpeg_template(base)
        return t, (sum(map(len, t.intervals)) + t.strip.nbytes if t else 0)

    t = _cached("jpeg", base, build)
    if t is None:
        return None
    strip = t.strip.copy()
    stamp, off = stamp_array(digest, base.width, base.height)
    apply_stamp(strip, stamp, off)
    scan = _jpeg_scan(_jpeg_save(Image.fromarray(strip), t.quality, t.blocks))
    if scan is None or len(scan[1]) != strip.shape[0] // t.mcu_h:  # one interval per MCU row of the strip
        return None
    intervals = list(t.intervals)
    for r, body in enumerate(scan[1]):
        intervals[r * t.per_row] = body
    out = [t.prefix]
    for j, body in enumerate(intervals):
        if j:
            out.append(bytes((0xFF, 0xD0 + (j - 1) % 8)))
        out.append(body)
    out.append(b"\xff\xd9")
    return b"".join(out)


# ---------------------------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------------------------


def fresh_data(base, digest: bytes, offload: Offload | None = None) -> tuple[bytes, str, str]:
    """(encoded bytes, format, mode) of the fresh variant of ``base`` for ``digest`` (the full re-encode for the
    formats without a fast path; with ``offload``, a large one runs where it says)."""
    if base.format == "png":
        done = _fresh_png(base, digest)
        if done is not None:
            return done[0], "png", done[1]
    elif base.format == "jpeg":
        data = _fresh_jpeg(base, digest)
        if data is not None:
            return data, "jpeg", "RGB"
    src = decoded(base)
    mode = "RGBA" if src.shape[2] == 4 else "RGB"
    fmt = base.format if base.format in ("jpeg", "png", "webp") else "png"
    run, slot = (
        (offload.run, offload.slot)
        if offload is not None and src.shape[0] * src.shape[1] >= OFFLOAD_MIN_PIXELS
        else (None, contextlib.nullcontext())
    )
    with slot:  # the copies are made only when their encode can start
        arr = np.array(src)
        apply_stamp(arr, *stamp_array(digest, arr.shape[1], arr.shape[0]))
        im = Image.fromarray(arr, mode)
        del arr  # Pillow's image is a copy of it (RGB) or holds it (RGBA)
        data = run(encode, im, fmt, base.quality) if run else encode(im, fmt, base.quality)
    return data, fmt, mode


# The whole-image encodes left (WebP, mostly: ~10 ms per Mpx) can run on another core: Pillow releases the GIL
# while libwebp / libjpeg / zlib work. A Locust process's run state (locustfiles/plugin/run_state.py) owns a gevent
# thread pool (a thread per core), so the greenlet waits for the encode as for I/O while the other users go on, and a
# semaphore of as many slots: a greenlet waiting for a thread holds no copy of its image (~30 MB at 2,048 px; copies
# queued for the pool in bursts of fresh images raised the heap of a long run at a server-like rate). Only the
# encode runs there: no cache, no lock, nothing shared (the copy and the stamp hold the GIL: in a thread they cost
# more).
OFFLOAD_MIN_PIXELS = 256 * 256


@dataclass(frozen=True)
class Offload:
    """Where the whole-image encodes of fresh images run: ``run(fn, *args)`` -> fn(*args), run elsewhere; ``slot``,
    a context manager held from an image's copy to the end of its encode (one per place ``run`` runs things). Made
    by whoever owns the threads, handed to :func:`fresh_image`; without one, encodes run in the caller."""

    run: Callable[..., bytes]
    slot: AbstractContextManager


def stamp_digest(token: bytes) -> bytes:
    """The stamp's 128 bits come from this digest of the token."""
    return hashlib.sha256(token).digest()


def fresh_image(base: PoolImage, token: str | bytes | None = None, offload: Offload | None = None) -> PoolImage:
    """``base`` with a unique 16x8-cell black/white stamp (128 bits of sha256(token)) in its top-left corner,
    re-encoded in the same format. Different tokens give different pixels, so the server sees a new item
    whether it hashes the bytes or the decoded pixels. ``token=None`` -> a random one (uuid4); pass a token
    such as ``f"{run}/{worker}/{user}/{seq}"`` for reproducible runs. The pixels are those of decoding the
    base, pasting the stamp and encoding again, got without re-encoding the whole image where the format allows
    (PNG, JPEG: a fraction of a millisecond instead of 5-50 ms). ``offload``: where a whole re-encode runs."""
    if token is None:
        token = uuid.uuid4().bytes
    token = token.encode() if isinstance(token, str) else token
    digest = stamp_digest(token)
    data, fmt, mode = fresh_data(base, digest, offload)
    return PoolImage(
        id=f"{base.id}~{digest.hex()[:12]}",
        format=fmt,
        width=base.width,
        height=base.height,
        data=data,
        hash=content_hash(data),
        mode=mode,
        quality=base.quality,
        recipe=(base.data_url, token),
    )
