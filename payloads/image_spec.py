"""What a generated image will be, decided before it is painted: format, size, quality, style, seeds. Depends on
``(seed, index, sizes, formats)`` only, so pools of different sizes share their first images."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import PIL

# Bump when the rendering changes: it is part of every cache key, so old cache files are never mixed in.
GENERATOR_VERSION = "gen-v1"

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

EXTENSIONS = {"jpeg": "jpg", "png": "png", "webp": "webp"}
PAGES_MAX = 64  # pages a generated document may have (ids: document * PAGES_MAX + page)
PAGE_ASPECT = 2**0.5  # ISO 216 (A4): height / width


@dataclass(frozen=True)
class ImageSpec:
    seed: int
    index: int
    format: str
    width: int
    height: int
    quality: int | None
    style: str  # photo | graphic | page
    alpha: bool
    progressive: bool
    content_seed: int

    @property
    def id(self) -> str:
        if self.style == "page":  # page_spec's index: document * PAGES_MAX + page
            return f"d{self.seed}-{self.index // PAGES_MAX:04d}-p{self.index % PAGES_MAX:02d}"
        return f"g{self.seed}-{self.index:05d}"

    def cache_key(self) -> str:
        # Pillow's version is in the key: another libjpeg/libwebp may encode different bytes
        blob = json.dumps([GENERATOR_VERSION, PIL.__version__, self.__dict__], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]


def normalise_formats(formats: Mapping[str, float] | None) -> tuple[tuple[str, float], ...]:
    formats = dict(DEFAULT_FORMATS if formats is None else formats)
    unknown = sorted(set(formats) - set(EXTENSIONS))
    if unknown:
        raise ValueError(f"unknown image format(s) {unknown}; generated pools support {sorted(EXTENSIONS)}")
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
    fmts = normalise_formats(formats)
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


def page_spec(seed: int, document: int, page: int, long_side: int) -> ImageSpec:
    """The spec of page ``page`` of generated document ``document``: portrait A4 of ``long_side`` px, a scan (JPEG,
    grain) for one document in two, a rendered PDF page (PNG) for the other; depends on its arguments only."""
    if not 0 <= page < PAGES_MAX:
        raise ValueError(f"a generated document has at most {PAGES_MAX} pages, got page {page}")
    scanned = np.random.default_rng([0x7061, seed, document]).random() < 0.5  # the whole document is one or other
    rng = np.random.default_rng([0x7061, seed, document, page])
    return ImageSpec(
        seed=seed,
        index=document * PAGES_MAX + page,
        format="jpeg" if scanned else "png",
        width=max(16, round(long_side / PAGE_ASPECT)),
        height=long_side,
        quality=int(rng.integers(75, 92)) if scanned else None,
        style="page",
        alpha=False,
        progressive=False,
        content_seed=int(rng.integers(0, 2**63 - 1)),
    )
