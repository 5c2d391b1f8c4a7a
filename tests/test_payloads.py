"""Fast unit tests of payloads/: image pool, reuse model, request builders, malformed catalogue (no vLLM)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import math
import tracemalloc
import warnings
from collections import Counter

import gevent
import numpy as np
import pytest
from gevent.event import Event
from gevent.lock import BoundedSemaphore
from PIL import Image

from mmchaos import schema
from mmchaos.payloads import bodies as rq
from mmchaos.payloads import catalogue as cases_module
from mmchaos.payloads import (
    encode,
    fresh,
    generated,
    image_spec,
    malformed,
    mutations,
    patches,
    reuse,
    shared_pool,
    user_images,
)
from mmchaos.payloads.pool import PayloadWarning

PIL_FORMAT = {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("payload-cache")


@pytest.fixture(scope="module")
def small_pool(cache_dir):
    return generated.generate_pool(40, seed=7, preset="small", cache_dir=cache_dir)


def _one_of_each(pool):
    by_fmt = {}
    for im in pool:
        by_fmt.setdefault(im.format, im)
    return by_fmt


# ---------------------------------------------------------------------------------------------------- images


def test_pool_is_deterministic_from_seed(small_pool, tmp_path):
    again = generated.generate_pool(40, seed=7, preset="small", use_cache=False)
    assert [im.hash for im in again] == [im.hash for im in small_pool]
    assert [im.id for im in again] == [im.id for im in small_pool]
    other = generated.generate_pool(40, seed=8, preset="small", cache_dir=tmp_path)
    assert not {im.hash for im in other} & {im.hash for im in small_pool}


def test_pool_images_are_distinct_and_prefix_stable(small_pool, cache_dir):
    assert len({im.hash for im in small_pool}) == len(small_pool)
    assert len({im.id for im in small_pool}) == len(small_pool)
    head = generated.generate_pool(10, seed=7, preset="small", cache_dir=cache_dir)
    assert [im.hash for im in head] == [im.hash for im in small_pool[:10]]


def test_images_decode_at_reported_size_and_format(small_pool):
    for im in small_pool:
        with Image.open(io.BytesIO(im.data)) as pil:
            pil.load()
            assert pil.format == PIL_FORMAT[im.format], im.id
            assert pil.size == (im.width, im.height), im.id
            assert pil.mode == im.mode, im.id
        assert im.hash == hashlib.sha256(im.data).hexdigest()[:16]
        head, _, b64 = im.data_url.partition(",")
        assert head == f"data:image/{im.format};base64"
        assert base64.b64decode(b64, validate=True) == im.data
        assert "," not in im.id
    assert {"jpeg", "png"} <= {im.format for im in small_pool}


def test_specs_follow_the_size_aspect_and_format_distribution():
    specs = [image_spec.image_spec(3, i) for i in range(3000)]
    fmt = Counter(s.format for s in specs)
    for f, share in image_spec.DEFAULT_FORMATS.items():
        assert abs(fmt[f] / len(specs) - share) < 0.03, (f, fmt)
    longs = np.array([max(s.width, s.height) for s in specs])
    assert longs.min() >= 255 and longs.max() <= 2049
    # log-uniform: log(long side) is uniform, so its quartiles sit at 1/4, 1/2, 3/4 of the log range
    lo, hi = math.log(256), math.log(2048)
    q = np.quantile(np.log(longs), [0.25, 0.5, 0.75])
    assert np.allclose(q, [lo + (hi - lo) * k for k in (0.25, 0.5, 0.75)], atol=0.12)
    ratios = {(a, b) for a, b, _ in image_spec.ASPECTS}
    for s in specs:
        r = s.width / s.height
        assert any(abs(r - a / b) < 0.02 for a, b in ratios), (s.width, s.height)
    assert sum(s.width > s.height for s in specs) > 0.3 * len(specs)  # landscape
    assert sum(s.width < s.height for s in specs) > 0.2 * len(specs)  # portrait
    jq = [s.quality for s in specs if s.format == "jpeg"]
    wq = [s.quality for s in specs if s.format == "webp"]
    assert min(jq) >= 70 and max(jq) <= 95 and len(set(jq)) > 20
    assert min(wq) >= 75 and max(wq) <= 85
    assert all(s.quality is None for s in specs if s.format == "png")
    assert 0.1 < np.mean([s.alpha for s in specs if s.format == "png"]) < 0.3


def test_max_side_knob_and_realistic_render(tmp_path):
    pool = generated.generate_pool(6, seed=1, preset="realistic", max_side=400, cache_dir=tmp_path)
    assert all(max(im.width, im.height) <= 400 for im in pool)
    assert all(max(im.width, im.height) >= 255 for im in pool)
    with pytest.raises(ValueError, match="preset"):
        generated.generate_pool(2, preset="huge")
    with pytest.raises(ValueError, match="seed"):
        generated.generate_pool(2, seed=-1)


def test_formats_weights_are_respected(tmp_path):
    pool = generated.generate_pool(6, seed=2, preset="small", formats={"webp": 1.0}, cache_dir=tmp_path)
    assert {im.format for im in pool} == {"webp"}
    with pytest.raises(ValueError, match="unknown image format"):
        generated.generate_pool(2, preset="small", formats={"gif": 1.0}, use_cache=False)


def test_disk_cache_files_are_reused(tmp_path):
    first = generated.generate_pool(12, seed=11, preset="small", cache_dir=tmp_path)
    files = sorted((tmp_path / image_spec.GENERATOR_VERSION).iterdir())
    assert first.generated == 12 and first.from_cache == 0
    assert len(files) == 12
    mtimes = {f: f.stat().st_mtime_ns for f in files}
    second = generated.generate_pool(12, seed=11, preset="small", cache_dir=tmp_path)
    assert second.generated == 0 and second.from_cache == 12
    assert sorted((tmp_path / image_spec.GENERATOR_VERSION).iterdir()) == files
    assert {f: f.stat().st_mtime_ns for f in files} == mtimes  # read, not rewritten
    assert [im.hash for im in second] == [im.hash for im in first]


def test_no_cache_writes_nothing_and_default_dir_follows_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MMCHAOS_HOME", str(tmp_path))
    assert generated.default_cache_dir() == tmp_path.resolve() / "payload-cache"
    generated.generate_pool(3, seed=1, preset="small", use_cache=False)
    assert not (tmp_path / "payload-cache").exists()
    generated.generate_pool(3, seed=1, preset="small")
    assert len(list((tmp_path / "payload-cache" / image_spec.GENERATOR_VERSION).iterdir())) == 3


def test_shared_pool_is_built_once_per_process(tmp_path):
    shared_pool.clear_shared_pools()
    a = shared_pool.shared_pool(n=4, seed=5, preset="small", cache_dir=tmp_path)
    b = shared_pool.shared_pool(n=4, seed=5, preset="small", cache_dir=tmp_path)
    c = shared_pool.shared_pool(n=4, seed=6, preset="small", cache_dir=tmp_path)
    assert a is b and a is not c
    shared_pool.clear_shared_pools()
    assert shared_pool.shared_pool(n=4, seed=5, preset="small", cache_dir=tmp_path) is not a


def test_fresh_images_are_new_deterministic_and_well_formed(small_pool):
    for base in _one_of_each(small_pool).values():
        f1 = fresh.fresh_image(base, "run/w1/u1/1")
        f2 = fresh.fresh_image(base, "run/w1/u1/2")
        assert fresh.fresh_image(base, "run/w1/u1/1").hash == f1.hash
        assert len({base.hash, f1.hash, f2.hash}) == 3
        assert f1.id.startswith(base.id + "~") and f1.id != f2.id
        assert (f1.format, f1.width, f1.height) == (base.format, base.width, base.height)
        with Image.open(io.BytesIO(f1.data)) as a, Image.open(io.BytesIO(f2.data)) as b:
            assert a.size == (base.width, base.height)
            assert a.tobytes() != b.tobytes()  # different pixels, not only different bytes
    assert fresh.fresh_image(small_pool[0]).hash != fresh.fresh_image(small_pool[0]).hash  # token=None: random


def _full_reencode(base, token):
    """What a fresh image is by definition: decode, paste the stamp, encode the whole image again."""
    digest = hashlib.sha256(token.encode()).digest()
    with Image.open(io.BytesIO(base.data)) as src:
        im = src.convert("RGBA" if src.mode in ("RGBA", "LA", "PA") else "RGB")
    arr = np.array(im)
    stamp, off = fresh.stamp_array(digest, *im.size)
    fresh.apply_stamp(arr, stamp, off)
    data = encode.encode(Image.fromarray(arr, im.mode), base.format, base.quality)
    with Image.open(io.BytesIO(data)) as out:
        return out.mode, out.tobytes()


@pytest.mark.parametrize("pool_kw", [dict(n=12, seed=7, preset="small"), dict(n=6, seed=2, max_side=700)])
def test_fresh_fast_paths_give_the_pixels_of_a_full_reencode(pool_kw, cache_dir):
    """PNG (rows spliced into the zlib stream) and JPEG (restart intervals swapped) decode to exactly the pixels
    of decoding the base, stamping and encoding it all again."""
    fresh.clear_cache()
    pool = generated.generate_pool(**pool_kw, cache_dir=cache_dir)
    for base in pool:
        for token in ("t/1", "t/2"):
            f = fresh.fresh_image(base, token)
            with Image.open(io.BytesIO(f.data)) as got:
                assert (got.mode, got.tobytes()) == _full_reencode(base, token), (base.id, base.format)
            assert f.hash == fresh.fresh_image(base, token).hash  # deterministic (template cached or not)


def test_whole_reencodes_of_a_users_webps_leave_the_cached_decode_as_it_was(tmp_path):
    """The formats without a fast path are stamped on a copy of the cached decode: the full re-encode's pixels, and
    the cache keeps the base's, in RGB and in RGBA."""
    rng = np.random.default_rng(5)
    for i, mode in enumerate(("RGB", "RGBA")):
        Image.fromarray(rng.integers(0, 256, (48, 64, len(mode)), dtype=np.uint8), mode).save(tmp_path / f"{i}.webp")
    fresh.clear_cache()
    for base in user_images.load_image_dir(tmp_path):
        before = fresh.decoded(base).copy()
        f = fresh.fresh_image(base, "t/1")
        with Image.open(io.BytesIO(f.data)) as got:
            assert (got.mode, got.tobytes()) == _full_reencode(base, "t/1"), base.id
        assert np.array_equal(fresh.decoded(base), before), base.id


