"""Documents in the mix: page counts from the stated distribution, page images made once and the same from the
same seed, each page one input of one request, documents re-sent as a corpus is re-indexed, fresh ones never."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import traffic_of

from mmchaos.locustfiles.plugin.traffic import Traffic, UserTraffic
from mmchaos.payloads import documents
from mmchaos.payloads.image_spec import page_spec

pytestmark = pytest.mark.unit


def test_page_counts_follow_the_stated_distribution():
    counts = np.array(documents.page_counts(4000, 1, 8))
    assert counts.min() >= 2 and counts.max() <= documents.PAGES_MAX_DRAWN
    assert np.median(counts) == 8
    assert 0.4 < ((counts >= 5) & (counts <= 13)).mean() < 0.75  # half within a factor of 1.6 of the median
    assert documents.page_counts(10, 1, 8) == documents.page_counts(10, 1, 8)
    with pytest.raises(ValueError, match="median"):
        documents.page_counts(3, 1, 0)


def test_a_page_is_an_a4_page_and_one_document_is_one_kind_of_page():
    specs = [page_spec(3, 5, p, 1000) for p in range(4)]
    assert {(s.width, s.height) for s in specs} == {(707, 1000)}
    assert len({s.format for s in specs}) == 1 and {s.id for s in specs} == {f"d3-0005-p0{p}" for p in range(4)}
    with pytest.raises(ValueError, match="at most"):
        page_spec(3, 5, 64, 1000)


def _traffic(**over) -> Traffic:
    return traffic_of.traffic(**{**traffic_of.only(), **over})


def test_the_mix_sends_documents_page_by_page_repeated_and_fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("MMCHAOS_HOME", str(tmp_path))  # its own disk cache of pages
    t = _traffic(weight_document=1, doc_pool_size=5, doc_pages=4, page_side=256, fresh_fraction=0.2)
    assert len(t.documents) == 5 and all(p.height == 256 for d in t.documents for p in d.pages)
    u = UserTraffic(t, 1, 0, 0, "m")
    reqs = [u.build(u.next_kind()) for _ in range(150)]
    assert {r.meta.kind for r in reqs} == {"document"}
    # one input (a conversation of one page image) per page, in the page order of its document
    for r in reqs:
        assert len(r.body["messages"]) == len(r.meta.image_hashes) == r.meta.n_inputs
    by_pages = pd.Series([r.meta.image_hashes for r in reqs])
    pool = {tuple(p.hash for p in d.pages) for d in t.documents}
    fresh = by_pages[~by_pages.isin(pool)]
    assert set(by_pages[by_pages.isin(pool)]) == pool  # every document is indexed again and again
    assert 15 < len(fresh) < 50 and fresh.is_unique  # ~20 % never-seen documents, never repeated
    assert len({h for pages in fresh for h in pages}) == sum(len(p) for p in fresh)  # fresh pages: unique too


def test_documents_are_made_only_when_sent():
    assert _traffic(weight_valid_image=1).documents == ()
