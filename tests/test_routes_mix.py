"""The other pooling routes in the Locust mix: their bodies, only the routes the server lists, and the malformed
cases of a route only where it is served."""

from __future__ import annotations

import pytest
import traffic_of

from mmchaos import options, schema
from mmchaos.locustfiles.plugin.traffic import UserTraffic
from mmchaos.payloads import catalogue, routes
from mmchaos.payloads.shared_pool import shared_pool

pytestmark = pytest.mark.unit


_traffic = traffic_of.traffic


def _only(*kinds: str) -> dict:
    return traffic_of.only(**dict.fromkeys(kinds, 1))


def test_the_route_kinds_are_the_schemas():
    assert tuple(routes.ROUTE_KINDS) == schema.ROUTE_KINDS
    assert set(schema.ROUTE_KINDS) <= set(schema.VALID_KINDS) and set(schema.ROUTE_KINDS) <= set(options.WEIGHTS)


def test_each_route_carries_its_images_in_its_own_form():
    a, b = shared_pool(n=2, seed=3, preset="small")[:2]
    for path in routes.PATHS:
        req = routes.route_request(path, "m", (a, b), "a query")
        kind = routes.KIND_OF_PATH[path]
        assert req.path == path and req.meta.kind == kind and req.meta.image_hashes == (a.hash, b.hash)
        body = req.body
        if kind == "embed_v2":
            [one] = body["inputs"]
            assert [p["type"] for p in one["content"]] == ["image_url", "image_url", "text"]
        elif kind == "pooling":
            assert body["messages"][-1]["content"][-1] == {"type": "text", "text": "a query"}
        else:
            assert body["query" if kind == "rerank" else "queries"] == "a query"
            assert [d["content"][0]["image_url"]["url"] for d in body["documents"]] == [a.data_url, b.data_url]
            assert req.meta.n_inputs == 2
    with pytest.raises(ValueError, match="no body form"):
        routes.route_request("/classify", "m", (a,), "q")


def test_the_mix_sends_only_the_routes_the_server_lists():
    every = _only(*schema.ROUTE_KINDS)
    t = _traffic(**every, routes="/v2/embed,/rerank,/v2/rerank")
    u = UserTraffic(t, 1, 0, 0, "m")
    reqs = [u.build(u.next_kind()) for _ in range(300)]
    assert {r.path for r in reqs} == {"/v2/embed", "/rerank", "/v2/rerank"}
    assert all(len(r.body["documents"]) == routes.DOCUMENTS for r in reqs if r.meta.kind == "rerank")
    # none listed (or /openapi.json unreadable): with only route kinds weighted, nothing can be sent
    with pytest.raises(ValueError, match="all request weights are 0"):
        _traffic(**every, routes=routes.NO_ROUTES)
    with pytest.raises(ValueError, match="unknown route '/v9/embed'"):
        _traffic(**every, routes="/v9/embed")


def test_a_routes_malformed_cases_only_where_it_is_served():
    cases = catalogue.load_cases()
    on = {c.name for c in cases.by_kind(4096, served=["/v2/embed"])["malformed_post"]}
    off = {c.name for c in cases.by_kind(4096, served=[])["malformed_post"]}
    assert "v2_embed_output_dimension" in on and "score_truncate_zero" not in on
    assert {"v2_embed_output_dimension", "score_truncate_zero"}.isdisjoint(off) and "dimensions_unsupported" in off
    # the mix's poisons cross routes: a route's post-render case, then the same pool image anywhere
    t = _traffic(**_only("malformed_post", "valid_image"), routes="/v2/embed,/score")
    u = UserTraffic(t, 2, 0, 0, "m")
    reqs = [u.build(u.next_kind()) for _ in range(400)]
    assert {"/v2/embed", "/score", "/v1/embeddings"} <= {r.path for r in reqs}


def _inputs(body) -> list[list[dict]]:
    """The parts of every input of a body, whatever its route's form."""
    if isinstance(body.get("messages"), list):
        convs = body["messages"] if isinstance(body["messages"][0], list) else [body["messages"]]
        return [[p for m in conv for p in (m["content"] if isinstance(m["content"], list) else [])] for conv in convs]
    return [i["content"] for i in body.get("inputs") or body.get("documents") or []]


def test_images_alone_puts_no_text_and_one_image_in_any_input():
    """What CLIP takes (vLLM refuses an image with a text beside it, 400): on every kind, route and post-render case
    (the poisons must get as far as the cache; a pre-render case is refused before it, whatever it carries)."""
    weights = {k: 1 for k in options.WEIGHTS}
    t = _traffic(**{f"weight_{k}": w for k, w in weights.items()}, routes=",".join(routes.PATHS), images_alone=True)
    u = UserTraffic(t, 3, 0, 0, "m")
    reqs = [u.build(u.next_kind()) for _ in range(600)]
    kinds = {r.meta.kind for r in reqs}
    assert {"multi_image", "video"}.isdisjoint(kinds) and {"valid_image", "score", "malformed_post"} <= kinds
    for r in (r for r in reqs if r.meta.kind != "malformed_pre"):
        for parts in _inputs(r.body) if isinstance(r.body, dict) else []:
            types = [p.get("type") for p in parts if isinstance(p, dict)]
            assert types.count("image_url") <= 1 and not ("image_url" in types and "text" in types), (r.meta, parts)
