"""What one user sends next: a kind drawn by weight, images drawn by the reuse model, a request built for it.

Kept apart from the Locust classes so the mix is testable without a server. Each user has its own numpy
Generator seeded from (seed, worker index, user id): a run's sequence of requests is reproducible. (Locust's
own task weighting draws from the global `random`, which cannot be seeded per user.)
"""

from __future__ import annotations

import bisect
from dataclasses import replace

import numpy as np

from mmchaos.options import WEIGHTS
from mmchaos.payloads import bodies as build
from mmchaos.payloads import catalogue, documents, fresh, malformed, routes, video, video_cases
from mmchaos.payloads.pool import PoolImage
from mmchaos.payloads.reuse import ReuseModel
from mmchaos.payloads.shared_pool import shared_pool

KINDS = tuple(WEIGHTS)
TEXTS = (
    "a photo of a city street at dusk",
    "product shot on a white background",
    "screenshot of a settings page",
    "a hand-drawn diagram with labels",
    "two people talking in a kitchen",
    "scanned receipt, slightly rotated",
    "aerial view of farmland",
    "close-up of a circuit board",
)


class TrafficConfigError(ValueError):
    pass


class Traffic:
    """Process-wide, shared by all users: the pool, the reuse model, the catalogue and the weights."""

    def __init__(self, o):
        self.o = o
        self.routes = routes.served(routes.listed(o.routes))  # route kind -> the paths the server lists for it
        # a route kind the server does not serve is not sent (its weight stays in the options, for the next server);
        # nor, to a model that takes an image alone (CLIP), several images in one input or a video
        unsent = {*routes.ROUTE_KINDS} - {*self.routes} | ({"multi_image", "video"} if o.images_alone else set())
        weights = np.array([0 if k in unsent else max(0, getattr(o, f"weight_{k}")) for k in KINDS], dtype=float)
        if weights.sum() <= 0:
            raise TrafficConfigError("all request weights are 0: give at least one kind a weight")
        self.p = weights / weights.sum()
        cdf = self.p.cumsum()
        cdf /= cdf[-1]  # as numpy's Generator.choice computes it
        self.kind_cdf = cdf.tolist()
        if o.image_dir:
            self.pool = shared_pool(o.image_dir)
        else:
            kw = {"n": o.pool_size, "seed": o.image_seed, "preset": o.image_preset}
            if o.max_side:
                kw["max_side"] = o.max_side
            self.pool = shared_pool(**kw)
        self.reuse = ReuseModel(len(self.pool), o.zipf, o.fresh_fraction)
        self.documents: tuple[documents.Document, ...] = ()
        if o.weight_document > 0:  # made (or read from the disk cache) only when documents are sent
            side = min(o.page_side, o.max_side) if o.max_side else o.page_side
            self.documents = documents.document_pool(o.doc_pool_size, o.image_seed, o.doc_pages, side)
        self.doc_reuse = ReuseModel(max(1, len(self.documents)), o.zipf, o.fresh_fraction)
        cases = catalogue.load_cases(*([o.cases_file] if o.cases_file else []))
        names = [n.strip() for n in o.malformed_cases.split(",") if n.strip()]
        weighted = [k for k in ("malformed_pre", "malformed_post") if self.p[KINDS.index(k)] > 0]
        try:
            served = [p for paths in self.routes.values() for p in paths]
            self.cases = cases.by_kind(o.max_model_len, names, weighted, served)
        except ValueError as e:
            raise TrafficConfigError(str(e)) from e
        self.instruction = None if o.images_alone else o.instruction or None
        if o.images_alone:  # a post-render case that puts a text beside its image is refused before the cache there
            self.cases["malformed_post"] = [c for c in self.cases["malformed_post"] if self._alone(c)]
            if not self.cases["malformed_post"] and "malformed_post" in weighted:
                raise TrafficConfigError("--images-alone: no selected post-render case carries an image alone")
        self.videos = video.pool(o.image_seed)

    def _alone(self, case) -> bool:
        req = malformed.build_malformed_request(case, self.pool[0], "m", max_model_len=self.o.max_model_len, text=None)
        return not build.image_beside_text(req.body)


