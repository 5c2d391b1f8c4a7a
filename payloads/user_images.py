"""The user's own images as a pool.

Policy: files whose extension is not an image extension are skipped with one :class:`PayloadWarning`; files with an
image extension that Pillow cannot decode are an error naming the file (a broken ``.jpg`` in a dataset is a mistake
worth stopping for); byte-identical duplicates are dropped with a warning (hidden reuse would distort the reuse
model).
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

from PIL import Image

from .pool import ImagePool, PayloadWarning, PoolImage, content_hash

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"})


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
            PoolImage(id=rel.replace(",", "_"), format=fmt, width=size[0], height=size[1], data=data, hash=h, mode=mode)
        )
    if dupes:
        warnings.warn(
            f"{root}: dropped {len(dupes)} byte-identical duplicate(s): {', '.join(dupes[:5])}",
            PayloadWarning,
            stacklevel=2,
        )
    return ImagePool(images=tuple(images), source=str(root.resolve()))