def test_fresh_images_waiting_for_an_encoder_thread_hold_no_copy(tmp_path):
    """As a Locust process runs them (its run state's encoder threads, locustfiles/plugin/run_state.py): whole
    re-encodes go to encoder threads through slots, one per thread. Three users want a fresh image of a 512 px RGBA
    WebP while the one thread is busy: one copy of its pixels (1 MB, numpy's, which tracemalloc sees) exists, not
    three."""
    pixels = np.random.default_rng(1).integers(0, 256, (512, 512, 4), dtype=np.uint8)
    Image.fromarray(pixels, "RGBA").save(tmp_path / "a.webp")
    base = user_images.load_image_dir(tmp_path)[0]
    fresh.clear_cache()
    fresh.decoded(base)  # the cached decode is made before the count
    busy, entered = Event(), []

    def one_busy_thread(fn, *args):
        entered.append(args)
        busy.wait()
        return fn(*args)

    offload = fresh.Offload(one_busy_thread, BoundedSemaphore(1))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        users = [gevent.spawn(fresh.fresh_image, base, f"t/{i}", offload) for i in range(3)]
        gevent.idle()  # each user has run until it waits: for the thread or for a slot
        copies = (tracemalloc.get_traced_memory()[0] - before) / pixels.nbytes
        busy.set()
        gevent.joinall(users, raise_error=True)
    finally:
        tracemalloc.stop()
    assert len(entered) == 3 and len({u.value.hash for u in users}) == 3
    assert 0.9 < copies < 1.5, copies


