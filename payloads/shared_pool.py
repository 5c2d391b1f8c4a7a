"""One image pool per process: every Locust user of a process shares it, built once per distinct argument set."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

from .generated import generate_pool
from .pool import ImagePool
from .user_images import load_image_dir

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
