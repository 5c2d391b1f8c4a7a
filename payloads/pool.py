"""The image pool's types: what the load generator uploads, as encoded files with their ids and hashes."""

from __future__ import annotations

import base64
import functools
import urllib.parse
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from mmchaos import sameness

MIME = {
    "jpeg": "image/jpeg",
    "png": "image/png",
    "webp": "image/webp",
    "gif": "image/gif",
    "bmp": "image/bmp",
    "tiff": "image/tiff",
}


class PayloadWarning(UserWarning):
    """Something in the user's payload input was skipped or changed."""


class DataURL(str):
    """A data URL built by mmchaos whose text has no character JSON would escape: ASCII, no quote, backslash or
    control character (base64 or percent-encoding and a plain MIME type). :func:`.bodies.encode_body`
    copies such strings into the request body as they are instead of scanning them again for every request.
    Only wrap text that is JSON-safe by construction."""

    __slots__ = ()

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


class ImageURL(DataURL):
    """The data URL of a pool image, or of a fresh variant of one, that also says which image it is (``ref``): a
    trace stores each image once, and a fresh one as the recipe that makes it again, instead of the URL per
    request. (A str subclass cannot have ``__slots__``; the one attribute is set by :attr:`PoolImage.data_url`.)"""

    ref: ImageRef


class DerivedURL(DataURL):
    """A URL made from an image's bytes by a malformed case (truncated, broken base64, percent-encoded): a trace
    keeps only how it differs from ``source`` (the image's URL) written in ``encoding``."""

    source: ImageURL
    encoding: str  # "base64" (the source URL as sent) or "percent" (percent_encoded of the image's bytes)


def derived_url(text: str, image: PoolImage, encoding: str = "base64") -> DerivedURL:
    url = DerivedURL(text)
    url.source, url.encoding = image.data_url, encoding
    return url


@functools.lru_cache(maxsize=64)
def percent_encoded(data: bytes) -> str:
    # quote_from_bytes works byte by byte in Python (~5 ms for 100 kB); pool images come back again and again.
    # Its output is letters, digits, "_.-~/" and %XX: nothing JSON escapes (a DataURL may hold it)
    return urllib.parse.quote_from_bytes(data)


def url_text(url: ImageURL, encoding: str, data: bytes | None = None) -> str:
    """An image's URL written in ``encoding``: what a DerivedURL of it is derived from."""
    if encoding == "base64":
        return str(url)
    head = url.partition(";")[0]  # "data:<mime>"
    return f"{head},{percent_encoded(data if data is not None else base64.b64decode(url.partition(',')[2]))}"


@dataclass(frozen=True)
class ImageRef:
    """What a trace needs to know of an image beyond its URL: no pixels, so it costs nothing to keep."""

    hash: str
    mime: str
    format: str
    width: int
    height: int
    mode: str
    quality: int | None
    base: ImageURL | None = None  # a fresh image: the pool image it was made from...
    token: bytes | None = None  # ...and the stamp's token (see fresh.fresh_image)
    spec: object = None  # a generated image: its ImageSpec (it is made again from it)


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
    # a fresh image: (the data URL of the image it was made from, the stamp's token); see fresh.fresh_image
    recipe: tuple[ImageURL, bytes] | None = field(default=None, repr=False, compare=False)
    spec: object = field(default=None, repr=False, compare=False)  # a generated image: its image_spec.ImageSpec

    @property
    def mime(self) -> str:
        return MIME.get(self.format, f"image/{self.format}")

    @property
    def nbytes(self) -> int:
        return len(self.data)

    @cached_property
    def data_url(self) -> ImageURL:
        # computed once per image and kept (a third more memory than the encoded file): a load test sends each
        # pool image again and again, and base64 of a big image costs ~1 ms
        url = ImageURL(f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}")
        base, token = self.recipe or (None, None)
        url.ref = ImageRef(
            self.hash, self.mime, self.format, self.width, self.height, self.mode, self.quality, base, token, self.spec
        )
        return url


@dataclass(frozen=True)
class ImagePool(Sequence[PoolImage]):
    images: tuple[PoolImage, ...]
    source: str  # "generated seed=… preset=…" or the directory
    generated: int = 0  # images rendered by this build
    from_cache: int = 0  # images read from the disk cache by this build

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i]

    def __iter__(self) -> Iterator[PoolImage]:
        return iter(self.images)

    def by_id(self, image_id: str) -> PoolImage:
        for im in self.images:
            if im.id == image_id:
                return im
        raise KeyError(f"no image {image_id!r} in pool ({self.source})")

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


content_hash = sameness.content_hash  # the rows' media hash: its one home is mmchaos.sameness
