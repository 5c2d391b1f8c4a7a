"""A server's own API, read from its ``/openapi.json``: which of the routes the hunt sends it serves, what each
takes (the request body's JSON Schema, references resolved) and what it answers (the 200 response's schema). The
hunt generates its requests from these, so it follows each vLLM version's API without a list we keep."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mmchaos import faults

# What the hunt may send: the routes that answer from the pooling runner (embeddings, scores, classes), and those
# that render a prompt (its media too) and never run it. Operator actions (``VLLM_SERVER_DEV_MODE=1``) are the other
# routes it uses, between requests.
ROUTES = (
    "/v1/embeddings",
    "/pooling",
    "/classify",
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
    "/v2/embed",
    "/tokenize",
    "/detokenize",
)
# what an operator does to a running server (VLLM_SERVER_DEV_MODE=1), each action followed by its undo
OPERATOR_ROUTES = tuple(r for pair in faults.OPERATOR_ROUTES.values() for r in pair if r)


class ApiSchemaError(ValueError):
    """The schema cannot be used (one line)."""


@dataclass(frozen=True)
class Route:
    path: str
    request: dict  # the body's JSON Schema, self-contained (no $ref)
    response: dict | None  # the 200 answer's JSON Schema, self-contained; None when the server gives none


def resolve(node: Any, components: Mapping[str, Any], seen: tuple[str, ...] = ()) -> Any:
    """``node`` with every ``#/components/schemas/X`` reference replaced by X itself; a reference back into its own
    chain (a recursive schema) becomes ``{}`` (anything), which bounds the generated depth."""
    if isinstance(node, Mapping):
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[-1]
            if name in seen or name not in components:
                return {}
            return resolve(components[name], components, (*seen, name))
        return {k: resolve(v, components, seen) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve(v, components, seen) for v in node]
    return node


def routes(openapi: Mapping[str, Any]) -> dict[str, Route]:
    """The routes of ROUTES ``openapi`` lists that take a JSON body, by path."""
    if not isinstance(openapi, Mapping) or not isinstance(openapi.get("paths"), Mapping):
        raise ApiSchemaError("the server's /openapi.json has no paths")
    components = (openapi.get("components") or {}).get("schemas") or {}
    out = {}
    for path in ROUTES:
        post = (openapi["paths"].get(path) or {}).get("post")
        if not post:
            continue
        body = ((post.get("requestBody") or {}).get("content") or {}).get("application/json", {}).get("schema")
        if not body:
            continue
        ok = ((post.get("responses") or {}).get("200") or {}).get("content", {}).get("application/json", {})
        response = resolve(ok["schema"], components) if ok.get("schema") else None
        out[path] = Route(path, resolve(body, components), response or None)
    return out


def operator_routes(openapi: Mapping[str, Any]) -> list[str]:
    """The operator actions the server exposes (only with VLLM_SERVER_DEV_MODE=1)."""
    paths = openapi.get("paths") or {}
    return [p for p in OPERATOR_ROUTES if "post" in (paths.get(p) or {})]


def variants(schema: Mapping[str, Any]) -> list[dict]:
    """The object forms a body may take (the members of a top-level anyOf/oneOf, else the schema itself)."""
    members = schema.get("anyOf") or schema.get("oneOf")
    forms = [m for m in members if isinstance(m, Mapping)] if members else [schema]
    return [dict(f) for f in forms if f.get("type", "object") == "object" and isinstance(f.get("properties"), Mapping)]
