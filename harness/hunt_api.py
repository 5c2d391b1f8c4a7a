"""Requests from the server's own API: the pooling routes a server's /openapi.json lists, a Hypothesis strategy of
request bodies for each (hypothesis-jsonschema on the route's own request schema), and the response schema each
answer must validate against.

hypothesis-jsonschema rather than Schemathesis: the hunt needs strategies of bodies to compose inside its own
stateful machine (images reused across requests, hang-ups, operator actions), not a test runner with its own
transport and checks; hypothesis-jsonschema gives exactly that, on the Hypothesis we already use.

Media-aware: the fields vLLM reads as media (``messages[].content[].image_url.url``, Cohere's ``images``) are not
drawn from the schema (a random string is no image): the schema draws every other field, and the media fields come
from the case's image pool (hunt_media)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import jsonschema
import requests
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

# routes that run a pooling model, as vLLM names them across versions; the schema says which a server has
POOLING_ROUTES = ("/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank",
                  "/v2/rerank", "/v2/embed")
MEDIA_FIELDS = ("messages", "images", "input", "inputs")  # ours, not the schema's
OPERATOR_ROUTES = ("/reset_mm_cache", "/reset_prefix_cache")  # exposed with VLLM_SERVER_DEV_MODE=1


class ApiError(Exception):
    """One line: what the target's API lacks."""


@dataclass
class Route:
    path: str
    form: str  # "chat" (messages with an image), "cohere" (images), "text" (input only)
    params: dict  # JSON schema of the non-media fields
    response: dict | None  # JSON schema of a 200 answer, refs resolved

    def __repr__(self) -> str:  # how Hypothesis prints a case's steps
        return f"Route({self.path!r}, {self.form!r})"


def fetch(base_url: str, headers: dict, timeout: float = 10.0) -> dict:
    try:
        r = requests.get(base_url + "/openapi.json", headers=headers, timeout=timeout)
    except requests.RequestException as e:
        raise ApiError(f"{base_url}/openapi.json: {type(e).__name__}") from e
    if r.status_code != 200:
        raise ApiError(f"{base_url}/openapi.json answered {r.status_code}: the hunt reads the server's API from it")
    try:
        return r.json()
    except ValueError as e:
        raise ApiError(f"{base_url}/openapi.json is not JSON") from e


def _resolve(node, components: dict, depth: int = 0):
    """The schema with every local $ref inlined (recursive refs cut at a depth: bodies are shallow)."""
    if isinstance(node, dict):
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            return _resolve(components.get(name, {}), components, depth + 1) if depth < 8 else {}
        return {k: _resolve(v, components, depth) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, components, depth) for v in node]
    return node


def _variants(schema: dict) -> list[dict]:
    return [v for key in ("anyOf", "oneOf") for v in schema.get(key, [])] or [schema]


def _params(variant: dict) -> dict:
    """The variant's schema without the media fields (ours) and without `model` (the server's own)."""
    s = copy.deepcopy(variant)
    props = {k: v for k, v in s.get("properties", {}).items() if k not in (*MEDIA_FIELDS, "model")}
    return {"type": "object", "properties": props, "additionalProperties": False,
            "required": [r for r in s.get("required", []) if r in props]}


def routes(spec: dict) -> list[Route]:
    """The pooling routes of ``spec`` the hunt can build a media request for, each with its forms."""
    components = spec.get("components", {}).get("schemas", {})
    out = []
    for path in POOLING_ROUTES:
        op = spec.get("paths", {}).get(path, {}).get("post")
        if not op:
            continue
        body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
        if body is None:
            continue
        ok = op.get("responses", {}).get("200", {}).get("content", {}).get("application/json", {}).get("schema")
        response = _resolve(ok, components) if ok else None
        for v in _variants(_resolve(body, components)):
            props = v.get("properties", {})
            form = "chat" if "messages" in props else "cohere" if "images" in props else None
            if form:
                out.append(Route(path, form, _params(v), response or None))
    return out


def operator_routes(spec: dict) -> list[str]:
    return [p for p in OPERATOR_ROUTES if "post" in spec.get("paths", {}).get(p, {})]


def params_strategy(route: Route) -> st.SearchStrategy:
    """Bodies' non-media fields as the schema allows them; mostly none, so that most requests are valid ones.

    The body object is composed here (fixed_dictionaries over the optional fields) and each field drawn from its
    own schema: hypothesis-jsonschema 0.23.1 draws objects through a Hypothesis internal (``many().more()``) that
    Hypothesis 6.170 no longer has, so fields that are themselves objects are left out."""
    fields = {k: from_schema(v) for k, v in route.params.get("properties", {}).items() if not _has_object(v)}
    return st.one_of(st.just({}), st.fixed_dictionaries({}, optional=fields))


def _has_object(schema) -> bool:
    if isinstance(schema, dict):
        return schema.get("type") == "object" or "properties" in schema or any(map(_has_object, schema.values()))
    if isinstance(schema, list):
        return any(map(_has_object, schema))
    return False


def body(route: Route, model: str, image_url: str, text: str, params: dict) -> dict:
    if route.form == "cohere":
        return {"model": model, "images": [image_url], **params}
    content = [{"type": "image_url", "image_url": {"url": image_url}}, {"type": "text", "text": text}]
    return {"model": model, "messages": [{"role": "user", "content": content}], **params}


def schema_error(route: Route, answer) -> str | None:
    """Why a 200 answer does not validate against the route's response schema, else None."""
    if route.response is None:
        return None
    try:
        jsonschema.validate(answer, route.response)
    except jsonschema.ValidationError as e:
        return f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message[:200]}"
    return None
