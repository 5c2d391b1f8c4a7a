"""The one definition of every table mmchaos writes and reads.

Writers (the Locust recorder, the watchers, the campaign runner) and readers (analysis) import from here;
nobody else spells a column name or a file name.

Layout of one trial (``results/<campaign>/<config>/<trial>/``). Every table is a folder of Parquet parts,
written incrementally (see tables.py) so a crash of anything loses at most a second of rows::

    requests/part-*.parquet     one row per request sent (REQUESTS)
    health/part-*.parquet       /health polls (HEALTH)
    metrics/part-*.parquet      Prometheus samples (METRICS)
    log_events/part-*.parquet   classified server-log lines (LOG_EVENTS)
    crashes/part-*.parquet      crash events (CRASHES)
    faults/part-*.parquet       faults injected into the server or the network (FAULTS)
    trace/part-*.parquet        what each request sent, to send it again (TRACE)
    trace_images/part-*.parquet the trace's images, each once (TRACE_IMAGES)
    server.log                  the server's combined stdout/stderr
    manifest.json               what was run (versions, flags, workload, seeds, git revision, machine)
    workers.json                with Locust workers: each one's parts, and those lost mid-run (WORKERS)
    replay.json                 a replay: how much of its trace or log was sent (REPLAY)
"""

from __future__ import annotations

import pyarrow as pa

# Outcomes of one request. Exactly one per row.
OK = "ok"  # 2xx
HTTP_ERROR = "http_error"  # the server answered with a non-2xx status
TIMEOUT = "timeout"  # no answer within the request's timeout (not asked for)
CONNECTION_ERROR = "connection_error"  # refused / reset / closed before an answer
ABORTED = "aborted"  # the client gave up on purpose (abort kind: short timeout, then disconnect)
CUT = "cut"  # still in flight when the run ended (Locust stopped its user): in no failure count, in no verdict
OUTCOMES = (OK, HTTP_ERROR, TIMEOUT, CONNECTION_ERROR, ABORTED, CUT)

# Who caused a request not to succeed (null on success): the server (5xx, an unexpected status, refused, reset or
# unanswered), the client on purpose (a malformed request answered as built, an abort) or the harness (the run
# ended while it was in flight). mmchaos.outcomes decides.
SERVER, CLIENT, HARNESS = "server", "client", "harness"
CAUSES = (SERVER, CLIENT, HARNESS)

# Request kinds sent by the realistic mix and the probes.
KINDS = (
    "valid_image",
    "text",
    "multi_image",
    "batch",
    "tokenize",
    "video",  # one or several videos (+ text), chat form: video_url parts
    "embed_v2",  # the other pooling routes (payloads/routes.py): Cohere's /v2/embed,
    "pooling",  # /pooling,
    "score",  # /score and /v1/score,
    "rerank",  # /rerank, /v1/rerank and /v2/rerank
    "document",  # a document's pages, one input each, in one request (payloads/documents.py)
    "malformed_pre",
    "malformed_post",
    "abort",
    "probe",
)
ROUTE_KINDS = ("embed_v2", "pooling", "score", "rerank")  # payloads/routes.py
VALID_KINDS = ("valid_image", "text", "multi_image", "batch", "tokenize", "video", *ROUTE_KINDS, "document")
MALFORMED_KINDS = ("malformed_pre", "malformed_post")
# Requests that can leave the API server's cache (P0) ahead of the engine's (P1): post-render failures, client
# aborts; in the probes, the steps of those names (and /tokenize, which poisoned before vLLM #38545).
POISON_KINDS = ("malformed_post", "abort")
POISON_PROBE_STEPS = ("poison", "abort", "tokenize", "route_poison")