def test_encode_body_is_plain_json_with_data_urls_copied_in(small_pool):
    im = small_pool[0]
    bodies = [
        rq.image_request("m", im, "t").body,
        rq.batch_request("m", [rq.EmbedInput((im,), "x")] * 2).body,
        rq.text_request("m", "plain").body,
        {"messages": [{"content": [{"image_url": {"url": im.data_url}}, {"text": "é \x01mmchaos-data-url\x01"}]}]},
    ]
    bodies += [
        malformed.build_malformed_request(c, im, "m", max_model_len=4096).body
        for c in cases_module.load_cases().usable(4096)
    ]
    for b in bodies:
        assert rq.encode_body(b) == json.dumps(b, separators=(",", ":"), ensure_ascii=False).encode()


def _write_image(path, fmt, size=(40, 30), colour=(200, 30, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path, fmt)


def test_user_dir_loads_images_and_skips_other_files(tmp_path):
    _write_image(tmp_path / "b.jpg", "JPEG")
    _write_image(tmp_path / "a.png", "PNG", colour=(1, 2, 3))
    _write_image(tmp_path / "sub" / "c.webp", "WEBP", size=(64, 48), colour=(9, 9, 9))
    _write_image(tmp_path / "d.gif", "GIF", colour=(50, 60, 70))
    (tmp_path / "README.txt").write_text("not an image")
    _write_image(tmp_path / ".hidden" / "x.png", "PNG", colour=(4, 4, 4))
    with pytest.warns(PayloadWarning, match="README.txt"):
        pool = user_images.load_image_dir(tmp_path)
    assert [im.id for im in pool] == ["a.png", "b.jpg", "d.gif", "sub/c.webp"]
    assert [im.format for im in pool] == ["png", "jpeg", "gif", "webp"]
    assert pool.by_id("sub/c.webp").width == 64
    assert pool.by_id("d.gif").data_url.startswith("data:image/gif;base64,")
    assert pool.source == str(tmp_path.resolve())


def test_user_dir_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope"):
        user_images.load_image_dir(missing)
    f = tmp_path / "file.png"
    _write_image(f, "PNG")
    with pytest.raises(NotADirectoryError, match=r"file\.png"):
        user_images.load_image_dir(f)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="has no images"):
        user_images.load_image_dir(empty)
    bad = tmp_path / "bad"
    _write_image(bad / "ok.png", "PNG")
    (bad / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg")
    with pytest.raises(ValueError, match=r"broken\.jpg"):
        user_images.load_image_dir(bad)
    trunc = tmp_path / "trunc"
    _write_image(trunc / "big.png", "PNG", size=(300, 300))
    data = (trunc / "big.png").read_bytes()
    (trunc / "big.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"big\.png"):
        user_images.load_image_dir(trunc)


def test_user_dir_drops_duplicates_with_a_warning(tmp_path):
    _write_image(tmp_path / "a.png", "PNG")
    (tmp_path / "copy.png").write_bytes((tmp_path / "a.png").read_bytes())
    with pytest.warns(PayloadWarning, match="duplicate"):
        pool = user_images.load_image_dir(tmp_path)
    assert [im.id for im in pool] == ["a.png"]


def test_shared_pool_from_a_dir(tmp_path):
    shared_pool.clear_shared_pools()
    _write_image(tmp_path / "a.png", "PNG")
    assert shared_pool.shared_pool(tmp_path) is shared_pool.shared_pool(str(tmp_path))
    with pytest.raises(ValueError, match="exclusive"):
        shared_pool.shared_pool(tmp_path, n=3)
    shared_pool.clear_shared_pools()


# ----------------------------------------------------------------------------------------------------- reuse


def test_zipf_probabilities_and_uniform_case():
    m = reuse.ReuseModel(50, zipf_s=1.1)
    p = m.probabilities
    assert np.isclose(p.sum(), 1.0) and np.all(np.diff(p) < 0)
    assert np.allclose(reuse.ReuseModel(50, zipf_s=0.0).probabilities, 1 / 50)
    assert m.top_share(50) == pytest.approx(1.0)
    assert 0 < m.top_share(5) < 1


def test_sampler_is_seeded_and_draw_matches_draw_many():
    m = reuse.ReuseModel(30, zipf_s=1.0, fresh_fraction=0.3)
    first = m.sampler(42).draw()
    s = m.sampler(42)
    seq = [s.draw() for _ in range(500)]
    idx, is_fresh = m.sampler(42).draw_many(500)
    assert first == seq[0] and isinstance(first, reuse.Draw)
    assert [d.pool_index for d in seq] == idx.tolist()
    assert [d.fresh for d in seq] == is_fresh.tolist()
    assert m.sampler(43).draw_many(50)[0].tolist() != idx[:50].tolist()


def test_zipf_skew_orders_the_hot_images():
    m = reuse.ReuseModel(100, zipf_s=1.2)
    idx, is_fresh = m.sampler(1).draw_many(30_000)
    assert not is_fresh.any()
    counts = np.bincount(idx, minlength=100)
    assert counts[0] > counts[1] > counts[2] > counts[4] > counts[9] > counts[60]
    assert counts[0] / 30_000 == pytest.approx(m.probabilities[0], abs=0.015)
    uniform = np.bincount(reuse.ReuseModel(20, zipf_s=0).sampler(1).draw_many(20_000)[0], minlength=20)
    assert uniform.max() / uniform.min() < 1.25


def test_fresh_fraction_within_tolerance():
    m = reuse.ReuseModel(10, zipf_s=1.0, fresh_fraction=0.2)
    idx, is_fresh = m.sampler(3).draw_many(20_000)
    assert is_fresh.mean() == pytest.approx(0.2, abs=0.015)
    assert idx.min() >= 0 and idx.max() < 10
    assert all(reuse.ReuseModel(10, fresh_fraction=1.0).sampler(0).draw().fresh for _ in range(3))


def test_expected_distinct_matches_simulation_and_limits():
    m = reuse.ReuseModel(200, zipf_s=0.9, fresh_fraction=0.1)
    for n in (50, 500, 3000):
        mean, std = m.simulate_distinct(n, trials=30, seed=1)
        assert m.expected_distinct(n) == pytest.approx(mean, abs=4 * std / math.sqrt(30) + 0.5)
    assert m.expected_distinct(0) == 0
    assert reuse.ReuseModel(10, zipf_s=1).expected_distinct(1) == pytest.approx(1.0)
    big = reuse.ReuseModel(10, zipf_s=1, fresh_fraction=0.5).expected_distinct(100_000)
    assert big == pytest.approx(10 + 50_000, rel=1e-6)
    assert reuse.ReuseModel(100, zipf_s=2).expected_distinct(100) < reuse.ReuseModel(100, 0).expected_distinct(100)


@pytest.mark.parametrize(
    "kwargs", [dict(pool_size=0), dict(pool_size=5, zipf_s=-1), dict(pool_size=5, fresh_fraction=1.5)]
)
def test_reuse_model_rejects_bad_parameters(kwargs):
    with pytest.raises(ValueError):
        reuse.ReuseModel(**kwargs)


# -------------------------------------------------------------------------------------------------- requests


def _columns_ok(built):
    ctx = built.context(user_id=1)
    assert set(ctx) - {"user_id"} <= set(schema.REQUESTS.names)
    assert ctx["request_bytes"] == len(built.payload())
    json.loads(built.payload())
    return ctx


def test_image_request_shape(small_pool):
    im = small_pool[0]
    built = rq.image_request("m", im, "a caption")
    path, body, meta = built
    assert path == "/v1/embeddings"
    assert set(body) == {"model", "messages", "encoding_format"}
    assert body["model"] == "m" and body["encoding_format"] == "float"
    system, user = body["messages"]
    assert system == {"role": "system", "content": [{"type": "text", "text": "Represent the user's input."}]}
    assert user["role"] == "user"
    assert user["content"] == [
        {"type": "image_url", "image_url": {"url": im.data_url}},
        {"type": "text", "text": "a caption"},
    ]
    assert meta.kind == "valid_image" and meta.n_images == 1
    ctx = _columns_ok(built)
    assert ctx["image_ids"] == im.id and ctx["image_hashes"] == im.hash and ctx["n_images"] == 1
    no_sys = rq.image_request("m", im, instruction=None, encoding_format="base64", extra={"dimensions": 8})
    assert [m["role"] for m in no_sys.body["messages"]] == ["user"]
    assert no_sys.body["messages"][0]["content"] == [{"type": "image_url", "image_url": {"url": im.data_url}}]
    assert no_sys.body["encoding_format"] == "base64" and no_sys.body["dimensions"] == 8
    with pytest.raises(ValueError, match="encoding_format"):
        rq.image_request("m", im, encoding_format="int8")


def test_multi_image_text_batch_and_tokenize_shapes(small_pool):
    a, b, c = small_pool[0], small_pool[1], small_pool[2]
    multi = rq.multi_image_request("m", [a, b], "two")
    content = multi.body["messages"][1]["content"]
    assert [p["type"] for p in content] == ["image_url", "image_url", "text"]
    assert multi.meta.kind == "multi_image" and multi.meta.image_ids == (a.id, b.id)
    with pytest.raises(ValueError):
        rq.multi_image_request("m", [a])

    t1 = rq.text_request("m", "hello")
    assert t1.body == {"model": "m", "input": "hello", "encoding_format": "float"} and t1.meta.kind == "text"
    t2 = rq.text_request("m", ["x", "y"], encoding_format="base64")
    assert t2.body["input"] == ["x", "y"] and t2.meta.n_inputs == 2 and t2.meta.n_images == 0
    assert _columns_ok(t2)["image_ids"] is None
    with pytest.raises(ValueError):
        rq.text_request("m", [])

    batch = rq.batch_request("m", [rq.EmbedInput([a], "one"), rq.EmbedInput([b, c]), rq.EmbedInput(text="only text")])
    convs = batch.body["messages"]
    assert len(convs) == 3 and all(isinstance(conv, list) and conv[0]["role"] == "system" for conv in convs)
    assert convs[2][1]["content"] == [{"type": "text", "text": "only text"}]
    assert batch.meta.kind == "batch" and batch.meta.n_inputs == 3 and batch.meta.image_ids == (a.id, b.id, c.id)
    _columns_ok(batch)
    with pytest.raises(ValueError):
        rq.batch_request("m", [rq.EmbedInput()])

    tok = rq.tokenize_request("m", a, "t")
    assert tok.path == "/tokenize" and tok.meta.kind == "tokenize"
    assert tok.body["add_generation_prompt"] is False and "encoding_format" not in tok.body
    assert tok.body["messages"] == rq.image_request("m", a, "t").body["messages"]


def test_meta_rejects_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        rq.RequestMeta(kind="weird")


# ------------------------------------------------------------------------------------------------- malformed

MML = 1024


@pytest.fixture(scope="module")
def catalogue():
    return cases_module.load_cases()


def _image_urls(body):
    """Every image part's URL, wherever the route puts its parts (messages, Cohere inputs, documents)."""
    if isinstance(body, dict):
        if body.get("type") == "image_url":
            return [body["image_url"]["url"]]
        return [u for v in body.values() for u in _image_urls(v)]
    return [u for v in body for u in _image_urls(v)] if isinstance(body, list) else []


def _user_text(body):
    return next(p["text"] for p in body["messages"][-1]["content"] if p.get("type") == "text")


def test_catalogue_has_the_required_cases(catalogue):
    required_post = {"dimensions_unsupported", "prompt_over_max_model_len"}
    required_pre = {
        "messages_not_a_list",
        "content_unknown_type",
        "bad_base64",
        "unsupported_image_format",
        "bad_encoding_format",
        "truncate_prompt_tokens_over_max_model_len",
        "oversized_image",
    }
    assert required_post <= {c.name for c in catalogue.stage("post_render")}
    assert required_pre <= {c.name for c in catalogue.stage("pre_render")}
    assert catalogue["dimensions_unsupported"].evidence == "measured"
    assert catalogue["dimensions_unsupported"].patch == {"dimensions": 5}
    for c in catalogue.values():
        assert c.kind == ("malformed_post" if c.stage == "post_render" else "malformed_pre")
        assert c.evidence in cases_module.EVIDENCE and c.confidence in cases_module.CONFIDENCE and c.source
    with pytest.raises(KeyError, match="no malformed case"):
        catalogue["nope"]


def test_every_case_builds_for_every_format(catalogue, small_pool):
    for im in _one_of_each(small_pool).values():
        for case in catalogue.values():
            built = malformed.build_malformed_request(case, im, "m", max_model_len=MML)
            assert built.path == case.endpoint
            assert built.meta.case == case.name and built.meta.expected_status == case.expected_status
            assert built.meta.kind == case.kind
            assert built.meta.image_ids == ((im.id,) if case.carries_image else ())
            ctx = _columns_ok(built)
            assert ctx["case"] == case.name
            if case.carries_image:
                assert im.data_url in _image_urls(built.body), case.name


def test_cases_needing_max_model_len(catalogue, small_pool):
    needing = {c.name for c in catalogue.values() if c.needs_max_model_len}
    assert needing == {
        "prompt_over_max_model_len",
        "text_over_max_model_len",
        "truncate_prompt_tokens_over_max_model_len",
    }
    with pytest.raises(ValueError, match="max_model_len"):
        malformed.build_malformed_request(catalogue["prompt_over_max_model_len"], small_pool[0], "m")
    assert {c.name for c in catalogue.usable(None)} == set(catalogue) - needing


def test_specific_mutations(catalogue, small_pool):
    im = next(i for i in small_pool if i.format == "jpeg")

    def build(name):
        return malformed.build_malformed_request(catalogue[name], im, "m", max_model_len=MML).body

    assert build("dimensions_unsupported")["dimensions"] == 5
    assert build("dimensions_zero")["dimensions"] == 0
    assert build("truncate_prompt_tokens_over_max_model_len")["truncate_prompt_tokens"] == MML + 1
    assert build("bad_encoding_format")["encoding_format"] == "int8"
    assert isinstance(build("messages_not_a_list")["messages"], str)
    conflicting = build("conflicting_template_flags")
    assert conflicting["add_generation_prompt"] and conflicting["continue_final_message"]

    over = _user_text(build("prompt_over_max_model_len"))
    assert over.isdigit() and len(over) == MML - 64
    assert _image_urls(build("prompt_over_max_model_len")) == [im.data_url]
    assert len(_user_text(build("text_over_max_model_len"))) == MML + 64

    (url,) = _image_urls(build("bad_base64"))
    with pytest.raises(binascii.Error):
        base64.b64decode(url.partition(",")[2], validate=True)

    (url,) = _image_urls(build("truncated_image"))
    data = base64.b64decode(url.partition(",")[2], validate=True)
    assert im.data.startswith(data) and len(data) < len(im.data)
    with pytest.raises(OSError), Image.open(io.BytesIO(data)) as pil:
        pil.load()

    (url,) = _image_urls(build("unsupported_image_format"))
    assert url.startswith("data:image/svg+xml;base64,")
    with pytest.raises(Image.UnidentifiedImageError):
        Image.open(io.BytesIO(base64.b64decode(url.partition(",")[2])))

    (url,) = _image_urls(build("data_url_not_base64"))
    assert url.startswith("data:image/jpeg,") and ";base64" not in url.partition(",")[0]

    (url,) = _image_urls(build("oversized_image"))
    png = base64.b64decode(url.partition(",")[2])
    assert len(png) < 1000
    with pytest.raises(Image.DecompressionBombError):
        Image.open(io.BytesIO(png))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with Image.open(io.BytesIO(mutations.png_header_only(5000, 4000))) as small_header:
            assert small_header.size == (5000, 4000)

    multi = build("multi_image_one_bad")
    assert _image_urls(multi)[0] == im.data_url and len(_image_urls(multi)) == 2
    batch = build("batch_with_bad_item")
    assert len(batch["messages"]) == 2 and all(isinstance(c, list) for c in batch["messages"])
    assert _image_urls(batch)[0] == im.data_url and _image_urls(batch)[1] != im.data_url


def test_building_does_not_leak_between_cases(catalogue, small_pool):
    im = small_pool[0]
    a = malformed.build_malformed_request(catalogue["bad_base64"], im, "m")
    b = malformed.build_malformed_request(catalogue["bad_base64"], im, "m")
    assert a.body == b.body
    assert (
        rq.image_request("m", im, malformed.DEFAULT_TEXT).body["messages"][1]["content"][0]["image_url"]["url"]
        == im.data_url
    )


def test_merge_patch_and_unset():
    target = {"a": 1, "b": {"c": 2, "d": [1, 2]}}
    assert patches.merge_patch(target, {"b": {"c": 3, "e": 4}, "f": [5]}) == {
        "a": 1,
        "b": {"c": 3, "d": [1, 2], "e": 4},
        "f": [5],
    }
    assert target == {"a": 1, "b": {"c": 2, "d": [1, 2]}}  # not modified
    body = {"messages": [{"content": [{"x": 1}, {"y": 2}]}], "k": 1}
    patches.unset_path(body, "messages.0.content.0")
    patches.unset_path(body, "k")
    assert body == {"messages": [{"content": [{"y": 2}]}]}
    with pytest.raises(KeyError, match="nope"):
        patches.unset_path(body, "nope.x")


USER_CASES = """
[[case]]
name = "user_field_with_image"
stage = "post_render"
expected_status = 400
carries_image = true
description = "my own case"
confidence = "low"
unset = ["encoding_format"]

[case.patch]
user = "$MODEL"
messages = [
    { role = "user", content = [{ type = "image_url", image_url = { url = "$IMAGE_URL" } }] },
]

[[case]]
name = "bigger_oversized"
stage = "pre_render"
expected_status = 500
carries_image = false
description = "30000 px square"
mutation = "oversized_image"
params = { width = 30000, height = 30000 }
endpoint = "/tokenize"
"""


def test_user_case_file_is_merged(tmp_path, small_pool):
    f = tmp_path / "mine.toml"
    f.write_text(USER_CASES)
    cat = cases_module.load_cases(f)
    assert list(cat)[-2:] == ["user_field_with_image", "bigger_oversized"]
    assert "dimensions_unsupported" in cat
    mine = cat["user_field_with_image"]
    assert mine.origin == str(f) and mine.evidence == "expected" and mine.poisons
    built = malformed.build_malformed_request(mine, small_pool[0], "my-model")
    assert built.body["user"] == "my-model" and "encoding_format" not in built.body
    assert _image_urls(built.body) == [small_pool[0].data_url]
    big = malformed.build_malformed_request(cat["bigger_oversized"], small_pool[0], "m")
    assert big.path == "/tokenize" and big.meta.kind == "malformed_pre"
    only = cases_module.load_cases(f, include_builtin=False)
    assert list(only) == ["user_field_with_image", "bigger_oversized"]


def _case(**over):
    fields = {
        "name": '"c1"',
        "stage": '"pre_render"',
        "expected_status": "400",
        "carries_image": "true",
        "description": '"d"',
        "patch": "{ dimensions = 1 }",
    }
    fields.update(over)
    return "[[case]]\n" + "".join(f"{k} = {v}\n" for k, v in fields.items() if v is not None)


@pytest.mark.parametrize(
    "text, match",
    [
        (_case(colour='"red"'), r"case 'c1': unknown key 'colour'"),
        (_case(stage='"mid_render"'), r"case 'c1': 'stage' must be one of"),
        (_case(expected_status='"400"'), r"'expected_status' must be an HTTP status"),
        (_case(expected_status="true"), r"'expected_status' must be an HTTP status"),
        (_case(carries_image='"yes"'), r"'carries_image' must be true or false"),
        (_case(description=None), r"case 'c1': missing required key 'description'"),
        (_case(name='"has,comma"'), r"'name' must be"),
        (_case(mutation='"melt"'), r"'mutation' must be one of"),
        (_case(mutation='"oversized_image"', params="{ depth = 3 }"), r"unknown params key 'depth'"),
        (_case(mutation='"oversized_image"', params='{ width = "big" }'), r"params.width must be a int"),
        (_case(params="{ width = 3 }"), r"'params' given without a 'mutation'"),
        (_case(patch='{ url = "$IMAGE" }'), r"unknown placeholder '\$IMAGE'"),
        (_case(patch=None), r"changes nothing"),
        (_case(unset='"encoding_format"'), r"'unset' must be a list"),
        (_case(evidence='"rumour"'), r"'evidence' must be one of"),
        (_case(endpoint='"/v1/chat/completions"'), r"'endpoint' must be one of"),
        (_case() + "\n[extra]\nx = 1\n", r"unknown top-level key 'extra'"),
        ("[[case]\nname = ", r"not valid TOML"),
        ("title = 'x'\n", r"unknown top-level key 'title'"),
        ("", r"no cases"),
    ],
)
def test_bad_case_files_give_clear_errors(tmp_path, text, match):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(cases_module.CaseFileError, match=match) as err:
        cases_module.load_cases(f)
    assert str(f) in str(err.value)


def test_duplicate_and_missing_case_files(tmp_path):
    f = tmp_path / "dupe.toml"
    f.write_text(_case(name='"bad_base64"'))
    with pytest.raises(cases_module.CaseFileError, match=r"case 'bad_base64': duplicate case name") as err:
        cases_module.load_cases(f)
    assert "malformed_cases.toml" in str(err.value)
    g = tmp_path / "twice.toml"
    g.write_text(_case() + _case())
    with pytest.raises(cases_module.CaseFileError, match="duplicate"):
        cases_module.load_cases(g, include_builtin=False)
    with pytest.raises(FileNotFoundError, match=r"missing\.toml"):
        cases_module.load_cases(tmp_path / "missing.toml")


def test_unset_of_a_missing_key_names_it(tmp_path, small_pool):
    f = tmp_path / "u.toml"
    f.write_text(_case(patch=None, unset='["messages.5"]'))
    (case,) = cases_module.load_cases(f, include_builtin=False).values()
    with pytest.raises(KeyError, match=r"messages\.5"):
        malformed.build_malformed_request(case, small_pool[0], "m")
