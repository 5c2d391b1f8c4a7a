"""A small stand-in for a vLLM embedding server, for plumbing tests only (not a product target).

Answers /health, /v1/models, /v1/embeddings, /tokenize and /metrics. ``--die-after N`` makes the process print
the report's crash lines and exit after N embedding requests, so crash detection can be tested without vLLM;
``--die-on-file FILE`` at the first embedding request after FILE appears (it removes FILE: one death each time a
test creates it, at a moment the test chooses, e.g. once a restarted server has taken load).
``--error-text`` sets the message of its 400 answers (and logs it); ``--api-key`` (or STANDIN_API_KEY) makes
POSTs without that bearer token get 401. It handles SIGTERM (graceful shutdown) as vLLM does.

Like vLLM, it answers an image given as a ``file://`` URL with 500 and then closes the connection without a
``Connection: close`` header (after ``--close-delay-ms``, so a client that reuses the connection at once has sent
its next request into it). ``--miss-after-poison`` plays vLLM 0.32: an image whose request failed with 400 is
answered once with the retryable 503 cache miss the next time it comes; ``--crash-after-poison`` plays vLLM 0.30: it
dies (with 0.30's log lines) when that image comes again. ``--wrong-on-repeat`` answers an image it answered
before with another embedding: a wrong answer, for the wrong-answer oracle. ``--body-log FILE`` appends each
POST's X-Request-Id and the sha256 of its body, as received; ``--arrival-log FILE`` its X-Request-Id, when its
headers were in (epoch seconds) and its route, for tests of the rate requests arrive at. ``--openapi`` serves an
``/openapi.json`` listing ``/v1/embeddings`` (its chat form only), so the hunt can run against it. Its embedding
of an input is a function of the input (images and text): the same input gets the same vector, distinct inputs
distinct ones.

With ``VLLM_SERVER_DEV_MODE=1`` in its environment it takes vLLM's operator routes: ``/pause`` (any mode) and
``/sleep`` hold every embedding request until ``/resume`` or ``/wake_up`` while ``/health`` answers 200 (a wedge on
demand); the cache resets answer 200. Each is logged as ``operator: POST <path>``.

``--tensor-parallel-size N`` plays vLLM's process tree for the fault tests: a child titled ``VLLM::EngineCore``
with N children titled ``VLLM::Worker_TP<rank>``; when a worker dies the engine core exits, when the engine core
dies the server does (vLLM's log lines), and an embedding request waits while a worker is stopped (SIGSTOP).

``in_process(*args)`` serves it from a thread of the calling process instead (the unit lane's Locust tests), each
server with state of its own; it takes every option but those that end the process.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

from prometheus_client import CollectorRegistry, Counter, generate_latest

from mmchaos.sameness import input_keys

REGISTRY = CollectorRegistry()
REQUESTS = Counter("standin_requests", "requests", ["handler", "status"], registry=REGISTRY)
DIM = 64
STALL_S = 300  # --stall-format: how long such a request goes unanswered (the test ends first)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    wbufsize = 1 << 16  # headers and body leave in one write
    opts: argparse.Namespace
    count = 0
    lock = threading.Lock()
    poisoned: ClassVar[set[str]] = set()
    seen: ClassVar[dict[str, int]] = {}  # image URL -> times answered (--wrong-on-repeat)
    by_id: ClassVar[dict[str, str]] = {}  # a medium's uuid -> its data URL, as vLLM's processor cache keys it
    held = threading.Event()  # set: a /pause or /sleep holds the embedding requests

    def log_message(self, *args):  # keep the log for our own lines
        pass

    def say(self, line: str) -> None:
        print(line, flush=True)

    def die(self) -> None:
        os._exit(1)

    def hang_up(self) -> None:
        """No answer: the connection is closed (a dead server's)."""
        self.close_connection = True

    def _send(self, status: int, body: dict | str, ctype: str = "application/json") -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        REQUESTS.labels(self.path, str(status)).inc()

    def _drift_line(self, named: bool) -> None:
        # as vLLM: the request by its X-Request-Id (prefixed), when the drift is a poisoned image's
        rid = self.headers.get("X-Request-Id") if named else None
        self.say(
            f"WARNING [core.py:1868] Multi-modal cache miss for request embd-{rid or 'x'} "
            "(mm_hashes=['ab12cd34ef']): P0/P1 cache drift; returning a retryable response so the items are "
            "resent with data."
        )

    def do_GET(self):
        if getattr(self, "dead", False):
            return self.hang_up()
        if self.path == "/health":
            self._send(
                503 if self.opts.unhealthy else 200, "" if not self.opts.unhealthy else "unhealthy", "text/plain"
            )
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "standin", "object": "model"}]})
        elif self.path == "/metrics":
            self._send(200, generate_latest(REGISTRY).decode(), "text/plain; version=0.0.4")
        elif self.path == "/openapi.json" and (self.opts.openapi or self.opts.routes):
            doc = OPENAPI if self.opts.openapi else {"openapi": "3.1.0", "paths": {}}
            extra = {r: {"post": {}} for r in self.opts.routes.split(",") if r}
            self._send(200, {**doc, "paths": {**doc["paths"], **extra}})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self):
        arrived = time.time()  # the request line and headers are in: the server's own clock, as a proxy would take it
        if getattr(self, "dead", False):
            return self.hang_up()
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n)
        route = self.path.split("?", 1)[0]
        if route in OPERATOR and os.environ.get("VLLM_SERVER_DEV_MODE") == "1":
            self.say(f"operator: POST {self.path}")
            if route in ("/pause", "/sleep"):
                type(self).held.set()
            elif route in ("/resume", "/wake_up"):
                type(self).held.clear()
            return self._send(200, {"status": "ok"})
        if self.opts.arrival_log:
            with self.lock, open(self.opts.arrival_log, "a") as f:
                f.write(f"{self.headers.get('X-Request-Id')} {arrived:.6f} {route}\n")
        if self.opts.body_log:
            with self.lock, open(self.opts.body_log, "a") as f:
                f.write(f"{self.headers.get('X-Request-Id')} {hashlib.sha256(raw).hexdigest()}\n")
        if self.opts.api_key and self.headers.get("Authorization") != f"Bearer {self.opts.api_key}":
            return self._send(401, {"error": {"message": "Unauthorized", "code": 401}})
        try:
            body = json.loads(raw)
        except ValueError:
            return self._send(400, {"error": {"message": "bad json", "code": 400}})
        if self.opts.openapi and isinstance(body, dict) and body.get("model", "standin") != "standin":
            # as vLLM answers a model it does not serve (a client of the whole API, the hunt, sends such names)
            return self._send(404, {"error": {"message": f"The model `{body['model']}` does not exist.", "code": 404}})
        if self.opts.delay_ms:
            time.sleep(self.opts.delay_ms / 1000)  # emulated service time
        if self.opts.stall_format and isinstance(body, dict) and body.get("encoding_format") == self.opts.stall_format:
            time.sleep(STALL_S)  # as 0.30.0 computes `padding: max_length` on a short input: minutes, /health 200
        if self.path == "/tokenize":
            return self._send(200, {"count": 8, "max_model_len": 4096, "tokens": list(range(8))})
        if route in self.opts.routes.split(","):
            return self._send(200, {"object": "list", "data": [{"index": 0, "score": 0.5}]})  # any answer: plumbing
        if self.path != "/v1/embeddings":
            return self._send(404, {"error": "not found"})
        while ENGINE.workers and any(_stopped(pid) for pid in ENGINE.workers):
            time.sleep(0.05)  # a stalled worker: the request waits for it, as a collective would
        while type(self).held.is_set():
            time.sleep(0.05)  # paused or asleep: the request waits in the engine
        own = type(self)  # this server's state (a server in a thread of a test has a class of its own)
        with self.lock:
            own.count += 1
            count = own.count
            own.first = getattr(own, "first", None) or time.monotonic()
        late = self.opts.die_after_s and time.monotonic() - own.first > self.opts.die_after_s
        poisoned = self.opts.crash_after_poison and own.poisoned & set(
            _image_urls(body) if isinstance(body, dict) else []
        )
        if (self.opts.die_after and count > self.opts.die_after) or late or poisoned or self._told_to_die():
            self._drift_line(poisoned)
            self.say("    assert req_state.detokenizer is not None\nAssertionError")
            return self.die()
        if not isinstance(body, dict) or ("input" not in body and "messages" not in body):
            return self._send(400, {"error": {"message": "input or messages required", "code": 400}})
        urls = _image_urls(body)
        if any(u.startswith("file:") for u in urls):
            self._send(
                500, {"error": {"message": "Cannot load local files without --allowed-local-media-path", "code": 500}}
            )
            self.close_connection = True  # closed without saying so, as uvicorn does after an unhandled error
            self.wfile.flush()  # the answer leaves now; the close comes after the delay
            time.sleep(self.opts.close_delay_ms / 1000)
            return None
        if "dimensions" in body:
            msg = self.opts.error_text or "Model does not support matryoshka representation"
            if self.opts.echo_key:
                msg += f" (request {self.path} with key {self.opts.api_key})"
            if self.opts.error_text:
                self.say(f"ERROR [serving.py:1] request failed: {msg}")  # servers log what they answer
            if self.opts.miss_after_poison or self.opts.crash_after_poison:
                with self.lock:
                    own.poisoned.update(urls)
            code = self.opts.dimensions_status
            return self._send(
                code,
                {
                    "error": {
                        "message": msg,
                        "type": "InternalServerError" if code >= 500 else "BadRequestError",
                        "code": code,
                    }
                },
            )
        if self.opts.miss_after_poison:
            with self.lock:
                missed = own.poisoned & set(urls)
                own.poisoned -= missed
            if missed:
                self._drift_line(True)
                return self._send(503, {"error": {"message": "Multi-modal processor cache miss.", "code": 503}})
        if body.get("encoding_format", "float") not in ("float", "base64"):
            return self._send(400, {"error": {"message": "bad encoding_format", "code": 400}})
        body = self._named_by_id(body)
        if body is None:  # as vLLM 0.30.0 answers an id it holds no item for (measured)
            msg = "Cache miss for image at index 0 but data is not provided."
            return self._send(400, {"error": {"message": msg, "type": "BadRequestError", "code": 400}})
        try:
            keys = input_keys(self.path, body)
        except (ValueError, TypeError, KeyError, AttributeError):
            return self._send(400, {"error": {"message": "cannot read the input", "code": 400}})
        vectors = [_vector(k, self.opts.vector_salt) for k in keys]
        items = keys
        if self.opts.wrong_on_repeat and urls:
            with self.lock:
                n = max(type(self).seen.get(u, 0) for u in urls)
                for u in urls:
                    type(self).seen[u] = type(self).seen.get(u, 0) + 1
            if n:  # an image it answered before: each time another vector (one-hot: far from the first answer)
                vectors = [[1.0 if i == n % DIM else 0.0 for i in range(DIM)] for _ in items]
        data = [{"index": i, "object": "embedding", "embedding": v} for i, v in enumerate(vectors)]
        self._send(200, {"object": "list", "data": data, "model": "standin"})

    def _named_by_id(self, body):
        """``body`` with each part naming a medium by its uuid alone given the data sent earlier with that uuid (as
        vLLM's processor cache serves it); None when an id was never sent with data."""
        if isinstance(body, list):
            out = [self._named_by_id(v) for v in body]
            return None if any(v is None and x is not None for v, x in zip(out, body)) else out
        if not isinstance(body, dict):
            return body
        uuid, key = body.get("uuid"), next((k for k in ("image_url", "video_url") if k in body), None)
        if isinstance(uuid, str) and key:
            if body[key] is None:
                url = type(self).by_id.get(uuid)
                return None if url is None else {**body, key: {"url": url}}
            value = body[key]
            type(self).by_id[uuid] = str(value.get("url", "") if isinstance(value, dict) else value)
        out = {k: self._named_by_id(v) for k, v in body.items()}
        return None if any(v is None and body[k] is not None for k, v in out.items()) else out

    def _told_to_die(self) -> bool:
        """--die-on-file: the file is there; taken (removed) by the one request that dies of it."""
        if not self.opts.die_on_file:
            return False
        try:
            os.unlink(self.opts.die_on_file)
        except FileNotFoundError:
            return False
        return True


