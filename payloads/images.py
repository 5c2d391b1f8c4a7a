"""The image pool: what the load generator uploads.

Two sources:

* :func:`generate_pool` -- synthetic images that look like real uploads, deterministic from a seed.
  Photos (sky gradient, horizon, hills, textured ground, a few objects, film grain, sometimes a caption)
  and graphics (screenshots / charts / diagrams with flat colours and text, sometimes an embedded photo).
  Long side log-uniform in ``[min_side, max_side]`` (256-2048 px by default), common aspect ratios in both
  orientations, 70 % JPEG (quality 70-95), 20 % PNG (a fifth of them with alpha), 10 % WebP (quality 75-85).
  Each image is rendered from ``(seed, index)`` alone, so pools of different sizes share their first images.
  Encoded files are cached on disk (``<cache_dir>/<GENERATOR_VERSION>/<key>.<ext>``), so a second build only
  reads files.
* :func:`load_image_dir` -- the user's own images. Policy: files whose extension is not an image extension
  are skipped with one :class:`PayloadWarning`; files with an image extension that Pillow cannot decode are an
  error naming the file (a broken ``.jpg`` in a dataset is a mistake worth stopping for); byte-identical
  duplicates are dropped with a warning (hidden reuse would distort the reuse model).

:func:`shared_pool` memoises either per process, so every Locust user in a process shares one pool.
:func:`fresh_image` derives a never-seen-before image from a pool image (a unique 128-bit stamp in a corner,
re-encoded), for the reuse model's "fresh" share.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import threading
import uuid
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import PIL
from PIL import Image, ImageChops, ImageDraw, ImageFilter, ImageFont

from mmchaos import paths

# Bump when the rendering changes: it is part of every cache key, so old cache files are never mixed in.
GENERATOR_VERSION = "gen-v1"

PRESETS: dict[str, tuple[int, int]] = {
    "realistic": (256, 2048),  # phone photos and screenshots after the usual client-side downscale
    "small": (64, 256),  # fast tests
}
DEFAULT_FORMATS: dict[str, float] = {"jpeg": 0.70, "png": 0.20, "webp": 0.10}

# (width, height, weight): landscape and portrait variants of the common ratios
ASPECTS: tuple[tuple[int, int, float], ...] = (
    (4, 3, 0.20),
    (3, 4, 0.15),
    (3, 2, 0.08),
    (2, 3, 0.05),
    (16, 9, 0.16),
    (9, 16, 0.14),
    (1, 1, 0.22),
)

MIME = {
    "jpeg": "image/jpeg",
    "png": "image/png",
    "webp": "image/webp",
    "gif": "image/gif",
    "bmp": "image/bmp",
    "tiff": "image/tiff",
}
_EXT = {"jpeg": "jpg", "png": "png", "webp": "webp"}
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"})

_GRAIN_MAX = 12  # photos are scaled to [0, 255 - _GRAIN_MAX] so adding grain never wraps
_BASE_LONG = 128  # photos are painted at this long side, then resized up (cheap, and photos are smooth anyway)


class PayloadWarning(UserWarning):
    """Something in the user's payload input was skipped or changed."""


# ---------------------------------------------------------------------------------------------------------------
# the pool
# ---------------------------------------------------------------------------------------------------------------


class DataURL(str):
    """A data URL built by mmchaos whose text has no character JSON would escape: ASCII, no quote, backslash or
    control character (base64 or percent-encoding and a plain MIME type). :func:`payloads.requests.encode_body`
    copies such strings into the request body as they are instead of scanning them again for every request.
    Only wrap text that is JSON-safe by construction."""

    __slots__ = ()

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


