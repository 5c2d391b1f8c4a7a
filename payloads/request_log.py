"""The JSONL request log: anyone's traffic, one request per line, in a form a person can write by hand
(docs/request-log.md), and the converters between it and a trace.

    {"t": 0.0, "session": "u1", "endpoint": "/v1/embeddings", "body": {...}, "status": 400}
    {"t": 0.8, "session": "u1", "body": {...}, "disconnect_after_ms": 40}
    {"t": 1.0, "session": "u2", "body": {...}, "status": 503, "request_id": "a"}
    {"t": 1.5, "session": "u2", "body": {...}, "retry_of": "a"}

Only ``body`` is required. An image URL in the body (``image_url.url``) may be a data URL, an http(s) or file URL
(sent as it is: the server reads it), or a file path, relative to the log (sent as a base64 data URL of the file).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import pandas as pd
from PIL import Image, UnidentifiedImageError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mmchaos import schema
from mmchaos.records import Says, first_error, says, words

from . import routes
from .bodies import EMBEDDINGS_PATH, TOKENIZE_PATH, body_template, fill_template, slot_hashes
from .pool import MIME, DataURL, ImageRef, ImageURL, content_hash
from .traces import Trace, TraceError

HTTPStatus = Annotated[int, Field(ge=100, le=599), Says("must be an HTTP status (100-599)")]


class LogLine(BaseModel):
    """One line of a request log (docs/request-log.md): only ``body`` is required. JSON's types as they are (a
    status written "400" is no status); whether ``retry_of`` names an earlier line of the session is the reader's
    check (it needs the lines before)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    t: Annotated[float, Says("must be seconds (a number) or an ISO 8601 time")] = 0.0
    session: Annotated[str | int, Says("must be a name or a number")] = ""
    endpoint: Annotated[str, Says(f"must be a path such as {EMBEDDINGS_PATH}")] = EMBEDDINGS_PATH
    body: Annotated[dict[str, Any], Says("must be the request body, a JSON object")]
    status: HTTPStatus | None = None
    disconnect_after_ms: Annotated[float, Field(gt=0), Says("must be a positive number of ms")] | None = None
    kind: Annotated[Literal[schema.KINDS], Says(f"must be one of {', '.join(schema.KINDS)}")] | None = None  # type: ignore[valid-type]
    case: Annotated[str, Says("must be a case name (a string)")] | None = None
    expected_status: HTTPStatus | None = None
    request_id: Annotated[str | int, Says("must be a string or a number")] | None = None
    retry_of: Annotated[str, Says("must be the request_id of an earlier line")] | None = None

    @field_validator("t", mode="before")
    @classmethod
    def _seconds(cls, t: Any) -> Any:
        """Seconds, or an ISO 8601 time (as seconds since the epoch)."""
        if isinstance(t, str):
            try:
                return datetime.fromisoformat(t).timestamp()
            except ValueError:
                pass
        if isinstance(t, bool) or not isinstance(t, (int, float)):
            raise ValueError(f"'t' must be seconds (a number) or an ISO 8601 time, not {t!r}")
        return float(t)

    @field_validator("endpoint")
    @classmethod
    def _path(cls, endpoint: str) -> str:
        if not endpoint.startswith("/"):
            raise ValueError(f"'endpoint' must be a path such as {EMBEDDINGS_PATH}, not {endpoint!r}")
        return endpoint


FIELDS = set(LogLine.model_fields)


def _problem(error: ValidationError, rec: dict) -> str:
    """pydantic's first error as the log's words: the field, what it must be, what it was."""
    kind, key, e = first_error(error, LogLine)
    if kind == "unknown":
        return f"unknown field(s) {sorted(set(rec) - FIELDS)}; known: {', '.join(sorted(FIELDS))}"
    if e["type"] == "value_error":
        return words(e)
    if key == "body":
        return f"'body' {says(LogLine, 'body')}"
    return f"'{key}' {says(LogLine, key) or 'must be something else'}, not {rec.get(key)!r}"


SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
DATA_URL = re.compile(r"^data:([^;,]+);base64,(.*)$", re.S)
EXTENSION = {mime: fmt for fmt, mime in MIME.items()}  # image/jpeg -> jpeg: a file's name says its type


class LogError(TraceError):
    pass


# -- reading -------------------------------------------------------------------------------------------------------


