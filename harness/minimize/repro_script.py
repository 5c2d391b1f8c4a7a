"""The standalone reproducer: a short Python script, standard library only, that sends a request sequence (with its
images embedded) to a server and says whether the server crashed. `mmchaos minimize` runs every candidate through
it, so the script it hands out is the one that was tested.

The script's own code is ``_SCRIPT`` below; :func:`render` fills in the header, the requests and the images.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from mmchaos.payloads.bodies import URL_SLOT
from mmchaos.payloads.traces import Trace

IMAGE_TOKEN = "@IMAGE_{}@"
# what reproduces a finding: the server dies; a request is answered 5xx; a request gets no answer while /health
# answers 200; two answers to the same input disagree; the server's log says a line nobody named
CRASH, SERVER_ERROR, HANG, WRONG, LOG = "crash", "5xx", "hang", "wrong", "log"


@dataclass(frozen=True)
class ScriptInfo:
    title: str  # one line: what it reproduces
    about: str  # a few lines for the docstring: where it came from, the server it crashed
    expect: str = CRASH  # what reproduces it (CRASH, SERVER_ERROR, HANG, WRONG, LOG)
    compare: tuple[tuple[int, int], ...] = ()  # WRONG: the requests (1-based) whose answers must agree
    log_needle: str = ""  # LOG: what the server's log says (the exception's name)


def render(trace: Trace, info: ScriptInfo) -> str:
    """The script that sends ``trace``'s requests, per session in order, at their recorded offsets."""
    names: dict[str, str] = {}
    images: list[str] = []
    lines = []
    t0 = float(trace.requests["t_start"].min())
    session = {k: i for i, k in enumerate(dict.fromkeys(trace.lane_keys()))}
    keys = trace.lane_keys()
    for i, r in trace.requests.iterrows():
        refs = []
        for h in trace.image_hashes(i):
            if h not in names:
                names[h] = IMAGE_TOKEN.format(len(names) + 1)
                url = str(trace.url(h))
                images.append(f"    {names[h][1:-1]!r}: {_chunked(url)},")
            refs.append(names[h].encode())
        # the body as indented JSON: the script sends it compact, which is byte for byte what was recorded
        body = json.dumps(json.loads(_join(trace.requests.at[i, "body"], refs)), indent=1, ensure_ascii=False)
        hang_up = r["abort_after_ms"]
        hang_up = None if hang_up is None or hang_up != hang_up else round(float(hang_up), 1)
        lines.append(
            f"    # {i + 1}: {_describe(r)}\n"
            f"    ({session[keys[i]]}, {float(r['t_start']) - t0:.3f}, {r['endpoint']!r}, {hang_up!r}, "
            f'json.loads(r"""\n{body}\n""")),'
        )
    n_sessions = len(session)
    return _SCRIPT.format(
        title=info.title,
        about=info.about.strip(),
        sessions="one session, one connection"
        if n_sessions == 1
        else f"{n_sessions} sessions at once, one connection each",
        requests="\n".join(lines),
        images="\n".join(images),
        expect=info.expect,
        says=_SAYS[info.expect],
        compare=[list(p) for p in info.compare],
        needle=info.log_needle,
    )


_SAYS = {
    CRASH: 'prints "crashed" and exits 1 when the server stopped answering, "survived" and exits 0 when it did not',
    SERVER_ERROR: 'prints "reproduced" and exits 1 when a request was answered 5xx, "not reproduced" and exits 0 '
    "when none was",
    HANG: 'prints "reproduced" and exits 1 when a request got no answer within --timeout while /health answered '
    '200 (a server that hangs), "not reproduced" and exits 0 when every request was answered',
    WRONG: 'prints both answers\' vectors and their cosine, "reproduced" and exits 1 when two answers to the same '
    "input disagree (cosine below 1 - --tolerance); with --reference URL each request also goes to a second server "
    "and their answers are compared",
    LOG: 'with --log (the server\'s log file) prints "reproduced" and exits 1 when the log says the line nobody named '
    "after the requests were sent; without it, says what to look for",
}


def _join(template: bytes, refs: list[bytes]) -> bytes:
    parts = template.split(URL_SLOT)
    out = [parts[0]]
    for ref, part in zip(refs, parts[1:]):
        out += [ref, part]
    return b"".join(out)


def _chunked(url: str, width: int = 100) -> str:
    """A long data URL as adjacent string literals, one line each (Python joins them)."""
    if len(url) <= width:
        return repr(url)
    chunks = [url[i : i + width] for i in range(0, len(url), width)]
    return "(\n" + "\n".join(f"        {c!r}" for c in chunks) + ")"


def _describe(r) -> str:
    what = str(r["kind"])
    if isinstance(r.get("case"), str):
        what += f" / {r['case']}"
    status = r.get("status")
    if status is not None and status == status:
        what += f"; answered {int(status)} when recorded"
    return what


