"""A server's life as the hunt keeps it (the cases it was sent, each with what came back), and as the trace that
reproducers and the minimizer replay: its images out of the bodies (a slot per data URL), its hang-ups as aborts,
its requests on a lane per case and session."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from mmchaos import schema
from mmchaos.payloads.bodies import body_template
from mmchaos.payloads.pool import DataURL, content_hash
from mmchaos.payloads.traces import Trace

from ..minimize.minimizer import HUNT_KIND
from . import cases


def lives(folder: Path) -> list[tuple[str, list[tuple[cases.Case, list[cases.Sent]]]]]:
    """The server lives a crash ended (each time it was met: the cases the dying server was sent): first those whose
    last case has a request the dying server did not answer as asked (not a hang-up: a request it was sent whole),
    then the rest; fewest requests first. A death met by hang-ups alone is a race that a fresh server may not run
    again; a short life is cheap to shrink and holds little else."""
    found = [(p.stem, json.loads(p.read_text())) for p in (folder / "lives").glob("*.json")]
    if (folder / "life.json").exists():  # written by older hunts
        found.append(("life", json.loads((folder / "life.json").read_text())))
    found.sort(key=lambda x: (not names_a_request(x[1]), sum(len(c["steps"]) for c in x[1]), x[0]))
    return [
        (
            name,
            [
                (
                    cases.Case.from_json(json.dumps(c["steps"])),
                    [cases.Sent(a["step"], a["status"], a["text"], 0.0, t=a.get("t", 0.0)) for a in c["answers"]],
                )
                for c in life
            ],
        )
        for name, life in found
    ]


def names_a_request(life: list[dict]) -> bool:
    """Whether the life's last case holds a request sent whole (no hang-up, or one answered first) that got no
    answer or a 5xx: the request a crash names (shrink_input's rule)."""
    if not life:
        return False
    last = life[-1]
    got = {a["step"]: a["status"] for a in last["answers"]}
    return any(_named(step.get("hang_up_ms"), got.get(i)) for i, step in enumerate(last["steps"]))


def alone(case: cases.Case, sent: list[cases.Sent], k: int, plain: bool = False) -> list:
    """Step ``k`` of ``case`` as a life of its own (one request on one connection, at once; ``plain``: without its
    hang-up): what a one-request reproducer replays."""
    step = replace(case.steps[k], session=0, together=None, delay_ms=None)
    if plain:
        step = replace(step, hang_up_ms=None)
    return [(cases.Case([step]), [replace(sent[k], step=0)])]


def trace_of(life: list) -> tuple[Trace, list[dict[str, Any]]]:
    """The cases a server was sent (``life``: (case, sent) pairs) as a trace the minimizer and repro.py read: case
    k's session j is a lane of its own; and its rows."""
    images: dict[str, dict] = {}
    rows: list[dict[str, Any]] = []
    for k, (case, sent) in enumerate(life):
        got = {s.step: s for s in sent}
        for i, step in enumerate(case.steps):
            body = step.body if step.body is not None else {}
            status = got[i].status if i in got else None
            hung_up = _hung_up(step.hang_up_ms, status)
            template, urls = body_template(_with_data_urls(body, images))
            rows.append(
                {
                    "worker": "hunt",
                    "user_id": k * cases.SESSIONS + step.session,
                    "seq": len(rows),
                    "attempt": 1,
                    "request_group": str(len(rows)),
                    "request_id": f"hunt-{k + 1}-{i + 1}",
                    # when it was sent in the server's life (older hunts kept no time: cases 10 s apart)
                    "t_start": got[i].t if i in got and got[i].t else k * 10.0 + i * 0.01,
                    "endpoint": step.path,
                    "kind": HUNT_KIND,
                    "case": None,
                    "probe": None,
                    "expected_status": status,
                    "status": status,
                    "outcome": schema.ABORTED if hung_up else None,
                    "image_hashes": ",".join(_url_hashes(urls)) or None,
                    "abort_after_ms": step.hang_up_ms if hung_up else None,
                    "body": template,
                    "images": ",".join(_url_hashes(urls)) or None,
                }
            )
    return Trace.of(pd.DataFrame(rows), list(images.values())), rows


def _hung_up(hang_up_ms: float | None, status: int | None) -> bool:
    return hang_up_ms is not None and status is None  # one answered first was a plain request


def _named(hang_up_ms: float | None, status: int | None) -> bool:
    """A request of the crash's case that the dying server did not answer, or answered 5xx, sent whole."""
    return not _hung_up(hang_up_ms, status) and (status is None or status >= 500)


def answers(sent: list[cases.Sent]) -> list[dict]:
    return [{"step": x.step, "status": x.status, "text": x.text[:500], "t": x.t} for x in sent]


def shrink_input(life: list) -> tuple[Trace, list[str]]:
    """What the minimizer starts from: every case the dying server was sent, in order, as one trace (case k's
    session j is a lane of its own); and the requests of the last case it did not answer, or answered 5xx, sent
    whole: the ones the crash names (its first guesses are each of them after the earlier failed request that sent
    its image)."""
    trace, rows = trace_of(life)
    last = [r for r in rows if r["request_id"].startswith(f"hunt-{len(life)}-")]
    return trace, [r["request_id"] for r in last if _named(r["abort_after_ms"], r["status"])]


class _HashedURL(DataURL):
    hash: str


def _url_hashes(urls: list[DataURL]) -> list[str]:
    """The hashes the trace keeps the URLs of a body by (each made a _HashedURL by _with_data_urls)."""
    return [u.hash for u in urls if isinstance(u, _HashedURL)]


def _with_data_urls(node, images: dict[str, dict]):
    """``node`` with each data URL string made a DataURL (so the trace keeps it once, by hash, as a URL image)."""
    if isinstance(node, dict):
        return {k: _with_data_urls(v, images) for k, v in node.items()}
    if isinstance(node, list):
        return [_with_data_urls(v, images) for v in node]
    if isinstance(node, str) and node.startswith("data:"):
        u = _HashedURL(node)
        u.hash = content_hash(node.encode())
        images.setdefault(
            u.hash,
            {
                "hash": u.hash,
                "form": "url",
                "mime": None,
                "format": None,
                "width": None,
                "height": None,
                "mode": None,
                "quality": None,
                "data": node.encode(),
                "spec": None,
                "base": None,
                "token": None,
            },
        )
        return u
    return node
