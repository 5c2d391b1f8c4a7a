"""The concrete request of a malformed case, built around a pool image: the valid request, then the case's
mutation, ``unset`` and ``patch`` (see catalogue.py for the cases)."""

from __future__ import annotations

import copy

from mmchaos.options import DEFAULT_INSTRUCTION

from .bodies import TOKENIZE_PATH, BuiltRequest, RequestMeta, image_request, tokenize_request
from .catalogue import MalformedCase
from .mutations import MUTATIONS, MutationContext
from .patches import merge_patch, substitute, unset_path
from .pool import PoolImage
from .routes import PATHS as ROUTE_PATHS
from .routes import route_request

DEFAULT_TEXT = "A picture a user uploaded."


def build_malformed_request(
    case: MalformedCase,
    image: PoolImage,
    model: str,
    *,
    max_model_len: int | None = None,
    text: str | None = DEFAULT_TEXT,
    instruction: str | None = DEFAULT_INSTRUCTION,
) -> BuiltRequest:
    """The concrete request of ``case`` built around pool image ``image``: the valid request (image + text,
    instruction as system message), then the mutation, ``unset`` and ``patch``. ``max_model_len`` (the server's
    --max-model-len) is required by the cases whose ``needs_max_model_len`` is true."""
    if case.needs_max_model_len and max_model_len is None:
        raise ValueError(f"malformed case {case.name!r} needs max_model_len (the server's --max-model-len)")
    if case.endpoint == TOKENIZE_PATH:
        base = tokenize_request(model, image, text, instruction=instruction)
    elif case.endpoint in ROUTE_PATHS:
        # no text beside the image (CLIP): none in the inputs, the query of score and rerank stays a text
        alone = text is None
        base = route_request(
            case.endpoint, model, (image,), text or DEFAULT_TEXT, instruction=instruction, image_alone=alone
        )
    else:
        base = image_request(model, image, text, instruction=instruction)
    body = copy.deepcopy(base.body)
    ctx = MutationContext(image, model, max_model_len, text, instruction, case.params)
    if case.mutation:
        body = MUTATIONS[case.mutation].fn(body, ctx)
    for path in case.unset:
        unset_path(body, path)
    if case.patch:
        body = merge_patch(body, substitute(case.patch, ctx))
    meta = RequestMeta(
        kind=case.kind,
        image_ids=(image.id,) if case.carries_image else (),
        image_hashes=(image.hash,) if case.carries_image else (),
        case=case.name,
        expected_status=case.expected_status,
    )
    return BuiltRequest(case.endpoint, body, meta)