def parse_result(stdout: str) -> dict | None:
    """The script's --json summary (its last line), or None."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            out = json.loads(line)
        except ValueError:
            continue
        if isinstance(out, dict) and "crashed" in out:
            return out
    return None


_SCRIPT = '''#!/usr/bin/env python3
"""{title}

{about}

    python3 repro.py --url http://127.0.0.1:8000 [--model NAME] [--api-key KEY]

Sends the requests below ({sessions}) at their recorded times, then watches /health for --settle seconds:
{says}; exits 2 when it could not be reached at all. Standard library only.
"""

import argparse
import base64
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse

EXPECT = {expect!r}  # crash, 5xx, hang, wrong or log: what reproduces it (see above)
COMPARE = {compare!r}  # wrong: pairs of requests (1-based) whose answers must agree
LOG_NEEDLE = {needle!r}  # log: what the server's log says when it is reproduced
LOG_WAIT_S = 5  # log: how long at least the log is read for it after the last answer
# (session, seconds after the first request, endpoint, hang up after ms (None: wait for the answer), JSON body);
# "@IMAGE_n@" in a body is image n (a data URL, at the end of this file)
REQUESTS = [
{requests}
]


def connect(url, timeout):
    u = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    return cls(u.hostname, u.port, timeout=timeout)


def post(conn, path, body, headers):
    conn.request("POST", path, body=body, headers=headers)
    r = conn.getresponse()
    return r.status, r.read().decode("utf-8", "replace")


def send_all(args, headers, results):
    t0 = time.monotonic()
    by_session = {{}}
    for n, (session, offset, path, hang_up, body) in enumerate(REQUESTS, 1):
        by_session.setdefault(session, []).append((n, offset, path, hang_up, body))

    def session(steps):
        conn = None
        for n, offset, path, hang_up, body in steps:
            time.sleep(max(0.0, t0 + offset - time.monotonic()))
            if args.model:
                body = dict(body, model=args.model)
            text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)  # as the recorded client sent it
            for name, url in IMAGES.items():
                text = text.replace("@" + name + "@", url)
            data = text.encode("utf-8")
            hdrs = dict(headers, **{{"X-Request-Id": "repro-%d" % n}})
            start = time.monotonic()
            try:
                if hang_up is not None:  # a client that gives up: its own connection, closed after hang_up ms
                    c = connect(args.url, hang_up / 1000)
                    try:
                        status, text = post(c, path, data, hdrs)
                    except (TimeoutError, OSError):
                        status, text = None, "client hung up after %g ms (as recorded)" % hang_up
                    finally:
                        c.close()
                else:
                    reused = conn is not None
                    conn = conn or connect(args.url, args.timeout)
                    try:
                        status, text = post(conn, path, data, hdrs)
                    except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                        conn.close()
                        conn = None
                        if not reused:
                            raise
                        # the server had closed the kept-alive connection: send again on a new one, as clients do
                        conn = connect(args.url, args.timeout)
                        status, text = post(conn, path, data, hdrs)
            except (OSError, http.client.HTTPException) as e:
                status, text = None, "no answer: %s" % (type(e).__name__,)
                if conn is not None:
                    conn.close()
                conn = None
            results[n] = (offset, path, status, text, (time.monotonic() - start) * 1000)

    threads = [threading.Thread(target=session, args=(steps,)) for steps in by_session.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def watch_health(args, headers):
    """None while /health answers 200 for --settle seconds, else why it stopped."""
    end = time.monotonic() + args.settle
    while True:
        try:
            c = connect(args.url, 2)
            c.request("GET", "/health", headers=headers)
            status = c.getresponse().status
            c.close()
            if status != 200:
                return "/health answered %d" % status
        except (OSError, http.client.HTTPException) as e:
            return "/health: %s" % type(e).__name__
        if time.monotonic() >= end:
            return None
        time.sleep(0.25)


def vector(text):
    """The first list of numbers in an answer's JSON (an embedding, a score), or None."""
    try:
        node = json.loads(text)
    except ValueError:
        return None
    todo = [node]
    while todo:
        x = todo.pop(0)
        if isinstance(x, list) and x and all(isinstance(v, (int, float)) for v in x):
            return [float(v) for v in x]
        if isinstance(x, dict):
            todo += list(x.values())
        elif isinstance(x, list):
            todo += x
    return None


def cosine(a, b):
    if not a or not b or len(a) != len(b):
        return float("nan")
    dot = sum(x * y for x, y in zip(a, b))
    na, nb = sum(x * x for x in a) ** 0.5, sum(y * y for y in b) ** 0.5
    return dot / (na * nb) if na and nb else float("nan")


