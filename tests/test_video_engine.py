"""Video on the real engines (what payloads/video_cases.py says, pinned): synthetic mp4 and webm clips embed on
0.30.0 (with its transformers pin) and 0.32.0, the broken ones get the statuses measured, and a video poisons as an
image does: on 0.32.0 the reuse after a post-render 400 or an abort is the retryable 503; on 0.30.0 it kills the
server. Two servers of their own (0.30.0, each crashed once) and the session's 0.32.0 server."""

from __future__ import annotations

import time

import pytest
import requests
from conftest import REPORT_VERSION, vllm_server

from mmchaos.payloads import bodies, video, video_cases
from mmchaos.signatures import Signatures

pytestmark = pytest.mark.engine
SIGS = Signatures.load()
MODEL_DIM = 64
ABORT_TRIES = 8  # aborts after 5 ms, each with a fresh video, until one leaves P0 ahead (measured: the first did)


def _post(server, req, timeout: float = 60):
    return requests.post(server.base_url + req.path, json=req.body, timeout=timeout)


def _fresh(token: int) -> video.Video:
    return video.fresh(video.POOL_SPECS[token % 2], 7_000_000 + token)  # mp4 and webm in turn


def _abort(server, req) -> None:
    try:
        _post(server, req, timeout=0.005)
    except requests.exceptions.RequestException:
        pass  # the client hung up: the point


def _died(server, timeout: float = 90) -> bool:
    """Whether the server exits (its exit ends the wait) within ``timeout``."""
    end = time.time() + timeout
    while server.exit_code() is None and time.time() < end:
        time.sleep(0.2)
    return server.exit_code() is not None


def _signatures(server) -> set[str]:
    return {m.signature.name for m in SIGS.scan(server.log_path.read_text(errors="replace"))}


class TestFixedVersion:
    def test_mp4_and_webm_clips_embed_and_a_repeat_gives_the_same_vector(self, fixed_server):
        model = fixed_server.model_name()
        for clip in video.pool(seed=71):
            first = _post(fixed_server, video_cases.valid(model, clip))
            again = _post(fixed_server, video_cases.valid(model, clip))
            assert first.status_code == again.status_code == 200, (clip.id, first.text)
            vec = first.json()["data"][0]["embedding"]
            assert len(vec) == MODEL_DIM and vec == again.json()["data"][0]["embedding"]

    def test_broken_videos_get_the_statuses_measured(self, fixed_server):
        model = fixed_server.model_name()
        for name in video_cases.PRE_CASES:
            r = _post(fixed_server, video_cases.malformed(name, model, _fresh(1), seed=72))
            assert r.status_code == video_cases.CASES[name].expected_status, (name, r.text)
        for name in video_cases.ACCEPTED:  # OpenCV reads the container, not the label; long clips are sampled down
            req = video_cases.valid(model, video.malformed(name, seed=72))
            assert _post(fixed_server, req).status_code == 200, name
        assert fixed_server.health()[0]

    def test_a_post_render_400_with_a_video_poisons_as_an_image_does(self, fixed_server):
        model = fixed_server.model_name()
        clip = _fresh(3)
        poison = _post(fixed_server, video_cases.malformed(video_cases.POISON_CASE, model, clip))
        assert poison.status_code == 400, poison.text
        reuse = _post(fixed_server, video_cases.valid(model, clip))
        assert reuse.status_code == 503 and "cache miss" in reuse.text
        assert _post(fixed_server, video_cases.valid(model, clip)).status_code == 200  # the retry cures it
        assert fixed_server.health()[0] and fixed_server.exit_code() is None

    def test_an_abandoned_video_request_poisons_as_an_image_does(self, fixed_server):
        model = fixed_server.model_name()
        statuses = []
        for i in range(ABORT_TRIES):
            clip = _fresh(10 + i)
            _abort(fixed_server, video_cases.valid(model, clip))
            statuses.append(_post(fixed_server, video_cases.valid(model, clip)).status_code)
            if statuses[-1] == 503:
                break
        assert statuses[-1] == 503 and set(statuses) <= {200, 503}, statuses
        assert fixed_server.health()[0] and fixed_server.exit_code() is None


def test_report_version_embeds_video_files_and_dies_on_a_video_poison(tmp_path):
    folder = tmp_path / "videos"
    folder.mkdir()
    with vllm_server(REPORT_VERSION, ["--allowed-local-media-path", str(folder)], tmp_path / "server.log") as s:
        model = s.model_name()
        for clip in video.pool(seed=73)[:2]:  # mp4 and webm, as file URLs this time
            r = _post(s, bodies.video_request(model, [clip], "a clip", file_folder=folder))
            assert r.status_code == 200, r.text
        clip = _fresh(30)
        assert _post(s, video_cases.malformed(video_cases.POISON_CASE, model, clip)).status_code == 400
        try:
            status = _post(s, video_cases.valid(model, clip)).status_code
        except requests.exceptions.ConnectionError:
            status = None
        assert status in (500, None)
        assert _died(s)
        assert "detokenizer_assert" in _signatures(s)


def test_report_version_dies_on_an_abandoned_video_request(tmp_path):
    with vllm_server(REPORT_VERSION, [], tmp_path / "server.log") as s:
        model = s.model_name()
        statuses = []
        for i in range(ABORT_TRIES):
            clip = _fresh(40 + i)
            _abort(s, video_cases.valid(model, clip))
            try:
                statuses.append(_post(s, video_cases.valid(model, clip)).status_code)
            except requests.exceptions.ConnectionError:
                statuses.append(None)
            if statuses[-1] != 200:
                break
        assert statuses[-1] in (500, None), statuses
        assert _died(s)
        assert "detokenizer_assert" in _signatures(s)