REQUESTS = pa.schema(
    [
        ("run_id", pa.string()),
        ("config", pa.string()),
        ("trial", pa.int32()),
        ("worker", pa.string()),  # host:pid of the Locust process that sent it
        ("user_id", pa.int32()),
        ("seq", pa.int64()),  # per-user sequence number
        ("request_id", pa.string()),  # sent as X-Request-Id: vLLM names the request after it in its log
        ("kind", pa.string()),
        ("case", pa.string()),  # malformed case name or probe step name; null otherwise
        ("probe", pa.string()),  # probe sequence name; null outside probes
        ("expected_status", pa.int32()),  # null when any 2xx is expected
        ("endpoint", pa.string()),
        ("t_start", pa.float64()),  # epoch seconds
        ("latency_ms", pa.float64()),
        # open loop (--rate): when the arrival was due, and how much later it was sent (a busy generator's lag:
        # latency as a caller saw it is sched_lag_ms + latency_ms); null in closed loop and for retries
        ("t_sched", pa.float64()),
        ("sched_lag_ms", pa.float64()),
        ("status", pa.int32()),  # null when no HTTP status was received
        ("outcome", pa.string()),
        ("error", pa.string()),  # short text, null on success
        ("cause", pa.string()),  # CAUSES: who made it fail; null on success
        ("attempt", pa.int16()),  # 1, then 2, 3... for the client's retries (--retry-policy)
        ("request_group", pa.string()),  # request_id of the first attempt: links a request and its retries
        ("final", pa.bool_()),  # the client's last attempt (false: it meant to retry, and the run ended first)
        ("reconnects", pa.int16()),  # re-sent on a fresh connection after a pooled one was found closed
        # the wrong-answer oracle (locustfiles/plugin/consistency.py): the answer agreed with its input's first answer;
        # null: not checked (not sampled, not answered, or the input's first answer)
        ("consistent", pa.bool_()),
        ("n_images", pa.int16()),
        ("image_ids", pa.string()),  # comma-separated pool ids
        ("image_hashes", pa.string()),  # comma-separated content hashes (sha256[:16] of the encoded bytes)
        ("n_videos", pa.int16()),
        ("video_hashes", pa.string()),  # comma-separated sha256[:16] of each video file, as for images
        ("request_bytes", pa.int64()),
        ("response_bytes", pa.int64()),
    ]
)

HEALTH = pa.schema(
    [
        ("t", pa.float64()),
        ("ok", pa.bool_()),
        ("status", pa.int32()),
        ("latency_ms", pa.float64()),
        ("error", pa.string()),
    ]
)

METRICS = pa.schema(
    [
        ("t", pa.float64()),
        ("name", pa.string()),  # sample name as exposed (e.g. vllm:mm_cache_hits_total)
        ("labels", pa.string()),  # JSON object, sorted keys
        ("value", pa.float64()),
    ]
)

LOG_EVENTS = pa.schema(
    [
        # when the line was read (epoch seconds); a dying server's last words, read after its crash was detected,
        # at the crash's t_detected: they belong to the life that ended
        ("t", pa.float64()),
        ("signature", pa.string()),  # name from the signature table
        ("fatal", pa.bool_()),  # the signature, when seen, means the server is going down
        ("mm_hash", pa.string()),  # vLLM's hash of the item (not the same hash space as image_hashes)
        ("request_id", pa.string()),  # our X-Request-Id when the line names the request: joins REQUESTS
        ("line", pa.string()),
    ]
)

CRASHES = pa.schema(
    [
        ("t_detected", pa.float64()),
        ("t_last_healthy", pa.float64()),
        ("reason", pa.string()),  # process_exit | health_failed | hang
        ("signature", pa.string()),
        ("exit_code", pa.int32()),
        ("in_flight", pa.int32()),  # requests sent and not yet answered at detection
        ("restart", pa.int32()),  # 0 for the first server of a trial, 1 after the first restart, ...
        ("chain", pa.string()),  # the log signatures that led to it, root first (Signatures.chain)
    ]
)

# Faults mmchaos injected (mmchaos/faults.py says what each kind is): one row per fault of a campaign's plan or
# fired by hand in the web UI, whether or not it could be injected.
FAULT_INJECTED = "injected"  # the signal was sent / the proxy took it up
FAULT_TARGET_GONE = "target_gone"  # the process it names was no longer alive (the server had died or restarted)
FAULT_NOT_REACHED = "not_reached"  # the trial ended before it was due
FAULT_FAILED = "failed"  # the signal or the proxy refused (the detail says why)
FAULT_OUTCOMES = (FAULT_INJECTED, FAULT_TARGET_GONE, FAULT_NOT_REACHED, FAULT_FAILED)
FAULTS = pa.schema(
    [
        ("fault", pa.string()),  # its name (the campaign's, else its label: "kill tp_worker:1 at 20 s")
        ("kind", pa.string()),  # mmchaos.faults.KINDS
        ("target", pa.string()),  # tp_worker:1, engine_core, api_server:0, network
        ("source", pa.string()),  # campaign | web_ui
        ("t_injected", pa.float64()),  # epoch seconds: the signal sent, the proxy's fault switched on
        ("t_cleared", pa.float64()),  # SIGCONT sent / the proxy's fault off; null for a kill
        # epoch seconds: by when it was surely in effect: t_injected for a signal or the proxy; an operator action's
        # answer (vLLM acts, a pause holds or aborts, before it answers), which may come long after it was sent
        ("t_effect", pa.float64()),
        ("target_pid", pa.int64()),  # the recorded pid it went to; null for the network
        ("restart", pa.int32()),  # which server of the trial it went to (0: the first, as in CRASHES)
        ("outcome", pa.string()),  # FAULT_OUTCOMES
        ("detail", pa.string()),  # the parameters, the process title, or why it could not be injected
    ]
)

