"""Unit tests of mmchaos/sameness.py: which requests are the same input, and when two answers agree (no server)."""

from __future__ import annotations

import base64
import hashlib
import math

import numpy as np
import pytest

from mmchaos import sameness

PNG = b"\x89PNG\r\n\x1a\nnot really an image"
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()
H = hashlib.sha256(PNG).hexdigest()[:16]


def _chat(url=DATA_URL, text="describe"):
    return [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}
    ]


def test_media_hash_is_the_requests_tables_hash_of_the_decoded_bytes():
    assert sameness.media_hash(DATA_URL) == H == sameness.content_hash(PNG)
    # a URL that is not data: is hashed as its text (the server fetches it; we never saw its bytes)
    assert sameness.media_hash("http://127.0.0.1/x.png") == sameness.content_hash(b"http://127.0.0.1/x.png")


def test_forms_that_say_the_same_thing_share_a_key():
    body = {"model": "m", "messages": _chat()}
    key = sameness.input_key("/v1/embeddings", body)
    assert sameness.input_key("/v1/embeddings", {"model": "m", "input": _chat()}) == key  # input as messages
    assert sameness.input_keys("/v1/embeddings", {"model": "m", "messages": [_chat(), _chat(text="x")]})[0] == key
    cohere = {"model": "m", "inputs": [{"content": _chat()[0]["content"]}]}
    assert sameness.input_key("/v2/embed", cohere) == key  # vLLM builds the same conversation from it
    # the image by its content: another encoding of the URL (the hash the recorder kept) is the same input
    assert (
        sameness.input_key(
            "http://127.0.0.1:8000/v1/embeddings", {"model": "m", "messages": _chat("u")}, image_hashes=[H]
        )
        == key
    )
    # how the answer is written or who asks changes nothing
    assert sameness.input_key("/v1/embeddings", {**body, "encoding_format": "base64", "user": "u"}) == key


def test_anything_that_changes_the_answer_splits_keys():
    body = {"model": "m", "messages": _chat()}
    key = sameness.input_key("/v1/embeddings", body)
    other_image = "data:image/png;base64," + base64.b64encode(PNG + b"!").decode()
    different = [
        {"model": "m", "messages": _chat(other_image)},
        {"model": "m", "messages": _chat(text="describe.")},
        {"model": "m2", "messages": _chat()},
        {**body, "dimensions": 32},
        {**body, "normalize": True},  # a default written out is not assumed to be the default
        {**body, "some_future_field": 1},  # an unknown field can only split keys
    ]
    keys = {sameness.input_key("/v1/embeddings", b) for b in different}
    assert key not in keys and len(keys) == len(different)
    assert sameness.input_key("/pooling", body) != key  # another route's kind of answer


def test_an_empty_text_part_is_the_same_input_as_none():
    # it renders to nothing (a hunt met one /v2/embed answering [image] and [image, ""] alike, and called it a collapse)
    with_empty = [{"role": "user", "content": [*_chat()[0]["content"][:1], {"type": "text", "text": ""}]}]
    alone = [{"role": "user", "content": _chat()[0]["content"][:1]}]
    assert sameness.input_key("/v1/embeddings", {"model": "m", "messages": with_empty}) == sameness.input_key(
        "/v1/embeddings", {"model": "m", "messages": alone}
    )


def test_text_forms_and_batches():
    one = sameness.input_key("/v1/embeddings", {"model": "m", "input": "hello"})
    assert sameness.input_keys("/v1/embeddings", {"model": "m", "input": ["hello", "bye"]})[0] == one
    assert sameness.input_key("/v1/embeddings", {"model": "m", "input": [1, 2, 3]}) != one
    batch = sameness.input_keys("/v1/embeddings", {"model": "m", "input": ["a", "b", "a"]})
    assert len(batch) == 3 and batch[0] == batch[2] != batch[1]
    # a batch's key is not the key of any one of its items
    assert sameness.input_key("/v1/embeddings", {"model": "m", "input": ["hello", "bye"]}) != one


def test_more_hashes_than_media_items_is_an_error():
    with pytest.raises(ValueError, match="2 media hashes"):
        sameness.input_keys("/v1/embeddings", {"model": "m", "messages": _chat()}, image_hashes=[H, H])


def test_agree_and_collapse_thresholds():
    rng = np.random.default_rng(0)
    v = rng.standard_normal(64).astype(np.float32)
    v /= np.linalg.norm(v)
    # bf16 rounding of the same vector (8 bits of mantissa) agrees
    bf16 = (v.view(np.uint32) & 0xFFFF0000).view(np.float32)
    assert sameness.agree(v, bf16)
    # another input's vector does not
    w = rng.standard_normal(64).astype(np.float32)
    assert not sameness.agree(v, w)
    assert not sameness.agree(v, v[:32]) and math.isnan(sameness.cosine(v, v[:32]))
    assert not sameness.agree(v, np.full(64, np.nan))
    assert sameness.collapsed(v, v.copy()) and not sameness.collapsed(v, w)
    # a small perturbation still agrees but is not a collapse
    near = v + 0.005 * w / np.linalg.norm(w)
    assert sameness.agree(v, near) and not sameness.collapsed(v, near)


def test_vectors_reads_floats_base64_and_cohere():
    v = np.arange(4, dtype=np.float32)
    floats = {"data": [{"index": 1, "embedding": [9.0, 9, 9, 9]}, {"index": 0, "embedding": v.tolist()}]}
    assert np.array_equal(sameness.vectors(floats)[0], v)  # ordered by index
    b64 = {"data": [{"index": 0, "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()}]}
    assert np.array_equal(sameness.vectors(b64, {"encoding_format": "base64", "endianness": "little"})[0], v)
    bf = (v.view(np.uint32) >> 16).astype(">u2").tobytes()
    out = sameness.vectors(
        {"data": [{"embedding": base64.b64encode(bf).decode()}]}, {"embed_dtype": "bfloat16", "endianness": "big"}
    )[0]
    assert np.array_equal(out, v)
    assert np.array_equal(sameness.vectors({"embeddings": {"float": [v.tolist()]}})[0], v)
    with pytest.raises(ValueError):
        sameness.vectors({"object": "error"})


def test_scores_of_score_and_rerank_answers_in_input_order_and_how_close_is_the_same():
    score = {"data": [{"index": 1, "object": "score", "score": 0.25}, {"index": 0, "object": "score", "score": 0.9}]}
    rerank = {"results": [{"index": 0, "relevance_score": 0.5}, {"index": 1, "relevance_score": 0.1}]}
    assert sameness.scores(score) == [0.9, 0.25] and sameness.scores(rerank) == [0.5, 0.1]
    with pytest.raises(ValueError):
        sameness.scores({"data": [{"index": 0, "embedding": [1.0]}]})  # an embedding is no score
    assert sameness.scores_agree(0.9, 0.9 + sameness.SCORE_ATOL / 2)
    assert not sameness.scores_agree(0.9, 0.8) and not sameness.scores_agree(float("nan"), 0.9)
