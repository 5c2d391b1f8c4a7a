"""The trace: what each request attempt sent, kept as it goes out, so that it can be sent again byte for byte
(locustfiles/replay.py, ``mmchaos minimize``).

A body is kept with its image URLs swapped for slots (payloads.bodies.body_template) and each image is kept once,
in its own table: a generated pool image as its spec, a fresh image as the image it was made from and the stamp's
token (both made again, and checked by hash, when read), one of the user's images as its file, a malformed case's
URL made from an image as what differs from that image's URL, any other URL as its text. A long run's trace
therefore costs little more than its rows (docs/benchmarks.md).
"""

from __future__ import annotations

import base64
import json
from collections import OrderedDict

import gevent

from mmchaos.payloads.pool import DerivedURL, url_text
from mmchaos.sameness import content_hash
from mmchaos.tables import PartWriter, process_tag

KEPT = 50_000  # image hashes remembered as written: a long run's memory stays flat (~5 MB)


def common_affixes(a: str, b: str) -> tuple[int, int]:
    """Lengths of the longest common prefix and suffix of ``a`` and ``b`` (not overlapping in either), found by
    halving: each step compares slices, which Python does at memcmp speed."""

    def longest(same, limit: int) -> int:
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if same(mid) else (lo, mid - 1)
        return lo

    limit = min(len(a), len(b))
    pre = longest(lambda n: a[:n] == b[:n], limit)
    suf = longest(lambda n: a[len(a) - n :] == b[len(b) - n :], limit - pre)
    return pre, suf


class Tracer:
    """This process's trace of a run: the ``trace`` and ``trace_images`` tables, through the writers it is given
    (the run's folder, or on a Locust worker its master's: plugin.table_writer)."""

    def __init__(self, requests: PartWriter, images: PartWriter, interval: float = 1.0):
        self.requests, self.images = requests, images
        self.worker = process_tag()  # as the recorder stamps its rows
        self.interval = interval
        self.kept: OrderedDict[str, None] = OrderedDict()  # hashes written, the most recently seen last
        self._closed = False
        self._loop = gevent.spawn(self._flush_loop)

    def record(self, ctx: dict, template: bytes, urls, abort_after_ms: float | None) -> None:
        self.requests.add(
            {
                "worker": self.worker,
                "user_id": ctx.get("user_id"),
                "seq": ctx.get("seq"),
                "abort_after_ms": abort_after_ms,
                "body": template,
                "images": ",".join(self._keep(u) for u in urls) or None,
            }
        )

    def _keep(self, url: str) -> str:
        """The hash of the image behind ``url``, stored the first time it is seen."""
        ref = getattr(url, "ref", None)
        if ref is None:  # a URL made for the request: kept as how it differs from its image, or as it is
            h = content_hash(url.encode())
            if not self._seen(h):
                self.images.add(
                    self._derived(h, url)
                    if isinstance(url, DerivedURL)
                    else {"hash": h, "form": "url", "data": url.encode()}
                )
            return h
        if self._seen(ref.hash):
            return ref.hash
        row = {
            "hash": ref.hash,
            "mime": ref.mime,
            "format": ref.format,
            "width": ref.width,
            "height": ref.height,
            "mode": ref.mode,
            "quality": ref.quality,
        }
        if ref.base is not None:
            row.update(form="fresh", base=self._keep(ref.base), token=ref.token)
        elif ref.spec is not None:
            row.update(form="generated", spec=json.dumps(ref.spec.__dict__, sort_keys=True))
        else:
            row.update(form="image", data=base64.b64decode(url.partition(",")[2]))
        self.images.add(row)
        return ref.hash

    def _seen(self, h: str) -> bool:
        """Whether ``h`` was written (recently); remembers it from now on. Fresh images never come back, so the
        memory is bounded (KEPT): one forgotten and seen again is written again, and a reader keeps one row per
        hash."""
        if h in self.kept:
            self.kept.move_to_end(h)
            return True
        self.kept[h] = None
        if len(self.kept) > KEPT:
            self.kept.popitem(last=False)
        return False

    def _derived(self, h: str, url: DerivedURL) -> dict:
        source = url_text(url.source, url.encoding)
        pre, suf = common_affixes(source, url)
        return {
            "hash": h,
            "form": "derived",
            "base": self._keep(url.source),
            "data": url[pre : len(url) - suf].encode(),
            "spec": json.dumps({"prefix": pre, "suffix": suf, "encoding": url.encoding}),
        }

    def _flush_loop(self) -> None:
        while True:
            gevent.sleep(self.interval)  # the flush period, as the recorder's
            self.flush(pause=lambda: gevent.sleep(0))

    def flush(self, pause=None) -> None:
        self.images.flush(pause)  # images first: a trace row never names an image a crash left unwritten
        self.requests.flush(pause)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.kill()
        self.flush()
