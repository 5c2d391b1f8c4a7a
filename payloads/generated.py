"""Generated image pools: synthetic images that look like real uploads, deterministic from a seed.

Long side log-uniform in ``[min_side, max_side]`` (a preset's range, 256-2048 px for ``realistic``), common
aspect ratios in both orientations, 70 % JPEG (quality 70-95), 20 % PNG (a fifth of them with alpha), 10 % WebP
(quality 75-85). Each image is rendered from ``(seed, index)`` alone, so pools of different sizes share their
first images. Encoded files are cached on disk (``<cache_dir>/<GENERATOR_VERSION>/<key>.<ext>``), so a second
build only reads files.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mmchaos import paths
from mmchaos.options import IMAGE_PRESETS

from .encode import encode
from .image_spec import EXTENSIONS, GENERATOR_VERSION, ImageSpec, image_spec, normalise_formats
from .painting import render
from .pool import ImagePool, PoolImage, content_hash


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
        spec=spec,
    )


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # readers in other processes never see a half-written file


def image_data(spec: ImageSpec, folder: Path | None = None) -> tuple[bytes, bool]:
    """The encoded file of ``spec`` (from the disk cache ``folder`` when there), and whether it was cached."""
    path = folder / f"{spec.cache_key()}.{EXTENSIONS[spec.format]}" if folder is not None else None
    if path is not None and path.is_file():
        return path.read_bytes(), True
    data = encode(render(spec), spec.format, spec.quality, spec.progressive)
    if path is not None:
        _write_atomic(path, data)
    return data, False


def default_cache_dir() -> Path:
    return paths.home() / "payload-cache"


def cache_folder(cache_dir: str | Path | None = None) -> Path:
    """Where encoded files of this generator version are cached (made if missing)."""
    folder = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / GENERATOR_VERSION
    folder.mkdir(parents=True, exist_ok=True)
    return folder


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
    if preset not in IMAGE_PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(IMAGE_PRESETS)}")
    if n < 1:
        raise ValueError(f"a pool needs at least one image, got n={n}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    lo, hi = IMAGE_PRESETS[preset]
    hi = hi if max_side is None else max_side
    lo = min(lo if min_side is None else min_side, hi)
    if lo < 16:
        raise ValueError(f"min_side must be >= 16, got {lo}")
    specs = [image_spec(seed, i, min_side=lo, max_side=hi, formats=formats) for i in range(n)]
    images, hits = build_images(specs, cache_dir, use_cache, workers)
    fmt_txt = ",".join(f"{f}={w:.2f}" for f, w in normalise_formats(formats))
    return ImagePool(
        images=images,
        source=f"generated seed={seed} n={n} sides={lo}-{hi} formats={fmt_txt}",
        generated=len(images) - hits,
        from_cache=hits,
    )


def build_images(
    specs: Sequence[ImageSpec],
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    workers: int | None = None,
) -> tuple[tuple[PoolImage, ...], int]:
    """The images of ``specs``, in order (painted on ``workers`` threads, or read from the disk cache), and how
    many came from the cache."""
    folder = cache_folder(cache_dir) if use_cache else None

    def build(spec: ImageSpec) -> tuple[PoolImage, bool]:
        data, hit = image_data(spec, folder)
        return _pool_image(spec, data), hit

    workers = workers or min(4, os.cpu_count() or 1)
    if workers > 1 and len(specs) > 1:
        with ThreadPoolExecutor(workers, thread_name_prefix="mmchaos-pool") as ex:
            results = list(ex.map(build, specs))  # map keeps the order: the pool is the same whatever the timing
    else:
        results = [build(s) for s in specs]
    return tuple(im for im, _ in results), sum(1 for _, hit in results if hit)