# The trace: exactly what each request attempt sent, so that it can be sent again byte for byte (replay, minimize).
# Only what REQUESTS does not hold (when it was sent, its kind and case are there, joined by worker, user_id and
# seq): the body, with each image data URL swapped for a slot (payloads.bodies.body_template), its images, stored
# once each in TRACE_IMAGES by the hash REQUESTS uses, and an abort's delay. The connection it went out on
# follows: one per user (worker, user_id), and one per abort.
TRACE = pa.schema(
    [
        ("worker", pa.string()),
        ("user_id", pa.int32()),
        ("seq", pa.int64()),
        ("abort_after_ms", pa.float64()),  # the client hung up after this long; null: it waited for the answer
        ("body", pa.binary()),  # the body with a slot for each image URL
        ("images", pa.string()),  # the slots' images, comma-separated hashes of TRACE_IMAGES
    ]
)

# an encoded file (the user's images); a generated pool image, by its spec; a fresh variant of an image, by its base
# and stamp; a malformed case's URL made from an image, by how it differs from it; any other URL, verbatim. Recipes
# are checked by hash when the image is made again.
IMAGE_FORMS = ("image", "generated", "fresh", "derived", "url")
TRACE_IMAGES = pa.schema(
    [
        ("hash", pa.string()),  # sha256[:16] of the file, as REQUESTS.image_hashes; derived, url: of the URL text
        ("form", pa.string()),  # IMAGE_FORMS
        ("mime", pa.string()),
        ("format", pa.string()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("mode", pa.string()),
        ("quality", pa.int16()),
        ("data", pa.binary()),  # image: the encoded file; url: the URL's text; derived: what differs; else null
        ("spec", pa.string()),  # generated: the ImageSpec; derived: prefix, suffix and encoding; JSON
        ("base", pa.string()),  # fresh, derived: the hash of the image it is made from
        ("token", pa.binary()),  # fresh: the stamp's token (short: "<worker>-<user>-<n>")
    ]
)

TABLES = {
    "requests": REQUESTS,
    "health": HEALTH,
    "metrics": METRICS,
    "log_events": LOG_EVENTS,
    "crashes": CRASHES,
    "faults": FAULTS,
    "trace": TRACE,
    "trace_images": TRACE_IMAGES,
}
TRACE_TABLES = ("trace", "trace_images")  # read by replay and minimize, not by the report (bodies and images)
REPORT_TABLES = tuple(t for t in TABLES if t not in TRACE_TABLES)
# Names inside a trial folder: each table's folder of parts, the server log, the manifest.
TABLE_DIRS = {name: name for name in TABLES}
REQUESTS_DIR = TABLE_DIRS["requests"]
SERVER_LOG = "server.log"
LOCUST_LOG = "locust.log"
MANIFEST = "manifest.json"
WORKERS = "workers.json"  # a Locust master's ledger: each worker of the run, and those lost mid-run
REPLAY = "replay.json"  # a replay's account: the log's requests, those sent, whether all of it was
CAMPAIGN_MANIFEST = "campaign.json"


def trial_folder(trial: int, point: dict | None = None) -> str:
    """The folder of a trial inside its configuration's folder: ``t003``; in a sweep, the point's knobs and the
    repeat at that point, ``malformed_post=5_users=8_t001`` (``trial`` is then the repeat). Stable while the
    sweep's values change, so a re-run with more values resumes the points already run."""
    return "_".join([*(f"{k}={sweep_value(v)}" for k, v in (point or {}).items()), f"t{trial:03d}"])


def sweep_value(v) -> str:
    """A sweep knob's value as folder names and labels show it: 5, 0.25, openai."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else repr(v)  # 5.0 and 5 are one point; 0.1 stays exact
    return str(v)


def sweep_label(point: dict) -> str:
    """A sweep point for people: ``malformed_post=5, users=8`` (empty outside sweeps)."""
    return ", ".join(f"{k}={sweep_value(v)}" for k, v in point.items())


def table_from_rows(rows: list[dict], schema: pa.Schema) -> pa.Table:
    """Rows (dicts keyed by column) to a table with exactly ``schema``; missing keys become null. Built column by
    column: a recorder flushes in the load's own thread, and per-row dicts (from_pylist) took 24 ms for 1,000 rows
    against 1.5 ms (bench/peers.py: that pause was the p99 latency mmchaos added)."""
    return pa.Table.from_arrays([pa.array([r.get(f.name) for r in rows], type=f.type) for f in schema], schema=schema)