def _vector(key: str, salt: str = "") -> list[float]:
    """An input's embedding: a unit vector drawn from a hash of its key (mmchaos.sameness.input_keys: what the
    wrong-answer oracles take for the same input). A stand-in answers consistently by that identity; a test of it
    checks the plumbing around the comparison (forms, batches, order), never what counts as the same input."""
    seed = hashlib.sha256((salt + key).encode()).digest()  # --vector-salt: another model's vectors
    raw = [b - 127.5 for b in (seed * (DIM // len(seed) + 1))[:DIM]]
    norm = sum(x * x for x in raw) ** 0.5
    return [x / norm for x in raw]


# what --openapi serves: the chat form of /v1/embeddings, as vLLM's schema gives it (trimmed)
OPENAPI = {
    "openapi": "3.1.0",
    "paths": {
        "/v1/embeddings": {
            "post": {
                "requestBody": {
                    "content": {"application/json": {"schema": {"anyOf": [{"$ref": "#/components/schemas/Chat"}]}}}
                },
                "responses": {
                    "200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Out"}}}}
                },
            }
        }
    },
    "components": {
        "schemas": {
            "Chat": {
                "title": "EmbeddingChatRequest",
                "type": "object",
                "required": ["messages"],
                "properties": {
                    "messages": {"type": "array"},
                    "model": {"type": "string"},
                    "dimensions": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                    "encoding_format": {"enum": ["float", "base64"]},
                },
            },
            "Out": {"type": "object", "required": ["data"], "properties": {"data": {"type": "array"}}},
        }
    },
}