def read(path: Path | str) -> Trace:
    """A request log as a trace (in memory): what replay sends and what ``import_log`` writes."""
    path = Path(path)
    try:
        # lines end at "\n" only: a text may hold U+2028 or \x1c, which str.splitlines would also end a line at
        lines = [ln.removesuffix("\r") for ln in path.read_text().split("\n")]
    except (OSError, UnicodeDecodeError) as e:
        raise LogError(f"cannot read {path}: {e}") from e
    images: dict[str, dict] = {}
    rows: list[dict] = []
    sessions: dict[str, int] = {}  # session -> user id
    retries: dict[str, list] = {}  # request id -> its group: [first request id, user id, attempts]
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise LogError(f"{path}:{n}: not JSON ({e})") from e
        parsed = _line(rec, f"{path}:{n}")
        rows.append(_request(parsed, f"{path}:{n}", path.parent, images, sessions, n))
        _link_retry(rows[-1], parsed.retry_of, f"{path}:{n}", retries)
    if not rows:
        raise LogError(f"{path}: no requests")
    return Trace.of(pd.DataFrame(rows), images.values())


def _line(rec, where: str) -> LogLine:
    if not isinstance(rec, dict):
        raise LogError(f"{where}: a line is a JSON object, not {type(rec).__name__}")
    try:
        return LogLine.model_validate(rec)
    except ValidationError as e:
        raise LogError(f"{where}: {_problem(e, rec)}") from None


def _request(line: LogLine, where: str, root: Path, images: dict, sessions: dict, n: int) -> dict:
    user = sessions.setdefault(str(line.session), len(sessions))
    hashes: list[str] = []
    body = _with_images(line.body, where, root, images, hashes)
    template, urls = body_template(body)
    kind, expected = _kind(line, body, len(urls))
    image_hashes = ",".join(slot_hashes(urls)) or None
    return {
        "request_id": str(line.request_id or f"log-{n}"),
        "worker": "log",
        "user_id": user,
        "seq": n,
        "attempt": 1,
        "t_start": line.t,
        "endpoint": line.endpoint,
        "kind": kind,
        "case": line.case,
        "probe": None,
        "expected_status": expected,
        "status": line.status,
        "outcome": None,
        "abort_after_ms": line.disconnect_after_ms,
        "body": template,
        "images": image_hashes,
        "image_hashes": image_hashes,
    }


def _link_retry(row: dict, of: str | None, where: str, groups: dict) -> None:
    """A line with ``retry_of`` is the client's retry of an earlier line of its session (named by its
    ``request_id``): one request group, attempts in file order. Replay sends such a group as recorded."""
    if of is None:
        groups.setdefault(row["request_id"], [row["request_id"], row["user_id"], 1])
        row["request_group"] = row["request_id"]
        return
    if of not in groups:
        raise LogError(f"{where}: 'retry_of' must be the request_id of an earlier line, not {of!r}")
    group = groups[of]
    if group[1] != row["user_id"]:
        raise LogError(f"{where}: 'retry_of' {of!r} names a line of another session (a client retries its own)")
    group[2] += 1
    row["request_group"], row["attempt"] = group[0], group[2]
    groups.setdefault(row["request_id"], group)  # a retry of this retry is the same request


def _kind(line: LogLine, body: dict, n_images: int) -> tuple[str, int | None]:
    """The request's kind: the line's own, else read from the request (a 4xx seen in production on a request
    with an image is taken as a failure after rendering: the kind that poisons)."""
    status, expected, endpoint = line.status, line.expected_status, line.endpoint
    if line.kind is not None:
        return line.kind, expected
    if line.disconnect_after_ms is not None:
        return "abort", expected
    if status is not None and 400 <= status < 500:
        return ("malformed_post" if n_images else "malformed_pre"), expected or status
    if endpoint == TOKENIZE_PATH:
        return "tokenize", expected
    if endpoint in routes.KIND_OF_PATH:
        return routes.KIND_OF_PATH[endpoint], expected
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], list):
        return "batch", expected
    if n_images:
        return ("valid_image" if n_images == 1 else "multi_image"), expected
    return "text", expected


def _with_images(node, where: str, root: Path, images: dict, hashes: list):
    """The body with each image URL that can be stored once turned into an ImageURL (a slot of the template)."""
    if isinstance(node, list):
        return [_with_images(v, where, root, images, hashes) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _with_images(v, where, root, images, hashes) for k, v in node.items()}
    part = out.get("image_url")
    if out.get("type") == "image_url" and isinstance(part, dict) and isinstance(part.get("url"), str):
        out["image_url"] = {**part, "url": _image_url(part["url"], where, root, images)}
    return out