@dataclass(frozen=True)
class PoolImage:
    id: str  # unique in its pool; never contains a comma (ids are comma-joined in the requests table)
    format: str  # lower-case Pillow format name: jpeg, png, webp (user images: also gif, bmp, tiff...)
    width: int
    height: int
    data: bytes = field(repr=False)  # the encoded file, sent as is
    hash: str = ""  # sha256(data) hex [:16]
    mode: str = "RGB"
    quality: int | None = None  # encoder quality when known (generated jpeg / webp), reused by fresh_image

    @property
    def mime(self) -> str:
        return MIME.get(self.format, f"image/{self.format}")

    @property
    def nbytes(self) -> int:
        return len(self.data)

    @cached_property
    def data_url(self) -> DataURL:
        # computed once per image and kept (a third more memory than the encoded file): a load test sends each
        # pool image again and again, and base64 of a big image costs ~1 ms
        return DataURL(f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}")


@dataclass(frozen=True)
class ImagePool(Sequence[PoolImage]):
    images: tuple[PoolImage, ...]
    source: str  # "generated seed=… preset=…" or the directory
    generated: int = 0  # images rendered by this build
    from_cache: int = 0  # images read from the disk cache by this build

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i):  # type: ignore[override]
        return self.images[i]

    def __iter__(self) -> Iterator[PoolImage]:
        return iter(self.images)

    def by_id(self, image_id: str) -> PoolImage:
        for im in self.images:
            if im.id == image_id:
                return im
        raise KeyError(f"no image {image_id!r} in pool ({self.source})")

    def fresh(self, index: int, token: str | bytes | None = None) -> PoolImage:
        """A never-repeated variant of image ``index`` (see :func:`fresh_image`)."""
        return fresh_image(self.images[index], token)

    def summary(self) -> dict:
        fmt = Counter(im.format for im in self.images)
        px = np.array([im.width * im.height for im in self.images] or [0])
        return {
            "source": self.source,
            "n": len(self.images),
            "formats": dict(sorted(fmt.items())),
            "total_bytes": sum(im.nbytes for im in self.images),
            "median_pixels": int(np.median(px)),
            "max_long_side": max((max(im.width, im.height) for im in self.images), default=0),
            "generated": self.generated,
            "from_cache": self.from_cache,
        }


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------------
# specs: everything about image i that is decided before painting
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageSpec:
    seed: int
    index: int
    format: str
    width: int
    height: int
    quality: int | None
    style: str  # photo | graphic
    alpha: bool
    progressive: bool
    content_seed: int

    @property
    def id(self) -> str:
        return f"g{self.seed}-{self.index:05d}"

    def cache_key(self) -> str:
        # Pillow's version is in the key: another libjpeg/libwebp may encode different bytes
        blob = json.dumps([GENERATOR_VERSION, PIL.__version__, self.__dict__], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _normalise_formats(formats: Mapping[str, float] | None) -> tuple[tuple[str, float], ...]:
    formats = dict(DEFAULT_FORMATS if formats is None else formats)
    unknown = sorted(set(formats) - set(_EXT))
    if unknown:
        raise ValueError(f"unknown image format(s) {unknown}; generated pools support {sorted(_EXT)}")
    total = float(sum(formats.values()))
    if total <= 0 or any(w < 0 for w in formats.values()):
        raise ValueError(f"format weights must be >= 0 and sum to > 0, got {formats}")
    return tuple((f, w / total) for f, w in sorted(formats.items()))


def image_spec(
    seed: int,
    index: int,
    *,
    min_side: int = 256,
    max_side: int = 2048,
    formats: Mapping[str, float] | None = None,
) -> ImageSpec:
    """The spec of generated image ``index``; depends on ``(seed, index, sizes, formats)`` only."""
    fmts = _normalise_formats(formats)
    # one independent stream per image: the order of the draws below is part of GENERATOR_VERSION
    rng = np.random.default_rng([0x6D6D, seed, index])
    u = rng.random()
    cum = np.cumsum([w for _, w in fmts])
    fmt = fmts[min(int(np.searchsorted(cum, u, side="right")), len(fmts) - 1)][0]
    long_side = float(np.exp(rng.uniform(np.log(min_side), np.log(max_side))))
    weights = np.array([a[2] for a in ASPECTS])
    aw, ah, _ = ASPECTS[int(rng.choice(len(ASPECTS), p=weights / weights.sum()))]
    if aw >= ah:
        w, h = long_side, long_side * ah / aw
    else:
        w, h = long_side * aw / ah, long_side
    width, height = max(16, round(w)), max(16, round(h))
    q_jpeg = int(rng.integers(70, 96))
    q_webp = int(rng.integers(75, 86))
    style_u, alpha_u, prog_u = rng.random(3)
    content_seed = int(rng.integers(0, 2**63 - 1))
    if fmt == "png":
        style, quality = ("graphic" if style_u < 0.85 else "photo"), None
    elif fmt == "webp":
        style, quality = ("photo" if style_u < 0.8 else "graphic"), q_webp
    else:
        style, quality = ("photo" if style_u < 0.9 else "graphic"), q_jpeg
    return ImageSpec(
        seed=seed,
        index=index,
        format=fmt,
        width=width,
        height=height,
        quality=quality,
        style=style,
        alpha=bool(fmt == "png" and alpha_u < 0.2),
        progressive=bool(fmt == "jpeg" and prog_u < 0.15),
        content_seed=content_seed,
    )


# ---------------------------------------------------------------------------------------------------------------
# painting (numpy at a small size + Pillow drawing; everything vectorised or in C)
# ---------------------------------------------------------------------------------------------------------------

_WORDS = (
    "summer holiday beach team meeting notes draft final invoice total order receipt report quarterly revenue "
    "growth chart dashboard settings profile account login search results photo album family garden kitchen "
    "recipe ingredients step one two three north station platform exit open closed sale today new update "
    "version release error warning status ready pending shipped delivered cafe menu coffee tea price"
).split()

_fonts = threading.local()  # FreeType faces are not safe to share between threads
_grain_lock = threading.Lock()
_grain_tiles: dict[int, Image.Image] = {}


def _font(px: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    sizes = (10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 64, 80)
    size = min(sizes, key=lambda s: abs(s - px))  # few sizes -> few font objects
    cache = getattr(_fonts, "by_size", None)
    if cache is None:
        cache = _fonts.by_size = {}
    if size not in cache:
        try:
            cache[size] = ImageFont.load_default(size=size)
        except (TypeError, OSError, ImportError):  # Pillow without FreeType: the small bitmap font
            cache[size] = ImageFont.load_default()
    return cache[size]


def _grain_tile(amplitude: int) -> Image.Image:
    """A 1024x1024 RGB tile of values in [0, amplitude]; constant (fixed seed) so pools stay deterministic."""
    with _grain_lock:
        tile = _grain_tiles.get(amplitude)
        if tile is None:
            rng = np.random.default_rng(1000 + amplitude)
            # sum of two uniforms: a softer, more film-like grain than one uniform
            half = amplitude // 2
            arr = rng.integers(0, half + 1, (1024, 1024, 3), dtype=np.uint8)
            arr += rng.integers(0, amplitude - half + 1, (1024, 1024, 3), dtype=np.uint8)
            tile = _grain_tiles[amplitude] = Image.fromarray(arr, "RGB")
        return tile


def _add_grain(im: Image.Image, amplitude: int) -> Image.Image:
    tile = _grain_tile(amplitude)
    tw, th = tile.size
    w, h = im.size
    if w <= tw and h <= th:
        # chops work on the overlap of both images: no crop needed
        return ImageChops.add_modulo(im, tile)
    for y in range(0, h, th):
        for x in range(0, w, tw):
            box = (x, y, min(x + tw, w), min(y + th, h))
            im.paste(ImageChops.add_modulo(im.crop(box), tile), box)
    return im


def _smooth_noise(rng: np.random.Generator, h: int, w: int, cells: int) -> np.ndarray:
    """Low-frequency noise in [0, 1]: a few random values bicubically upsampled (a cheap value-noise octave)."""
    gh = max(2, cells)
    gw = max(2, round(cells * w / max(h, 1)))
    grid = (rng.random((gh, gw)) * 255).astype(np.uint8)
    up = Image.fromarray(grid, "L").resize((w, h), Image.BICUBIC)
    return np.asarray(up, dtype=np.float32) * (1.0 / 255.0)


def _colour(rng: np.random.Generator, lo: Sequence[int], hi: Sequence[int]) -> np.ndarray:
    return rng.uniform(lo, hi).astype(np.float32)


_SKIES = {  # (top lo, top hi, horizon lo, horizon hi)
    "day": ((30, 90, 170), (90, 150, 240), (160, 195, 215), (215, 235, 255)),
    "sunset": ((30, 30, 80), (90, 80, 150), (220, 110, 50), (255, 190, 120)),
    "overcast": ((140, 145, 155), (190, 195, 205), (185, 190, 195), (230, 232, 235)),
}
_GROUNDS = (
    ((50, 90, 30), (110, 150, 80)),  # grass
    ((170, 150, 100), (225, 200, 150)),  # sand
    ((80, 80, 85), (140, 140, 145)),  # street
    ((20, 60, 110), (60, 120, 170)),  # water
)


def _paint_photo(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A landscape-ish or indoor-ish 'photo' at a small size (long side _BASE_LONG)."""
    scale = _BASE_LONG / max(width, height)
    bw, bh = max(8, round(width * scale)), max(8, round(height * scale))
    y = np.linspace(0.0, 1.0, bh, dtype=np.float32)[:, None, None]
    x = np.linspace(0.0, 1.0, bw, dtype=np.float32)[None, :, None]
    scene = ("day", "sunset", "overcast", "indoor")[int(rng.choice(4, p=(0.45, 0.15, 0.2, 0.2)))]
    texture = 0.6 * _smooth_noise(rng, bh, bw, int(rng.integers(3, 7))) + 0.4 * _smooth_noise(
        rng, bh, bw, int(rng.integers(12, 33))
    )
    texture = texture[:, :, None]
    if scene == "indoor":
        wall = _colour(rng, (120, 100, 80), (235, 225, 210))
        floor = _colour(rng, (60, 40, 25), (170, 140, 110))
        split = rng.uniform(0.55, 0.8)
        img = np.where(y < split, wall * (0.85 + 0.25 * y), floor * (0.6 + 0.8 * texture))
    else:
        t_lo, t_hi, h_lo, h_hi = _SKIES[scene]
        top, hor = _colour(rng, t_lo, t_hi), _colour(rng, h_lo, h_hi)
        horizon = rng.uniform(0.3, 0.7)
        sky = top + (hor - top) * np.clip(y / horizon, 0.0, 1.0) ** 0.8
        g_lo, g_hi = _GROUNDS[int(rng.integers(len(_GROUNDS)))]
        ground = _colour(rng, g_lo, g_hi) * (0.55 + 0.9 * texture) * (0.75 + 0.35 * y)
        # a hill line: smooth 1-D noise above the horizon
        k = int(rng.integers(3, 9))
        ridge_line = np.interp(np.linspace(0, 1, bw), np.linspace(0, 1, k), rng.random(k)).astype(np.float32)
        ridge = horizon - rng.uniform(0.02, 0.25) * ridge_line[None, :, None]
        hill = _colour(rng, (30, 50, 30), (110, 120, 100)) * (0.7 + 0.6 * texture)
        img = np.where(y < ridge, sky, np.where(y < horizon, hill, ground))
    # vignette: real lenses darken the corners
    r2 = (x - 0.5) ** 2 + (y - 0.5) ** 2
    img = img * (1.0 - rng.uniform(0.1, 0.45) * r2)
    arr = np.clip(img * ((255 - _GRAIN_MAX) / 255.0), 0, 255 - _GRAIN_MAX).astype(np.uint8)
    im = Image.fromarray(arr, "RGB")
    d = ImageDraw.Draw(im)
    if scene in ("day", "sunset") and rng.random() < 0.5:
        cx, cy, r = rng.uniform(0.1, 0.9) * bw, rng.uniform(0.05, 0.3) * bh, rng.uniform(0.03, 0.08) * bw
        d.ellipse((cx - r, cy - r, cx + r, cy + r), fill=(240, 230, 200))
    for _ in range(int(rng.integers(1, 7))):  # buildings, trees, people-sized blobs, furniture
        # muted colours: half random, half grey, the way real objects look next to saturated primaries
        c = tuple(int(v) for v in 0.5 * rng.integers(10, 240, 3) + 0.5 * rng.integers(60, 160))
        x0, y0 = rng.uniform(-0.1, 0.95) * bw, rng.uniform(0.35, 0.95) * bh
        ow, oh = rng.uniform(0.03, 0.2) * bw, rng.uniform(0.05, 0.35) * bh
        if rng.random() < 0.5:
            d.rectangle(_box(x0, y0 - oh, x0 + ow, y0), fill=c)
        else:
            d.ellipse(_box(x0, y0 - oh, x0 + ow, y0), fill=c)
    return im.filter(ImageFilter.GaussianBlur(0.7))


def _upscale(base: Image.Image, width: int, height: int) -> Image.Image:
    """Bilinear resize to (width, height); for large factors bilinear to half size then pixel doubling, which
    costs a third and is invisible under the grain and JPEG's own 2x2 chroma subsampling."""
    if max(width, height) >= 4 * max(base.size):
        half = base.resize(((width + 1) // 2, (height + 1) // 2), Image.BILINEAR)
        return half.resize((width, height), Image.NEAREST)
    return base.resize((width, height), Image.BILINEAR)


def _box(x0: float, y0: float, x1: float, y1: float) -> tuple[float, float, float, float]:
    # Pillow rejects inverted boxes; at small sizes the layout arithmetic can produce them
    return min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)


def _words(rng: np.random.Generator, n: int) -> str:
    return " ".join(_WORDS[int(i)] for i in rng.integers(0, len(_WORDS), n))


def _paint_graphic(rng: np.random.Generator, width: int, height: int, grain: int) -> Image.Image:
    """A screenshot / chart / diagram at full size: flat colours, lines, text; sometimes a photo panel."""
    dark = rng.random() < 0.25
    bg = tuple(int(v) for v in (rng.integers(15, 45, 3) if dark else rng.integers(225, 256, 3)))
    fg = (225, 225, 225) if dark else (25, 25, 30)
    im = Image.new("RGB", (width, height), bg)
    d = ImageDraw.Draw(im)
    unit = max(3, min(width, height) // 40)
    accent = tuple(int(v) for v in rng.integers(20, 220, 3))
    bar = max(2, unit * 2)
    d.rectangle((0, 0, width, bar), fill=accent)  # title / app bar
    d.text((unit, bar * 0.2), _words(rng, 3).title(), fill=(250, 250, 250), font=_font(unit))
    kind = ("screenshot", "chart", "diagram")[int(rng.integers(3))]
    top = bar + unit
    if kind == "screenshot":
        if rng.random() < 0.5:  # sidebar
            side = int(width * rng.uniform(0.15, 0.3))
            d.rectangle(_box(0, bar, side, height), fill=tuple(max(0, v - 12) for v in bg))
            for k in range(int((height - top) // (unit * 2))):
                d.text((unit, top + k * unit * 2), _words(rng, 1), fill=fg, font=_font(unit))
        else:
            side = 0
        y0 = top
        while y0 < height - unit * 3:
            if rng.random() < 0.3:  # a panel
                ph = int(rng.uniform(4, 12) * unit)
                d.rounded_rectangle(_box(side + unit, y0, width - unit, y0 + ph), radius=unit // 2, outline=accent)
                y0 += ph + unit
            else:
                d.text((side + unit, y0), _words(rng, int(rng.integers(3, 12))), fill=fg, font=_font(unit))
                y0 += int(unit * 1.8)
    elif kind == "chart":
        x0, y0, x1, y1 = unit * 4, top + unit * 2, width - unit * 2, height - unit * 4
        d.line((x0, y0, x0, y1, x1, y1), fill=fg, width=max(1, unit // 6))
        n = int(rng.integers(4, 16))
        bw = (x1 - x0) / (n * 1.4)
        vals = rng.uniform(0.1, 1.0, n)
        for k, v in enumerate(vals):
            bx = x0 + bw * 0.4 + k * bw * 1.4
            d.rectangle(_box(bx, y1 - v * (y1 - y0), bx + bw, y1), fill=accent)
        d.text((x0, y0 - unit * 1.5), _words(rng, 4).title(), fill=fg, font=_font(int(unit * 1.3)))
    else:
        boxes = []
        for _ in range(int(rng.integers(3, 8))):
            bx, by = rng.uniform(0.05, 0.7) * width, rng.uniform(0.15, 0.8) * height
            bw, bh = unit * rng.uniform(6, 14), unit * rng.uniform(2.5, 4)
            d.rectangle((bx, by, bx + bw, by + bh), outline=fg, width=max(1, unit // 8), fill=bg)
            d.text((bx + unit * 0.5, by + unit * 0.5), _words(rng, 2), fill=fg, font=_font(unit))
            boxes.append((bx + bw / 2, by + bh / 2))
        for a, b in zip(boxes, boxes[1:]):
            d.line((*a, *b), fill=accent, width=max(1, unit // 6))
    if rng.random() < 0.35:  # an embedded photo (web page, chat screenshot)
        pw, ph = int(width * rng.uniform(0.25, 0.5)), int(height * rng.uniform(0.2, 0.4))
        if pw >= 16 and ph >= 16:
            photo = _upscale(_paint_photo(rng, pw, ph), pw, ph)
            if grain:
                photo = _add_grain(photo, grain)
            im.paste(photo, (int(rng.uniform(0.3, 0.7) * (width - pw)), int(rng.uniform(0.3, 0.9) * (height - ph))))
    return im


def render(spec: ImageSpec) -> Image.Image:
    """Paint ``spec`` (a Pillow image of the spec's size; RGBA when ``spec.alpha``)."""
    rng = np.random.default_rng(spec.content_seed)
    lossy = spec.format != "png"  # grain would make PNGs huge and slow, and real PNGs rarely have it
    grain = int(rng.choice((6, 9, 12))) if spec.format == "jpeg" else (4 if lossy else 0)
    if spec.style == "photo":
        im = _upscale(_paint_photo(rng, spec.width, spec.height), spec.width, spec.height)
        if grain:
            im = _add_grain(im, grain)
        if rng.random() < 0.25:  # a caption or watermark
            d = ImageDraw.Draw(im)
            size = max(10, spec.height // 25)
            d.text(
                (spec.width * rng.uniform(0.03, 0.5), spec.height * rng.uniform(0.75, 0.92)),
                _words(rng, int(rng.integers(1, 5))),
                fill=(255, 255, 255),
                font=_font(size),
            )
    else:
        im = _paint_graphic(rng, spec.width, spec.height, grain)
    if spec.alpha:  # a cut-out: transparent rounded corners, the way exported UI assets look
        mask = Image.new("L", im.size, 0)
        r = max(2, min(im.size) // 12)
        ImageDraw.Draw(mask).rounded_rectangle((0, 0, im.size[0] - 1, im.size[1] - 1), radius=r, fill=255)
        im.putalpha(mask)
    return im


def encode(im: Image.Image, fmt: str, quality: int | None = None, progressive: bool = False) -> bytes:
    buf = io.BytesIO()
    if fmt == "jpeg":
        im = im if im.mode == "RGB" else im.convert("RGB")
        im.save(buf, "JPEG", quality=quality or 90, progressive=progressive)
    elif fmt == "webp":
        # method 0: the fastest encoder setting; the bytes are still an ordinary lossy WebP
        im.save(buf, "WEBP", quality=quality or 80, method=0)
    elif fmt == "png":
        # zlib level 3: ~2.5x faster than the default 6 on these images for ~35 % more bytes
        im.save(buf, "PNG", compress_level=3)
    else:
        im.save(buf, fmt.upper())
    return buf.getvalue()


def _pool_image(spec: ImageSpec, data: bytes) -> PoolImage:
    return PoolImage(
        id=spec.id,
        format=spec.format,
        width=spec.width,
        height=spec.height,
        data=data,
        hash=content_hash(data),
        mode="RGBA" if spec.alpha else "RGB",
        quality=spec.quality,
    )


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # readers in other processes never see a half-written file


def default_cache_dir() -> Path:
    return paths.home() / "payload-cache"


def generate_pool(
    n: int = 1000,
    seed: int = 0,
    *,
    preset: str = "realistic",
    min_side: int | None = None,
    max_side: int | None = None,
    formats: Mapping[str, float] | None = None,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    workers: int | None = None,
) -> ImagePool:
    """``n`` synthetic images from ``seed`` (see the module doc). ``max_side`` / ``min_side`` override the
    preset's long-side range; ``cache_dir`` defaults to ``mmchaos.paths.home()/payload-cache``."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    if n < 1:
        raise ValueError(f"a pool needs at least one image, got n={n}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    lo, hi = PRESETS[preset]
    hi = hi if max_side is None else max_side
    lo = min(lo if min_side is None else min_side, hi)
    if lo < 16:
        raise ValueError(f"min_side must be >= 16, got {lo}")
    specs = [image_spec(seed, i, min_side=lo, max_side=hi, formats=formats) for i in range(n)]
    folder = None
    if use_cache:
        folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        folder = folder / GENERATOR_VERSION
        folder.mkdir(parents=True, exist_ok=True)

    def build(spec: ImageSpec) -> tuple[PoolImage, bool]:
        path = folder / f"{spec.cache_key()}.{_EXT[spec.format]}" if folder is not None else None
        if path is not None and path.is_file():
            return _pool_image(spec, path.read_bytes()), True
        data = encode(render(spec), spec.format, spec.quality, spec.progressive)
        if path is not None:
            _write_atomic(path, data)
        return _pool_image(spec, data), False

    workers = workers or min(4, os.cpu_count() or 1)
    if workers > 1 and n > 1:
        with ThreadPoolExecutor(workers, thread_name_prefix="mmchaos-pool") as ex:
            results = list(ex.map(build, specs))  # map keeps the order: the pool is the same whatever the timing
    else:
        results = [build(s) for s in specs]
    hits = sum(1 for _, hit in results if hit)
    fmt_txt = ",".join(f"{f}={w:.2f}" for f, w in _normalise_formats(formats))
    return ImagePool(
        images=tuple(im for im, _ in results),
        source=f"generated seed={seed} n={n} sides={lo}-{hi} formats={fmt_txt}",
        generated=len(results) - hits,
        from_cache=hits,
    )


# ---------------------------------------------------------------------------------------------------------------
# the user's images
# ---------------------------------------------------------------------------------------------------------------


def load_image_dir(path: str | Path, *, recursive: bool = True) -> ImagePool:
    """The images under ``path``, sorted by relative path (so index 0 -- the hottest in the reuse model --
    is stable). Raises FileNotFoundError / NotADirectoryError / ValueError with the offending path."""
    root = Path(path).expanduser()
    if not root.exists():
        raise FileNotFoundError(f"image directory {str(root)!r} does not exist")
    if not root.is_dir():
        raise NotADirectoryError(f"{str(root)!r} is not a directory (expected a folder of images)")
    files = sorted(p for p in (root.rglob("*") if recursive else root.iterdir()) if p.is_file())
    files = [p for p in files if not any(part.startswith(".") for part in p.relative_to(root).parts)]
    skipped = [p for p in files if p.suffix.lower() not in IMAGE_EXTENSIONS]
    candidates = [p for p in files if p.suffix.lower() in IMAGE_EXTENSIONS]
    if skipped:
        names = ", ".join(str(p.relative_to(root)) for p in skipped[:5])
        more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        warnings.warn(
            f"{root}: skipped {len(skipped)} file(s) without an image extension: {names}{more}",
            PayloadWarning,
            stacklevel=2,
        )
    if not candidates:
        raise ValueError(
            f"image directory {str(root)!r} has no images (looked for {', '.join(sorted(IMAGE_EXTENSIONS))})"
        )
    images: list[PoolImage] = []
    seen: dict[str, str] = {}
    dupes: list[str] = []
    for p in candidates:
        rel = p.relative_to(root).as_posix()
        try:
            data = p.read_bytes()
        except OSError as e:
            raise ValueError(f"cannot read image file {str(p)!r}: {e}") from e
        try:
            with Image.open(io.BytesIO(data)) as im:
                im.load()  # decode fully: catches truncated files, not only bad headers
                fmt, size, mode = (im.format or "").lower(), im.size, im.mode
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
            raise ValueError(f"image file {str(p)!r} cannot be decoded by Pillow: {e}") from e
        h = content_hash(data)
        if h in seen:
            dupes.append(f"{rel} (= {seen[h]})")
            continue
        seen[h] = rel
        images.append(
            PoolImage(
                id=rel.replace(",", "_"), format=fmt, width=size[0], height=size[1], data=data, hash=h, mode=mode
            )
        )
    if dupes:
        warnings.warn(
            f"{root}: dropped {len(dupes)} byte-identical duplicate(s): {', '.join(dupes[:5])}",
            PayloadWarning,
            stacklevel=2,
        )
    return ImagePool(images=tuple(images), source=str(root.resolve()))


# ---------------------------------------------------------------------------------------------------------------
# one pool per process
# ---------------------------------------------------------------------------------------------------------------

_memo: dict[tuple, ImagePool] = {}
_memo_lock = threading.Lock()


def shared_pool(image_dir: str | Path | None = None, **generate_kwargs) -> ImagePool:
    """The process-wide pool: ``load_image_dir(image_dir)`` when given, else ``generate_pool(**kwargs)``.
    Built once per distinct argument set; every caller (every Locust user) gets the same object."""
    if image_dir is not None:
        if generate_kwargs:
            raise ValueError(f"image_dir and generator arguments are exclusive: {sorted(generate_kwargs)}")
        key: tuple = ("dir", str(Path(image_dir).expanduser().resolve()))
    else:
        key = ("gen", tuple(sorted((k, _hashable(v)) for k, v in generate_kwargs.items())))
    with _memo_lock:  # held while building: concurrent first callers wait for one build instead of racing
        pool = _memo.get(key)
        if pool is None:
            pool = load_image_dir(image_dir) if image_dir is not None else generate_pool(**generate_kwargs)
            _memo[key] = pool
        return pool


def _hashable(v):
    if isinstance(v, Mapping):
        return tuple(sorted(v.items()))
    if isinstance(v, Path):
        return str(v)
    return v


def clear_shared_pools() -> None:
    with _memo_lock:
        _memo.clear()


# ---------------------------------------------------------------------------------------------------------------
# fresh images
# ---------------------------------------------------------------------------------------------------------------


def fresh_image(base: PoolImage, token: str | bytes | None = None) -> PoolImage:
    """``base`` with a unique 16x8-cell black/white stamp (128 bits of sha256(token)) in its top-left corner,
    re-encoded in the same format. Different tokens give different pixels, so the server sees a new item
    whether it hashes the bytes or the decoded pixels. ``token=None`` -> a random one (uuid4); pass a token
    such as ``f"{run}/{worker}/{user}/{seq}"`` for reproducible runs. The pixels are those of decoding the
    base, pasting the stamp and encoding again; :mod:`payloads.fresh` gets them without re-encoding the whole
    image where the format allows (PNG, JPEG: a fraction of a millisecond instead of 5-50 ms)."""
    from payloads import fresh

    if token is None:
        token = uuid.uuid4().bytes
    digest = hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()
    data, fmt, mode = fresh.fresh_data(base, digest, encode)
    return PoolImage(
        id=f"{base.id}~{digest.hex()[:12]}",
        format=fmt,
        width=base.width,
        height=base.height,
        data=data,
        hash=content_hash(data),
        mode=mode,
        quality=base.quality,
    )
