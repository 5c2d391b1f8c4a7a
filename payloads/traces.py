"""A trace, read back: the requests a run sent (mmchaos.schema.TRACE) and their images (TRACE_IMAGES), turned into
the exact bytes that went out. Replay, the request-log converter and the minimizer read traces through this.

Per-user order is the order of ``t_start`` within a *lane*: the requests of one user of one Locust process
(``worker``, ``user_id``), sent one after the other on that user's connection (an abort on a connection of its own).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from mmchaos import schema
from mmchaos.errors import MmchaosError
from mmchaos.tables import PartWriter, read_table, table_dir

from . import generated
from .bodies import fill_template
from .fresh import fresh_data, stamp_digest
from .image_spec import ImageSpec
from .pool import DataURL, ImageRef, ImageURL, PoolImage, content_hash, url_text

IMAGE, GENERATED, FRESH, DERIVED, URL = schema.IMAGE_FORMS
# what a trace takes from the rows of the same requests
ROW_COLUMNS = (
    "request_id",
    "worker",
    "user_id",
    "seq",
    "attempt",
    "request_group",
    "t_start",
    "endpoint",
    "kind",
    "case",
    "probe",
    "expected_status",
    "status",
    "outcome",
    "image_hashes",
)


class TraceError(MmchaosError, ValueError):
    """A trace that cannot be read or sent again (one line)."""


@dataclass
class Trace:
    requests: pd.DataFrame  # TRACE rows, in the order they were sent (index 0..n-1)
    images: dict[str, dict]  # TRACE_IMAGES rows by hash
    _urls: dict[str, DataURL] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, folder: Path | str) -> Trace:
        """The trace kept in a trial (or ad-hoc run) folder, with what its rows say of each request (who sent it,
        when, its kind and case, the status it got). A traced request without a row (its process was killed
        before writing it) is left out: when it was sent is unknown."""
        folder = Path(folder)
        if not table_dir(folder, "trace").is_dir():
            raise TraceError(f"no trace in {folder} (traces are kept unless --no-trace / no_trace = true)")
        try:
            trace = read_table(folder, "trace").to_pandas()
            images = read_table(folder, "trace_images").to_pandas()
            rows = read_table(folder, "requests").to_pandas()
        except (OSError, ValueError) as e:
            raise TraceError(f"cannot read the trace in {folder}: {str(e).splitlines()[0][:200]}") from e
        keys = ["worker", "user_id", "seq"]
        requests = trace.merge(rows[list(ROW_COLUMNS)].drop_duplicates(keys), on=keys, how="inner")
        return cls.of(requests, images.drop_duplicates("hash").to_dict("records"))

    @classmethod
    def of(cls, requests: pd.DataFrame, images) -> Trace:
        """A trace from its requests (TRACE columns and ROW_COLUMNS) and images (TRACE_IMAGES rows)."""
        requests = requests.sort_values(["t_start", "worker", "user_id", "seq"], kind="stable", ignore_index=True)
        trace = cls(requests, {im["hash"]: im for im in images})
        missing = {h for hs in requests["images"].dropna() for h in hs.split(",")} - set(trace.images)
        if missing:
            raise TraceError(f"the trace names {len(missing)} image(s) it does not hold (e.g. {sorted(missing)[0]})")
        return trace

    def __len__(self) -> int:
        return len(self.requests)

    # -- bytes ---------------------------------------------------------------------------------------------
    def image_hashes(self, i: int) -> list[str]:
        h = self.requests.at[i, "images"]
        return h.split(",") if isinstance(h, str) and h else []

    def payload(self, i: int) -> bytes:
        """Request ``i``'s body, byte for byte as it was sent."""
        return fill_template(self.requests.at[i, "body"], [self.url(h) for h in self.image_hashes(i)])

    def template(self, i: int) -> tuple[bytes, list[DataURL]]:
        return self.requests.at[i, "body"], [self.url(h) for h in self.image_hashes(i)]

    def url(self, h: str) -> DataURL:
        """The URL of image ``h`` as it was sent; an image's URL also carries its ref, so the trace of a replay
        keeps each image once too. Pool images and URLs are kept (a pool is small); fresh ones, used once, are
        made again when asked."""
        if h in self._urls:
            return self._urls[h]
        row = self.images[h]
        if row["form"] == URL:
            url = DataURL(row["data"].decode())
        elif row["form"] == DERIVED:
            url = DataURL(self._derived_text(h, row))
        else:
            url = ImageURL(f"data:{row['mime']};base64,{base64.b64encode(self.data(h)).decode('ascii')}")
            base = self._image_url(row["base"]) if row["form"] == FRESH else None
            spec = ImageSpec(**json.loads(row["spec"])) if row["form"] == GENERATED else None
            url.ref = ImageRef(
                h,
                row["mime"],
                row["format"],
                int(row["width"]),
                int(row["height"]),
                row["mode"],
                _int_or_none(row["quality"]),
                base,
                row["token"] if base is not None else None,
                spec,
            )
        if row["form"] != FRESH:
            self._urls[h] = url
        return url

    def _image_url(self, h: str) -> ImageURL:
        """The URL of image ``h`` that another is made from (a fresh image's base, a derived URL's source)."""
        url = self.url(h)
        if not isinstance(url, ImageURL):
            raise TraceError(f"image {h}, which another is made from, is kept as a URL, not as an image")
        return url

    def _derived_text(self, h: str, row: dict) -> str:
        how = json.loads(row["spec"])
        source = url_text(self._image_url(row["base"]), how["encoding"], self.data(row["base"]))
        text = source[: how["prefix"]] + row["data"].decode() + source[len(source) - how["suffix"] :]
        if content_hash(text.encode()) != h:
            raise TraceError(f"the URL {h} made from image {row['base']} does not come out the same")
        return text

    def data(self, h: str) -> bytes:
        """The encoded file of image ``h`` (a fresh image made again, and checked to come out the same)."""
        row = self.images[h]
        if row["form"] == IMAGE:
            return row["data"]
        if row["form"] in (URL, DERIVED):
            raise TraceError(f"image {h} is a URL, not a file")
        if row["form"] == GENERATED:
            data, _ = generated.image_data(ImageSpec(**json.loads(row["spec"])), generated.cache_folder())
        else:
            data, _, _ = fresh_data(self.pool_image(row["base"]), stamp_digest(row["token"]))
        if content_hash(data) != h:
            raise TraceError(
                f"{row['form']} image {h} does not come out the same on this machine (another Pillow, "
                "libjpeg or zlib?): export the trace where it was recorded (mmchaos trace export)"
            )
        return data

    def pool_image(self, h: str) -> PoolImage:
        row = self.images[h]
        return PoolImage(
            id=h,
            format=row["format"],
            width=int(row["width"]),
            height=int(row["height"]),
            data=self.data(h),
            hash=h,
            mode=row["mode"],
            quality=_int_or_none(row["quality"]),
        )

    # -- structure -----------------------------------------------------------------------------------------
    def lane_keys(self) -> pd.Series:
        """Each request's lane: the user that sent it (its requests go out one after the other, in order)."""
        return self.requests["worker"].astype(str) + "/" + self.requests["user_id"].astype(str)

    def lanes(self) -> list[list[int]]:
        """Request indices per lane, each in sending order; lanes in the order of their first request."""
        keys = self.lane_keys()
        return [list(ix) for _, ix in keys.groupby(keys, sort=False).groups.items()]

    def subset(self, indices) -> Trace:
        """The requests at ``indices`` (kept in sending order) and only the images they need."""
        requests = self.requests.loc[sorted(indices)].reset_index(drop=True)
        return Trace(requests, needed_images(requests, self.images))


