"""The other architectures of the tiny-model family on real vLLM: what each serves, and the report's trigger on each.
Measured first with `mmchaos repro --engine V --model NAME` and these requests by hand (docs/versions.md, Models):
every multimodal pooling architecture here dies of a post-render failure then the same image on 0.30.0, and gets the
retryable 503 on 0.32.0 — the cache is vLLM's, not the model's."""

from __future__ import annotations

import json

import pytest
import requests
from conftest import FIXED_VERSION, REPORT_VERSION, vllm_server
from locust_run import locust, locust_rows, rows

from mmchaos import schema
from mmchaos.payloads import bodies, routes
from mmchaos.payloads.shared_pool import shared_pool

pytestmark = pytest.mark.engine


def _post(server, path: str, body: dict) -> requests.Response:
    return requests.post(
        server.base_url + path, data=json.dumps(body), headers={"Content-Type": "application/json"}, timeout=120
    )


def _image(seed: int):
    return shared_pool(n=1, seed=seed, preset="small")[0]


def _poison_then_reuse(server, name: str, seed: int) -> tuple[int, int]:
    """The architecture's own post-render failure with a never-seen image, then a valid request with it: an
    embedder's dimensions=5 (CLIP: the image alone, it takes no text beside one), the reranker's /score with
    truncate_prompt_tokens=0."""
    model, im = server.model_name(), _image(seed)
    if name == "qwen3vl-rerank":
        doc = routes.item((im,), "a document")
        poison = _post(
            server, "/score", {"model": model, "queries": "q", "documents": [doc], "truncate_prompt_tokens": 0}
        )
        return poison.status_code, _post(
            server, "/score", {"model": model, "queries": "q", "documents": [doc]}
        ).status_code
    text = None if name == "clip-embed" else "a photo"
    conv = bodies.conversation((im,), text, None)
    poison = _post(server, "/v1/embeddings", {"model": model, "messages": conv, "dimensions": 5})
    return poison.status_code, _post(server, "/v1/embeddings", {"model": model, "messages": conv}).status_code


POISON_STATUS = {"qwen2vl-embed": 400, "clip-embed": 400, "qwen3vl-rerank": 500}


@pytest.mark.parametrize("name", ["qwen2vl-embed", "clip-embed", "qwen3vl-rerank"])
def test_on_the_report_version_every_architecture_dies_of_the_trigger(name, tmp_path):
    log = tmp_path / "server.log"
    with vllm_server(REPORT_VERSION, [], log, model=name) as server:
        poison, reuse = _poison_then_reuse(server, name, seed=40)
        assert (poison, reuse) == (POISON_STATUS[name], 500), log.read_text()[-3000:]
        server.proc.wait(timeout=60)  # it dies: its exit, not a timer, ends the wait
    text = log.read_text()
    assert "P0/P1 cache drift" in text and "req_state.detokenizer is not None" in text


def test_on_the_fixed_version_each_architecture_serves_what_it_takes_and_misses_retryably(tmp_path):
    """One server per model, each left healthy: Qwen2-VL embeds an image with a text; CLIP an image or a text on
    every route it lists and refuses both together before its cache (no poison); the reranker scores image
    documents on /score and /rerank and lists no /v1/embeddings. Then each one's trigger: a retryable 503."""
    for name in ("qwen2vl-embed", "clip-embed", "qwen3vl-rerank"):
        with vllm_server(FIXED_VERSION, [], tmp_path / f"{name}.log", model=name) as server:
            model, im = server.model_name(), _image(41)
            listed = set(requests.get(server.base_url + "/openapi.json", timeout=30).json()["paths"])
            if name == "qwen3vl-rerank":
                assert "/v1/embeddings" not in listed and {"/score", "/rerank"} <= listed
                doc = routes.item((im,), "a document")
                for path in ("/score", "/v1/score"):
                    assert _post(server, path, {"model": model, "queries": "q", "documents": [doc]}).status_code == 200
                for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
                    assert _post(server, path, {"model": model, "query": "q", "documents": [doc]}).status_code == 200
            elif name == "clip-embed":
                for ims, text in (((im,), None), ((), "a photo")):
                    for path in routes.PATHS:
                        assert _post(server, *_valid(path, model, ims, text)).status_code == 200, (path, text)
                both = _image(42)
                refused = _post(
                    server, "/v1/embeddings", {"model": model, "messages": bodies.conversation((both,), "x", None)}
                )
                assert refused.status_code == 400 and "not both" in refused.text
                again = _post(
                    server, "/v1/embeddings", {"model": model, "messages": bodies.conversation((both,), None, None)}
                )
                assert again.status_code == 200  # refused before its cache: no poison
                _the_mix_with_images_alone(server, tmp_path / "clip-mix")
            else:
                conv = bodies.conversation((im,), "a photo", None)
                assert _post(server, "/v1/embeddings", {"model": model, "messages": conv}).status_code == 200
            assert _poison_then_reuse(server, name, seed=43) == (POISON_STATUS[name], 503)
            assert server.health()[0]


def _the_mix_with_images_alone(server, folder) -> None:
    """The default mix as a CLIP campaign sends it (--images-alone): every valid request on every route it lists is
    answered, at the latest after the SDK's retries of a poisoned image's 503."""
    r = locust(
        "locustfiles/embeddings.py",
        server.base_url,
        folder,
        "--images-alone",
        "--page-side",
        "256",
        "--max-requests",
        "120",
        users=3,
        seconds=240,
        timeout=360,
    )  # ends at 120 requests, however busy the machine
    df = locust_rows(rows(folder))
    valid = df[df["kind"].isin(schema.VALID_KINDS) & df["final"]]
    assert len(valid) > 40 and (valid["outcome"] == schema.OK).all(), valid[valid["outcome"] != schema.OK]
    assert {"/v1/embeddings", "/score"} <= set(valid["endpoint"]), r.stdout[-2000:]


def _valid(path: str, model: str, ims, text) -> tuple[str, dict]:
    """A valid body for ``path`` carrying what CLIP takes: an image alone or a text alone."""
    item = routes.item(ims, text)
    kind = routes.KIND_OF_PATH[path]
    if kind == "embed_v2":
        return path, {"model": model, "inputs": [item], "embedding_types": ["float"]}
    if kind == "pooling":
        return path, {"model": model, "messages": bodies.conversation(ims, text, None)}
    return path, {"model": model, "query" if kind == "rerank" else "queries": "q", "documents": [item]}
