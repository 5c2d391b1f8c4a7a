"""What real vLLM answers to each form a content part may carry a medium in (the hunt draws them all,
harness/hunt/media.py FORMS): every form with data is the same input as the plain data URL; a medium named by the
client's id alone is served from the processor cache when the id was sent with data before, and refused (400, the
server staying up) when it was not or when there is no cache."""

from __future__ import annotations

import pytest
import requests

from mmchaos import sameness
from mmchaos.harness.hunt import media

pytestmark = pytest.mark.engine
WITH_DATA = ("untyped", "uuid", "input_image")


def _post(server, part: dict) -> requests.Response:
    body = {
        "model": server.model_name(),
        "messages": [{"role": "user", "content": [part, {"type": "text", "text": "a photo"}]}],
    }
    return requests.post(server.base_url + "/v1/embeddings", json=body, timeout=60)


def _vector(r: requests.Response) -> list[float]:
    assert r.status_code == 200, r.text[:300]
    return r.json()["data"][0]["embedding"]


def _forms_with_data_agree(server, seed: int) -> list[float]:
    """Each form with data answered 200 with the plain form's vector (its id sent last, so it is cached by id)."""
    m = media.make("PNG", 64, 64, seed, "none")
    plain = _vector(_post(server, m.part))
    for form in WITH_DATA:
        c = sameness.cosine(plain, _vector(_post(server, m.as_part(form))))
        assert c >= sameness.COSINE_MIN, (form, c)
    return plain


def test_on_a_server_with_the_cache_an_id_alone_is_the_medium_sent_with_it_before(fixed_server):
    seed = 1000 + fixed_server.port % 1000
    plain = _forms_with_data_agree(fixed_server, seed)
    by_id = _post(fixed_server, media.make("PNG", 64, 64, seed, "none").as_part("uuid_only"))
    assert sameness.cosine(plain, _vector(by_id)) >= sameness.COSINE_MIN
    never = _post(fixed_server, media.make("PNG", 64, 64, seed + 1, "none").as_part("uuid_only"))
    assert never.status_code == 400 and "data is not provided" in never.text, never.text[:300]
    assert fixed_server.health()[0]


def test_without_the_cache_an_id_alone_is_refused_and_the_server_stays_up(workaround_server):
    seed = 2000 + workaround_server.port % 1000
    _forms_with_data_agree(workaround_server, seed)
    image = media.make("PNG", 64, 64, seed, "none")
    clip = media.make_video("mp4", 4, seed, "none")
    assert _vector(_post(workaround_server, clip.as_part("uuid")))
    for m in (image, clip):
        got = _post(workaround_server, m.as_part("uuid_only"))
        assert got.status_code == 400, (m.kind, got.status_code, got.text[:300])
    assert workaround_server.health()[0]
