"""Small synthetic videos for ``video_url`` parts: mp4 (H.264) and webm (VP8), a few frames, encoded by PyAV.

A clip is made from its :class:`VideoSpec` alone (a moving gradient and a square whose colours come from the seed),
encoded single-threaded with FFmpeg's bit-exact flags: the same spec gives the same bytes, so a repeated clip is
repeated for vLLM's processor cache too (it hashes the decoded frames), and a fresh one (another seed) is new to it.

The malformed videos (:data:`MALFORMED_VIDEOS`) are made from a good clip: cut short, labelled with the wrong
container, with no frame at all, or with more frames than the model's video processor takes.
"""

from __future__ import annotations

import base64
import functools
import io
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

import numpy as np

from .pool import DataURL, content_hash

CONTAINERS = {"mp4": ("h264", "video/mp4"), "webm": ("libvpx", "video/webm")}
BITEXACT = {"fflags": "+bitexact"}


@dataclass(frozen=True)
class VideoSpec:
    container: str = "mp4"
    width: int = 64
    height: int = 64
    frames: int = 8
    fps: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.container not in CONTAINERS:
            raise ValueError(f"container must be one of {tuple(CONTAINERS)}, got {self.container!r}")
        if self.width < 16 or self.height < 16 or self.width % 2 or self.height % 2:
            raise ValueError(f"a video is at least 16x16 and even-sized, got {self.width}x{self.height}")
        if self.frames < 0 or self.fps < 1:
            raise ValueError(f"frames must be >= 0 and fps >= 1, got {self.frames} and {self.fps}")

    @property
    def mime(self) -> str:
        return CONTAINERS[self.container][1]

    @property
    def name(self) -> str:
        return f"v{self.seed}-{self.container}-{self.width}x{self.height}-{self.frames}f{self.fps}"


def frames_of(spec: VideoSpec) -> np.ndarray:
    """The clip's frames, (n, h, w, 3) uint8: a gradient sliding right and a square crossing it, colours from the
    seed (two seeds differ in every frame)."""
    rng = np.random.default_rng(spec.seed)
    base = rng.integers(0, 256, size=3)
    square = rng.integers(0, 256, size=3)
    x = np.arange(spec.width)
    out = np.empty((spec.frames, spec.height, spec.width, 3), dtype=np.uint8)
    side = max(4, min(spec.width, spec.height) // 4)
    for i in range(spec.frames):
        ramp = ((x * 255 // max(1, spec.width - 1) + i * 16) % 256).astype(np.uint8)
        frame = np.broadcast_to(ramp[None, :, None], (spec.height, spec.width, 3)).copy()
        frame = ((frame.astype(np.int32) + base) % 256).astype(np.uint8)
        left = (i * 5) % max(1, spec.width - side)
        top = (i * 3) % max(1, spec.height - side)
        frame[top : top + side, left : left + side] = square
        out[i] = frame
    return out


@functools.lru_cache(maxsize=256)
def encode(spec: VideoSpec) -> bytes:
    """The clip as a file, the same bytes for the same spec (one encoder thread, bit-exact muxing, no timestamps)."""
    import av  # imported here: the image-only mix never pays for FFmpeg's libraries

    codec, _ = CONTAINERS[spec.container]
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=spec.container, options=BITEXACT) as out:
        stream = out.add_stream(codec, rate=spec.fps)
        assert isinstance(stream, av.video.stream.VideoStream)  # CONTAINERS' codecs are video codecs
        stream.width, stream.height, stream.pix_fmt = spec.width, spec.height, "yuv420p"
        stream.thread_count = 1
        stream.codec_context.flags |= av.codec.context.Flags.bitexact
        if codec == "h264":
            stream.options = {"preset": "ultrafast", "tune": "zerolatency", "crf": "28"}
        stream.time_base = Fraction(1, spec.fps)
        out.start_encoding()  # the header even for a clip of no frame (a file with a moov and no sample)
        for i, pixels in enumerate(frames_of(spec)):
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    return buf.getvalue()


def digest(data: bytes) -> str:
    """The hash rows carry for a video: sha256[:16] of the file, as for images."""
    return content_hash(data)


@dataclass(frozen=True)
class Video:
    """A video as sent: its id (the spec's name, or the malformed case's), its bytes and MIME type."""

    id: str
    data: bytes
    mime: str

    @property
    def hash(self) -> str:
        return digest(self.data)

    @property
    def data_url(self) -> DataURL:
        return DataURL(f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}")

    def file_url(self, folder: Path) -> str:
        """Written once into ``folder`` (which the server must allow: ``--allowed-local-media-path``), by hash."""
        suffix = {"video/mp4": ".mp4", "video/webm": ".webm"}.get(self.mime, ".bin")
        path = Path(folder).resolve() / f"{self.hash}{suffix}"
        if not path.is_file():
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_bytes(self.data)
            tmp.replace(path)
        return path.as_uri()


def clip(spec: VideoSpec) -> Video:
    return Video(spec.name, encode(spec), spec.mime)


# The clips the mix repeats: both containers, sizes and frame rates varied (all small: a 64x64 frame is 4 patches of
# the tiny model). Fresh clips are these with another seed.
POOL_SPECS = (
    VideoSpec("mp4", 64, 64, 8, 4),
    VideoSpec("webm", 64, 64, 8, 4),
    VideoSpec("mp4", 96, 64, 6, 2),
    VideoSpec("webm", 64, 96, 12, 6),
)


def pool(seed: int = 0) -> tuple[Video, ...]:
    return tuple(clip(replace(s, seed=seed * 1000 + i)) for i, s in enumerate(POOL_SPECS))


def fresh(base: VideoSpec, token: int) -> Video:
    """A clip nobody sent before (its seed is ``token`` past the pool's range): new to every cache."""
    return clip(replace(base, seed=1_000_000 + token))


# ----------------------------------------------------------------------------- malformed videos

TOO_MANY_FRAMES = 1024  # > the video processors' max_frames (768 for the Qwen3-VL recipe), at 16x16


def malformed(case: str, seed: int = 0) -> Video:
    """A broken video of ``case`` (:data:`MALFORMED_VIDEOS`), made from a good mp4 clip of ``seed``."""
    good = VideoSpec("mp4", 64, 64, 8, 4, seed=seed)
    if case == "video_truncated":
        data = encode(good)
        return Video(case, data[: len(data) // 3], good.mime)
    if case == "video_wrong_container":  # a webm file labelled as mp4
        return Video(case, encode(replace(good, container="webm")), "video/mp4")
    if case == "video_zero_frames":
        return Video(case, encode(replace(good, frames=0)), good.mime)
    if case == "video_too_many_frames":
        return Video(case, encode(replace(good, width=16, height=16, frames=TOO_MANY_FRAMES, fps=30)), good.mime)
    if case == "video_not_a_video":  # an image's bytes as video/mp4
        return Video(case, b"\x89PNG\r\n\x1a\n" + bytes(64), good.mime)
    raise ValueError(f"unknown malformed video {case!r}; known: {', '.join(MALFORMED_VIDEOS)}")


MALFORMED_VIDEOS = (
    "video_truncated",
    "video_wrong_container",
    "video_zero_frames",
    "video_too_many_frames",
    "video_not_a_video",
)
