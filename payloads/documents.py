"""Documents for visual-document retrieval: each a few to tens of page images, embedded one page per input in one
request, re-sent as a retrieval service re-indexes its corpus.

A page count is drawn per document from a log-normal distribution with the median ``pages`` and sigma 0.7, rounded
and kept within [2, PAGES_MAX_DRAWN]: with the default median of 8 pages, half the documents have 5 to 13 pages and
one in a hundred is cut at 40 (papers, manuals, contracts). Pages are portrait A4 (image_spec.page_spec), a scan in
JPEG or a rendered PDF page in PNG, generated once and cached on disk as the image pool is. Which document is sent
follows the mix's reuse model (a Zipf hot set; ``--fresh-fraction`` of them never-seen documents, whose pages are
pool pages with a stamp of their own, as fresh images are made).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .generated import build_images
from .image_spec import page_spec
from .pool import PoolImage

PAGES_MAX_DRAWN = 40
PAGES_SIGMA = 0.7


@dataclass(frozen=True)
class Document:
    index: int
    pages: tuple[PoolImage, ...]


def page_counts(n: int, seed: int, median: int) -> list[int]:
    """The page count of each of ``n`` documents (see the module doc)."""
    if median < 1:
        raise ValueError(f"the median page count must be >= 1, got {median}")
    rng = np.random.default_rng([0x646F63, seed])
    drawn = np.rint(rng.lognormal(np.log(median), PAGES_SIGMA, n)).astype(int)
    return np.clip(drawn, 2, PAGES_MAX_DRAWN).tolist()


@functools.cache
def document_pool(n: int, seed: int, median_pages: int, page_side: int) -> tuple[Document, ...]:
    """``n`` documents from ``seed`` (one per process and arguments: every user of a Locust process shares them)."""
    if n < 1:
        raise ValueError(f"a document pool needs at least one document, got {n}")
    counts = page_counts(n, seed, median_pages)
    specs = [page_spec(seed, d, p, page_side) for d, k in enumerate(counts) for p in range(k)]
    pages, _ = build_images(specs)
    out, at = [], 0
    for d, k in enumerate(counts):
        out.append(Document(d, pages[at : at + k]))
        at += k
    return tuple(out)