class UserTraffic:
    """One user's stream of requests. ``offload``: where the whole re-encodes of its fresh images run
    (fresh.Offload; its Locust process's run state owns the threads)."""

    def __init__(
        self,
        traffic: Traffic,
        seed: int,
        worker_index: int,
        user_id: int,
        model: str,
        offload: fresh.Offload | None = None,
    ):
        self.t = traffic
        self.offload = offload
        ss = np.random.SeedSequence([seed, worker_index, user_id])
        self.rng = np.random.default_rng(ss)
        self.sampler = traffic.reuse.sampler(ss.spawn(1)[0])
        self.doc_sampler = traffic.doc_reuse.sampler(ss.spawn(1)[0])  # the next child: the images' draws stay
        self.fresh_docs = 0
        self.model = model
        self.user_id = user_id
        self.worker_index = worker_index
        self.fresh_n = 0
        self.fresh_videos = 0

    def image(self):
        d = self.sampler.draw()
        if d.fresh:
            self.fresh_n += 1  # unique per user and worker: fresh images never repeat across the run
            token = f"{self.worker_index}-{self.user_id}-{self.fresh_n}"
            return fresh.fresh_image(self.t.pool[d.pool_index], token, self.offload)
        return self.t.pool[d.pool_index]

    def document(self) -> tuple[PoolImage, ...]:
        """A document's pages: one of the pool's, or a never-sent one (pool pages stamped anew, as fresh images)."""
        d = self.doc_sampler.draw()
        doc = self.t.documents[d.pool_index]
        if not d.fresh:
            return doc.pages
        self.fresh_docs += 1
        token = f"doc-{self.worker_index}-{self.user_id}-{self.fresh_docs}"
        return tuple(fresh.fresh_image(p, f"{token}-{i}", self.offload) for i, p in enumerate(doc.pages))

    def video(self) -> video.Video:
        """A clip of the video pool (uniform: four clips are all hot), or with --fresh-fraction a never-sent one."""
        base = self.t.videos[int(self.rng.integers(len(self.t.videos)))]
        if self.rng.random() < self.t.o.fresh_fraction:
            self.fresh_videos += 1  # unique per user and worker, as fresh images
            spec = video.POOL_SPECS[int(self.rng.integers(len(video.POOL_SPECS)))]
            return video.fresh(spec, (self.worker_index * 100_000 + self.user_id) * 1_000_000 + self.fresh_videos)
        return base

    def _with_video(self, kind: str) -> bool:
        share = self.t.o.video_share
        return share > 0 and kind in ("malformed_pre", "malformed_post", "abort") and self.rng.random() < share

    def _video_request(self, kind: str) -> build.BuiltRequest:
        ins = self.t.instruction
        if kind in ("video", "abort"):
            req = video_cases.valid(
                self.model, self.video(), self._text(), instruction=ins, encoding_format=self._format()
            )
            return req if kind == "video" else req._replace(meta=replace(req.meta, kind="abort"))
        if kind == "malformed_post":
            return video_cases.malformed(video_cases.POISON_CASE, self.model, self.video(), instruction=ins)
        name = video_cases.PRE_CASES[int(self.rng.integers(len(video_cases.PRE_CASES)))]
        return video_cases.malformed(name, self.model, self.video(), instruction=ins, seed=self.fresh_videos)

    def _format(self) -> str:
        return "base64" if self.rng.random() < self.t.o.base64_fraction else "float"

    def _text(self) -> str:
        return TEXTS[int(self.rng.integers(len(TEXTS)))]

    def _beside(self) -> str | None:
        """The text beside an image in its input (drawn either way: the same seed draws the same requests)."""
        text = self._text()
        return None if self.t.o.images_alone else text

    def next_kind(self) -> str:
        # the draw of rng.choice(len(KINDS), p=p) -- one uniform, searched in p's normalised cumulative sum --
        # without its ~20 us of argument checks per call: the same kinds for the same seed
        return KINDS[bisect.bisect_right(self.t.kind_cdf, self.rng.random())]

    def build(self, kind: str) -> build.BuiltRequest:
        o, ins = self.t.o, self.t.instruction
        if kind == "video" or self._with_video(kind):
            return self._video_request(kind)
        if kind in ("valid_image", "abort"):
            req = build.image_request(
                self.model, self.image(), self._beside(), instruction=ins, encoding_format=self._format()
            )
            return req if kind == "valid_image" else req._replace(meta=replace(req.meta, kind="abort"))
        if kind == "text":
            return build.text_request(self.model, self._text(), encoding_format=self._format())
        if kind == "multi_image":
            ims = [self.image() for _ in range(max(2, o.multi_images))]
            return build.multi_image_request(
                self.model, ims, self._text(), instruction=ins, encoding_format=self._format()
            )
        if kind == "batch":
            inputs = [
                build.EmbedInput(images=(self.image(),), text=self._beside()) for _ in range(max(1, o.batch_size))
            ]
            return build.batch_request(self.model, inputs, instruction=ins, encoding_format=self._format())
        if kind == "tokenize":
            return build.tokenize_request(self.model, self.image(), self._beside(), instruction=ins)
        if kind == "document":
            pages = [build.EmbedInput(images=(p,)) for p in self.document()]
            req = build.batch_request(self.model, pages, instruction=ins, encoding_format=self._format())
            return req._replace(meta=replace(req.meta, kind="document"))
        if kind in routes.ROUTE_KINDS:
            paths = self.t.routes[kind]
            path = paths[int(self.rng.integers(len(paths)))]
            n = routes.DOCUMENTS if kind in ("score", "rerank") else 1
            ims = [self.image() for _ in range(n)]
            alone = self.t.o.images_alone
            return routes.route_request(path, self.model, ims, self._text(), instruction=ins, image_alone=alone)
        cases = self.t.cases[kind]
        case = cases[int(self.rng.integers(len(cases)))]
        text = None if o.images_alone else malformed.DEFAULT_TEXT
        return malformed.build_malformed_request(
            case, self.image(), self.model, max_model_len=o.max_model_len, text=text, instruction=ins
        )
