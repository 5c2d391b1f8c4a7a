"""The other pooling routes a multimodal embedder serves, and their bodies built around pool images, as bodies.py
builds ``/v1/embeddings``': Cohere's ``/v2/embed``, ``/pooling``, the score routes and the rerank routes.

Measured with the tiny Qwen3-VL embedder on 0.30.0 and 0.32.0 (each form below answered 200 with images; ``/classify``
is not served to an embedder): ``/v2/embed`` takes ``inputs`` of ``{"content": [parts]}`` and refuses an
``input_type`` the model defines no instruction for; score and rerank take a text query and documents of
``{"content": [parts]}``. A route is sent only where the server's ``/openapi.json`` lists it."""

from __future__ import annotations

from collections.abc import Sequence

from mmchaos.options import DEFAULT_INSTRUCTION

from .bodies import BuiltRequest, RequestMeta, conversation, image_part, text_part
from .pool import PoolImage

# kind -> the paths that serve it (aliases: the same handler under the names clients use)
ROUTE_KINDS: dict[str, tuple[str, ...]] = {
    "embed_v2": ("/v2/embed",),
    "pooling": ("/pooling",),
    "score": ("/score", "/v1/score"),
    "rerank": ("/rerank", "/v1/rerank", "/v2/rerank"),
}
KIND_OF_PATH = {path: kind for kind, paths in ROUTE_KINDS.items() for path in paths}
PATHS = tuple(KIND_OF_PATH)
NO_ROUTES = "none"  # a --routes value: the server lists none of them (or its /openapi.json could not be read)
DOCUMENTS = 2  # documents per score or rerank request, one image each: a query against a short list


def item(images: Sequence[PoolImage], text: str | None) -> dict:
    """A Cohere input, or a score or rerank document: ``{"content": [images..., text]}``."""
    return {"content": [*map(image_part, images), *([text_part(text)] if text is not None else [])]}


def route_request(
    path: str,
    model: str,
    images: Sequence[PoolImage],
    text: str,
    *,
    instruction: str | None = DEFAULT_INSTRUCTION,
    image_alone: bool = False,
) -> BuiltRequest:
    """A valid request to ``path`` carrying ``images``: one input of all of them and ``text`` (``/v2/embed``,
    ``/pooling``), or one document per image against ``text`` as the query (score, rerank). ``image_alone``: no
    text beside an image in any input (CLIP takes an image or a text, not both)."""
    kind = KIND_OF_PATH.get(path)
    if kind is None:
        raise ValueError(f"no body form for {path!r} (one of {', '.join(PATHS)})")
    if not images:
        raise ValueError(f"a {kind} request needs at least one image")
    beside = None if image_alone else text
    if kind == "embed_v2":
        body: dict = {"model": model, "inputs": [item(images, beside)], "embedding_types": ["float"]}
    elif kind == "pooling":
        body = {"model": model, "messages": conversation(tuple(images), beside, None if image_alone else instruction)}
    else:
        docs = [item((im,), None if image_alone else f"document {i + 1}") for i, im in enumerate(images)]
        body = {"model": model, "query" if kind == "rerank" else "queries": text, "documents": docs}
    meta = RequestMeta(
        kind=kind,
        image_ids=tuple(im.id for im in images),
        image_hashes=tuple(im.hash for im in images),
        n_inputs=len(images) if kind in ("score", "rerank") else 1,
    )
    return BuiltRequest(path, body, meta)


def served(paths: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """kind -> its paths among ``paths`` (those a server lists), for the kinds it serves at all."""
    listed = set(paths)
    out = {kind: tuple(p for p in aliases if p in listed) for kind, aliases in ROUTE_KINDS.items()}
    return {kind: aliases for kind, aliases in out.items() if aliases}


def listed(text: str) -> list[str]:
    """The paths of a ``--routes`` value: comma-separated paths of PATHS, or ``none``."""
    paths = [p.strip() for p in text.split(",") if p.strip() and p.strip() != NO_ROUTES]
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        raise ValueError(f"--routes: unknown route {unknown[0]!r}; known: {', '.join(PATHS)}")
    return paths