def _image_urls(body: dict) -> list[str]:
    convs = body.get("messages") or []
    if convs and isinstance(convs, list) and isinstance(convs[0], list):  # a batch: a list of conversations
        convs = [m for conv in convs for m in conv]
    urls = []
    for msg in convs if isinstance(convs, list) else []:
        content = msg.get("content") if isinstance(msg, dict) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") == "image_url":
                urls.append(str((part.get("image_url") or {}).get("url", "")))
    return urls


OPERATOR = ("/pause", "/resume", "/sleep", "/wake_up", "/reset_mm_cache", "/reset_prefix_cache")


class ENGINE:
    core: subprocess.Popen | None = None
    workers: ClassVar[list[int]] = []


# the fake engine core: its workers are sleeps titled as vLLM's; it exits when one of them dies, as vLLM's does
CORE = """
import os, subprocess, sys, time
n = int(sys.argv[1])  # vLLM titles its workers Worker_TP<rank> when TP > 1, plain Worker (CPU, TP=1) else
ws = [subprocess.Popen(["VLLM::Worker_TP%d" % r if n > 1 else "VLLM::Worker", "100000"], executable="/bin/sleep")
      for r in range(n)]
print("WORKERS", " ".join(str(w.pid) for w in ws), flush=True)
while True:
    for r, w in enumerate(ws):
        if w.poll() is not None:
            print("ERROR [multiproc_executor.py:1] Worker proc VLLM::Worker_TP%d died unexpectedly, shutting down "
                  "executor." % r, flush=True)
            [x.kill() for x in ws]
            sys.exit(1)
    time.sleep(0.05)
"""