def needed_images(requests: pd.DataFrame, images: dict[str, dict]) -> dict[str, dict]:
    """The images ``requests`` send, and those they are made from."""
    todo = [h for hs in requests["images"].dropna() for h in hs.split(",") if h]
    out: dict[str, dict] = {}
    while todo:
        h = todo.pop()
        if h not in out:
            out[h] = images[h]
            if out[h]["form"] in (FRESH, DERIVED):
                todo.append(out[h]["base"])
    return out


def save(trace: Trace, folder: Path | str) -> None:
    """Write ``trace`` into ``folder`` as a run keeps one: trace/, trace_images/, and requests/ holding what is
    known of each request (an imported log: what production saw)."""
    tables = (
        ("trace_images", list(trace.images.values())),
        ("trace", trace.requests.to_dict("records")),
        ("requests", trace.requests.to_dict("records")),
    )
    for table, rows in tables:
        table_schema = schema.TABLES[table]
        w = PartWriter(table_dir(folder, table), table_schema, tag="import")
        for r in rows:
            w.add({k: _plain(r.get(k)) for k in table_schema.names})
        w.flush()


def _plain(v):
    """A value as a Parquet writer takes it (pandas' missing values as None)."""
    return None if v is not None and not isinstance(v, (bytes, str)) and pd.isna(v) else v


def _int_or_none(v) -> int | None:
    return None if v is None or pd.isna(v) else int(v)