def judge(args, headers, results, log_from):
    """hang, wrong, log: whether the finding came again."""
    for n in sorted(results):
        offset, path, status, text, ms = results[n]
        print("%2d  +%.3fs  POST %s  -> %s  %s (%.0f ms)" % (n, offset, path, status or "-", text[:120].strip(), ms))
    found = []
    if EXPECT == "hang":
        health = watch_health(argparse.Namespace(**dict(vars(args), settle=0)), headers)
        silent = [n for n in sorted(results) if results[n][2] is None and REQUESTS[n - 1][3] is None]
        if silent and not health:
            found.append("request(s) %s got no answer in %g s while /health answered 200"
                         % (", ".join(map(str, silent)), args.timeout))
    elif EXPECT == "wrong":
        pairs = [tuple(p) for p in COMPARE]
        for a, b in pairs:
            va, vb = vector(results[a][3]), vector(results[b][3])
            c = cosine(va, vb)
            print("request %d: %s...\\nrequest %d: %s...\\ncosine %.6f" % (a, (va or [])[:4], b, (vb or [])[:4], c))
            if va and vb and not c >= 1 - args.tolerance:
                found.append("requests %d and %d, the same input, answered apart (cosine %.6f)" % (a, b, c))
        if args.reference:
            ref = {{}}
            send_all(argparse.Namespace(**dict(vars(args), url=args.reference)), headers, ref)
            for n in sorted(results):
                va, vb = vector(results[n][3]), vector(ref.get(n, (0, 0, 0, "", 0))[3])
                c = cosine(va, vb)
                if va and vb:
                    print("request %d here and on the reference: cosine %.6f" % (n, c))
                    if not c >= 1 - args.tolerance:
                        found.append("request %d answered apart by the two servers (cosine %.6f)" % (n, c))
    elif EXPECT == "log":
        if not args.log:
            print("give --log SERVER_LOG: the finding is the server logging %r" % LOG_NEEDLE)
            return 2
        # the server writes its traceback as it fails, often after its answer: the log is read until it says
        # the line or --settle (at least LOG_WAIT_S) has passed
        deadline = time.monotonic() + max(args.settle, LOG_WAIT_S)
        while not found:
            with open(args.log, errors="replace") as f:
                f.seek(log_from)
                if LOG_NEEDLE in f.read():
                    found.append("the server logged %s" % LOG_NEEDLE)
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
    print(("reproduced: " + "; ".join(found)) if found else "not reproduced")
    if args.json:
        print(json.dumps({{"reproduced": bool(found), "crashed": False, "why": found}}))
    return 1 if found else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default %(default)s)")
    p.add_argument("--model", help="the model name to send (default: the recorded one)")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY") or os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--settle", type=float, default=10, help="seconds to watch /health after the last request")
    p.add_argument("--timeout", type=float, default=60, help="seconds to wait for an answer")
    p.add_argument("--json", action="store_true", help="also print a JSON summary as the last line")
    p.add_argument("--reference", help="wrong: a second server each request is also sent to, its answers compared")
    p.add_argument("--tolerance", type=float, default=0.01, help="wrong: how far below 1 a cosine may be")
    p.add_argument("--log", help="log: the server's log file, read from its end before the requests are sent")
    args = p.parse_args()
    headers = {{"Content-Type": "application/json"}}
    if args.api_key:
        headers["Authorization"] = "Bearer " + args.api_key
    if watch_health(argparse.Namespace(**dict(vars(args), settle=0)), headers):
        print("cannot reach %s/health" % args.url)
        return 2
    log_from = os.path.getsize(args.log) if args.log and os.path.exists(args.log) else 0
    results = {{}}
    send_all(args, headers, results)
    if EXPECT in ("hang", "wrong", "log"):
        return judge(args, headers, results, log_from)
    for n in sorted(results):
        offset, path, status, text, ms = results[n]
        answer = status if status is not None else "-"
        print("%2d  +%.3fs  POST %s  -> %s  %s (%.0f ms)" % (n, offset, path, answer, text[:120].strip(), ms))
    why = watch_health(args, headers)
    hung_up = [n for n in sorted(results) if REQUESTS[n - 1][3] is not None and results[n][2] is None]
    if hung_up and not why:
        # a hang-up poisons only when it lands while the server renders the image: one survival is weak evidence
        print("note: request(s) %s hung up before an answer, which leaves the image in the API server's cache only "
              "when the hang-up lands while it is rendered (a race); run it again on a fresh server"
              % ", ".join(map(str, hung_up)))
    statuses = [results[n][2] for n in sorted(results)]
    if EXPECT == "5xx":
        errors = [n for n in sorted(results) if (results[n][2] or 0) >= 500]
        print(("reproduced: request(s) %s answered 5xx" % ", ".join(map(str, errors))) if errors else "not reproduced")
        if args.json:
            print(json.dumps({{"reproduced": bool(errors), "crashed": bool(why), "statuses": statuses}}))
        return 1 if errors else 0
    print(("crashed: " + why) if why else "survived: /health answered 200 for %g s" % args.settle)
    if args.json:
        print(json.dumps({{"crashed": bool(why), "why": why, "statuses": statuses}}))
    return 1 if why else 0


IMAGES = {{
{images}
}}

if __name__ == "__main__":
    sys.exit(main())
'''