def _start_engine(tp: int) -> None:
    ENGINE.core = subprocess.Popen(
        ["VLLM::EngineCore", "-c", CORE, str(tp)], executable=sys.executable, stdout=subprocess.PIPE, text=True
    )
    ENGINE.workers = [int(x) for x in ENGINE.core.stdout.readline().split()[1:]]

    def watch():
        for line in ENGINE.core.stdout:
            print(line, end="", flush=True)
        ENGINE.core.wait()
        print(
            "ERROR [core_client.py:1] Engine core proc EngineCore died unexpectedly, shutting down client.", flush=True
        )
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def _on_sigterm(*_):
    print("standin: SIGTERM, shutting down", flush=True)  # a stopped server says so only once continued
    raise KeyboardInterrupt


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--die-after", type=int, default=0, help="die at the Nth embedding request")
    p.add_argument("--die-after-s", type=float, default=0, help="die this long after the first embedding request")
    p.add_argument("--die-on-file", default="", help="die at the first embedding request after this file appears")
    p.add_argument("--delay-ms", type=float, default=0)
    p.add_argument("--stall-format", default="", help="answer no request of this encoding_format for minutes")
    p.add_argument("--unhealthy", action="store_true")
    p.add_argument("--api-key", default=os.environ.get("STANDIN_API_KEY"))
    p.add_argument("--error-text", default="", help="message of 400 answers (to test escaping)")
    p.add_argument("--close-delay-ms", type=float, default=50, help="after a 500, close the connection this late")
    p.add_argument("--miss-after-poison", action="store_true", help="answer a poisoned image once with a 503 miss")
    p.add_argument("--crash-after-poison", action="store_true", help="die when a poisoned image comes again")
    p.add_argument(
        "--wrong-on-repeat",
        action="store_true",
        help="answer an image it answered before with another embedding (a wrong answer)",
    )
    p.add_argument("--openapi", action="store_true", help="serve /openapi.json (for the hunt)")
    p.add_argument("--routes", default="", help="other POST routes to list in /openapi.json and answer 200 (a,b,...)")
    p.add_argument("--dimensions-status", type=int, default=400, help="the status of an answer to 'dimensions'")
    p.add_argument("--vector-salt", default="", help="answer other vectors than a stand-in without it")
    p.add_argument("--body-log", default="", help="append 'request-id sha256(body)' of each POST to this file")
    p.add_argument("--arrival-log", default="", help="append 'request-id epoch-seconds route' as each POST arrives")
    p.add_argument("--limit-mm-per-prompt", type=json.loads, default={}, help="JSON, as vLLM's (checked, unused)")
    p.add_argument("--echo-key", action="store_true", help="quote the API key in 400 answers (a careless server)")
    p.add_argument("--tensor-parallel-size", type=int, default=0, help="play vLLM's engine core and N TP workers")
    return p