def _image_url(url: str, where: str, root: Path, images: dict):
    if SCHEME.match(url) and not url.startswith("data:"):
        return url  # http(s), file: the server reads it
    if url.startswith("data:"):
        m = DATA_URL.match(url)
        try:
            data = base64.b64decode(m.group(2), validate=True) if m else None
        except (binascii.Error, ValueError):
            data = None
        if m is None or data is None or base64.b64encode(data).decode() != m.group(2) or _mime_of(data) is None:
            return url  # not plain base64, or not an image (a malformed request's?): sent as it is, inline
        mime = m.group(1)
    else:
        file = (root / url) if not Path(url).is_absolute() else Path(url)
        try:
            data = file.read_bytes()
        except OSError as e:
            raise LogError(f"{where}: image {url}: {e.strerror or e}") from e
        if _header(data) is None:
            raise LogError(f"{where}: image {url} is not an image Pillow can read")
        mime = MIME.get(file.suffix.lower().lstrip(".").replace("jpg", "jpeg")) or _mime_of(data)
    return _stored(data, mime, images)


def _header(data: bytes) -> tuple[str, tuple[int, int], str] | None:
    """(format, size, mode) from an image's header, or None when Pillow cannot read one. Nothing is decoded, so
    an oversized image (a poison case's 20000 px PNG) is read like any other: Pillow's bomb check is for decoding."""
    saved = Image.MAX_IMAGE_PIXELS
    try:
        Image.MAX_IMAGE_PIXELS = None
        with Image.open(io.BytesIO(data)) as im:
            return (im.format, im.size, im.mode) if im.format else None
    except (UnidentifiedImageError, OSError, ValueError):
        return None
    finally:
        Image.MAX_IMAGE_PIXELS = saved


def _mime_of(data: bytes) -> str | None:
    head = _header(data)
    return MIME.get(head[0].lower(), f"image/{head[0].lower()}") if head else None


def _stored(data: bytes, mime: str, images: dict) -> DataURL:
    h = content_hash(data)
    fmt = EXTENSION.get(mime, mime.rpartition("/")[2])
    head = _header(data)
    assert head is not None  # an image: its reader said so
    _, size, mode = head
    images.setdefault(
        h,
        {
            "hash": h,
            "form": "image",
            "mime": mime,
            "format": fmt,
            "width": size[0],
            "height": size[1],
            "mode": mode,
            "quality": None,
            "data": data,
        },
    )
    url = ImageURL(f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}")
    url.ref = ImageRef(h, mime, fmt, size[0], size[1], mode, None)
    return url


# -- writing -------------------------------------------------------------------------------------------------------


def write(trace: Trace, path: Path | str) -> int:
    """``trace`` as a request log at ``path``, its images as files in ``<path stem>.images/`` (URLs made for one
    request stay inline). Returns the number of lines."""
    path = Path(path)
    folder = path.with_name(path.stem + ".images")
    folder.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    lines = []
    t0 = float(trace.requests["t_start"].min())
    lane = {k: i for i, k in enumerate(dict.fromkeys(trace.lane_keys()))}
    ids = set(trace.requests["request_id"].astype(str))
    for i, r in trace.requests.iterrows():
        refs = [_file_of(trace, h, folder, files) for h in trace.image_hashes(i)]
        body = json.loads(fill_template(trace.requests.at[i, "body"], refs))
        rec = {
            "t": round(float(r["t_start"]) - t0, 6),
            "session": f"s{lane[trace.lane_keys()[i]]}",
            "endpoint": r["endpoint"],
            "body": body,
            "kind": r["kind"],
            "request_id": r["request_id"],
        }
        group = r.get("request_group")
        if isinstance(group, str) and group != r["request_id"] and group in ids:
            rec["retry_of"] = group  # the client's retry of the request it names
        for key in ("case", "expected_status", "status"):
            if r.get(key) is not None and not pd.isna(r.get(key)):
                rec[key] = r[key] if key == "case" else int(r[key])
        if r["abort_after_ms"] is not None and not pd.isna(r["abort_after_ms"]):
            rec["disconnect_after_ms"] = float(r["abort_after_ms"])
        lines.append(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return len(lines)


def _file_of(trace: Trace, h: str, folder: Path, files: dict) -> str:
    """An image as a path relative to the log, written once; a URL made for one request as its text."""
    if h not in files:
        row = trace.images[h]
        if row["form"] in ("url", "derived"):
            files[h] = str(trace.url(h))
        else:
            f = folder / f"{h}.{row['format'] or 'bin'}"
            if not f.exists():
                f.write_bytes(trace.data(h))
            files[h] = f"{folder.name}/{f.name}"
    return files[h]
