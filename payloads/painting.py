"""Painting synthetic images that look like real uploads: photos (sky, horizon, hills, textured ground, objects,
film grain, sometimes a caption), graphics (screenshots, charts, diagrams with flat colours and text, sometimes an
embedded photo) and document pages (text, figures, tables). numpy at a small size plus Pillow drawing: everything
vectorised or in C."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageChops, ImageDraw, ImageFilter, ImageFont

if TYPE_CHECKING:
    from .image_spec import ImageSpec

_GRAIN_MAX = 12  # photos are scaled to [0, 255 - _GRAIN_MAX] so adding grain never wraps
_BASE_LONG = 128  # photos are painted at this long side, then resized up (cheap, and photos are smooth anyway)

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
    up = Image.fromarray(grid, "L").resize((w, h), Image.Resampling.BICUBIC)
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
        half = base.resize(((width + 1) // 2, (height + 1) // 2), Image.Resampling.BILINEAR)
        return half.resize((width, height), Image.Resampling.NEAREST)
    return base.resize((width, height), Image.Resampling.BILINEAR)


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
        for a, b in itertools.pairwise(boxes):
            d.line((*a, *b), fill=accent, width=max(1, unit // 6))
    if rng.random() < 0.35:  # an embedded photo (web page, chat screenshot)
        pw, ph = int(width * rng.uniform(0.25, 0.5)), int(height * rng.uniform(0.2, 0.4))
        if pw >= 16 and ph >= 16:
            photo = _upscale(_paint_photo(rng, pw, ph), pw, ph)
            if grain:
                photo = _add_grain(photo, grain)
            im.paste(photo, (int(rng.uniform(0.3, 0.7) * (width - pw)), int(rng.uniform(0.3, 0.9) * (height - ph))))
    return im


def _paint_page(rng: np.random.Generator, width: int, height: int, grain: int) -> Image.Image:
    """A document page as a scanner or a PDF renderer gives it: white paper, margins, a heading, paragraphs of
    text lines, sometimes a figure or a table, a page number."""
    im = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(236, 256, 3)))
    d = ImageDraw.Draw(im)
    margin, unit = width // 10, max(4, width // 70)  # a line of body text: ~70 per page width
    ink = (20, 20, 25)
    y = margin
    d.text((margin, y), _words(rng, int(rng.integers(2, 6))).title(), fill=ink, font=_font(unit * 2))
    y += unit * 4
    while y < height - margin - unit * 2:
        u = rng.random()
        if u < 0.12 and y < height - margin - unit * 14:  # a figure: a chart or a diagram, as graphics are painted
            fh = int(unit * rng.uniform(8, 16))
            fig = _paint_graphic(rng, width - 2 * margin, fh, 0)
            im.paste(fig, (margin, y))
            y += fh + unit * 2
        elif u < 0.2 and y < height - margin - unit * 10:  # a table
            rows, cols = int(rng.integers(3, 8)), int(rng.integers(2, 6))
            cw = (width - 2 * margin) / cols
            for r in range(rows):
                for c in range(cols):
                    box = _box(margin + c * cw, y + r * unit * 1.6, margin + (c + 1) * cw, y + (r + 1) * unit * 1.6)
                    d.rectangle(box, outline=ink)
                    d.text((box[0] + unit * 0.3, box[1] + unit * 0.2), _words(rng, 1), fill=ink, font=_font(unit))
            y += int(rows * unit * 1.6) + unit * 2
        else:  # a paragraph
            for _ in range(int(rng.integers(3, 9))):
                if y >= height - margin - unit * 2:
                    break
                d.text((margin, y), _words(rng, int(rng.integers(8, 14))), fill=ink, font=_font(unit))
                y += int(unit * 1.5)
            y += unit
    d.text((width // 2, height - margin // 2), str(int(rng.integers(1, 300))), fill=ink, font=_font(unit))
    return _add_grain(im, grain) if grain else im


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
    elif spec.style == "page":
        im = _paint_page(rng, spec.width, spec.height, grain)
    else:
        im = _paint_graphic(rng, spec.width, spec.height, grain)
    if spec.alpha:  # a cut-out: transparent rounded corners, the way exported UI assets look
        mask = Image.new("L", im.size, 0)
        r = max(2, min(im.size) // 12)
        ImageDraw.Draw(mask).rounded_rectangle((0, 0, im.size[0] - 1, im.size[1] - 1), radius=r, fill=255)
        im.putalpha(mask)
    return im