class InProcess:
    """The stand-in served from a thread of this process (under gevent's patching, a greenlet of its hub), with
    state of its own. Its log lines go to ``log`` (a file, as a server's log). Where the process would die, it
    stops listening and hangs up on every request after, as a dead server's sockets do."""

    def __init__(self, *args: str, log: Path | None = None):
        opts = build_parser().parse_args(["--port", "0", *args])
        self.log = log

        def say(handler, line: str) -> None:
            if log is not None:
                with handler.lock, open(log, "a") as f:
                    f.write(line + "\n")

        def die(handler) -> None:
            type(handler).dead = True
            threading.Thread(target=self._close, daemon=True).start()  # not from a request: shutdown() waits for it
            handler.hang_up()

        handler = type(
            "Handler",
            (Handler,),
            {
                "opts": opts,
                "count": 0,
                "poisoned": set(),
                "seen": {},
                "held": threading.Event(),
                "lock": threading.Lock(),
                "dead": False,
                "say": say,
                "die": die,
            },
        )
        self.httpd = ThreadingHTTPServer((opts.host, 0), handler)
        self.httpd.daemon_threads = True
        self.handler = handler
        self.base_url = f"http://{opts.host}:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._closed = False

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self.httpd.shutdown()
            self.httpd.server_close()

    def __enter__(self) -> InProcess:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self.handler.dead = True  # connections still open are hung up on
        self._close()
        self._thread.join(timeout=10)

    @property
    def died(self) -> bool:
        return self.handler.dead


def in_process(*args: str, log: Path | None = None) -> InProcess:
    return InProcess(*args, log=log)


def main() -> None:
    opts = build_parser().parse_args()
    Handler.opts = opts
    if opts.tensor_parallel_size:
        _start_engine(opts.tensor_parallel_size)
    srv = ThreadingHTTPServer((opts.host, opts.port), Handler)
    srv.daemon_threads = True
    # like vLLM (uvicorn), shut down on SIGTERM through a handler: a stopped (SIGSTOPped) process does not run it
    signal.signal(signal.SIGTERM, _on_sigterm)
    print(f"standin non-default args: {vars(opts)}", flush=True)  # as vLLM prints its own, keys included
    print(f"standin listening on {opts.host}:{opts.port}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
