"""Smaller variants of a trace, for the minimizer: all requests on one connection, a request with one image
fewer, an image made smaller, an abort that hangs up sooner. Each returns a new trace (or None when the edit does
not apply); bodies change only where the edit says."""

from __future__ import annotations

import io
import json

from PIL import Image

from .bodies import URL_SLOT
from .pool import MIME, content_hash
from .traces import FRESH, GENERATED, IMAGE, Trace, needed_images

_SLOT_TEXT = json.loads(b'"' + URL_SLOT + b'"')
SERIAL_WORKER = "serial"


def serialized(trace: Trace) -> Trace:
    """Every request from one user, one after the other, in the order they were sent (an abort still hangs up
    on a connection of its own, as a client that gives up does)."""
    requests = trace.requests.copy()
    requests["worker"], requests["user_id"] = SERIAL_WORKER, 0
    requests["seq"] = range(1, len(requests) + 1)
    return Trace.of(requests, trace.images.values())


def without_image(trace: Trace, i: int, j: int) -> Trace | None:
    """Request ``i`` without its ``j``-th image (its part of the message removed), when it has several."""
    hashes = trace.image_hashes(i)
    if len(hashes) < 2 or not 0 <= j < len(hashes):
        return None
    body = json.loads(trace.requests.at[i, "body"])
    seen = [0]

    def drop(node):
        if isinstance(node, list):
            out = []
            for v in node:
                if (
                    isinstance(v, dict)
                    and v.get("type") == "image_url"
                    and (v.get("image_url") or {}).get("url") == _SLOT_TEXT
                ):
                    seen[0] += 1
                    if seen[0] - 1 == j:
                        continue
                out.append(drop(v))
            return out
        if isinstance(node, dict):
            return {k: drop(v) for k, v in node.items()}
        return node

    body = drop(body)
    if seen[0] != len(hashes):  # a slot outside a message part (a malformed body): leave it alone
        return None
    requests = trace.requests.copy()
    requests.at[i, "body"] = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    requests.at[i, "images"] = ",".join(hashes[:j] + hashes[j + 1 :])
    return Trace.of(requests, needed_images(requests, trace.images).values())


def with_smaller_image(trace: Trace, h: str, long_side: int) -> Trace | None:
    """Image ``h`` (wherever it is sent) scaled down to ``long_side`` px on its longer side, in its format; None
    when it is a URL or already that small."""
    row = trace.images[h]
    if row["form"] not in (IMAGE, GENERATED, FRESH) or max(row["width"], row["height"]) <= long_side:
        return None
    with Image.open(io.BytesIO(trace.data(h))) as im:
        im.load()
        scale = long_side / max(im.size)
        small = im.resize((max(1, round(im.width * scale)), max(1, round(im.height * scale))), Image.Resampling.LANCZOS)
    fmt = row["format"] if row["format"] in ("jpeg", "png", "webp") else "png"
    if fmt == "jpeg" and small.mode not in ("RGB", "L"):
        small = small.convert("RGB")
    buf = io.BytesIO()
    small.save(buf, format=fmt.upper(), **({"quality": 90} if fmt in ("jpeg", "webp") else {}))
    data = buf.getvalue()
    new = content_hash(data)
    images = dict(trace.images)
    images[new] = {
        "hash": new,
        "form": IMAGE,
        "mime": MIME[fmt],
        "format": fmt,
        "width": small.width,
        "height": small.height,
        "mode": small.mode,
        "quality": None,
        "data": data,
    }
    requests = trace.requests.copy()
    requests["images"] = requests["images"].map(
        lambda s: ",".join(new if x == h else x for x in s.split(",")) if isinstance(s, str) and s else s
    )
    return Trace.of(requests, needed_images(requests, images).values())


def with_sooner_abort(trace: Trace, i: int, after_ms: float) -> Trace | None:
    """Request ``i`` (an abort) hanging up after ``after_ms`` instead; None when it is no abort or hangs up that
    soon already."""
    current = trace.requests.at[i, "abort_after_ms"]
    if current != current or current is None or current <= after_ms:  # NaN or None: it waited for its answer
        return None
    requests = trace.requests.copy()
    requests.at[i, "abort_after_ms"] = after_ms
    return Trace.of(requests, trace.images.values())
