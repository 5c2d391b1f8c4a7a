"""What counts as a finding of the hunt, and its fingerprint.

Oracles: the server died or hung (the crash watcher); an error line or traceback in the server log that the
signature table does not name (an *unknown signature*, named from its exception type and innermost vLLM frame);
a 5xx to a request (the known drift answer, a retryable 503, and known drift lines are the lower class ``drift``);
the same input answered differently, or distinct images answered alike (``mmchaos.sameness``); a 200 whose body
does not validate against the route's response schema from the server's own /openapi.json.

A fingerprint is what makes two findings the same bug: the oracle, the process that logged it, the exception type
or signature chain, and the innermost vLLM frames. A known signature's text raised by another process or frame is
another finding."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import jsonschema
import numpy as np

from mmchaos import sameness
from mmchaos.signatures import Signatures

ERROR_LINE = re.compile(
    r"\b(ERROR|CRITICAL)\b|Traceback \(most recent call last\)|^\s*\w*(Error|Exception):|"
    r"AssertionError"
)
# vLLM prefixes each line with its process (a name, its DP/TP rank or index, its pid): named without the rank, one
# bug met in ApiServer_0 and ApiServer_1 is one finding; read by pid, each process's lines are one stream
PROCESS = re.compile(r"\((\w+?)(?:_DP\d+)?(?:_TP\d+)?(?:_\d+)? pid=(\d+)\)")
FRAME = re.compile(r'File "[^"]*/(vllm/[^"]+)", line \d+, in (\w+)')
EXCEPTION = re.compile(
    r"^(?:\(\w+ pid=\d+\)\s*)?(?:\S+\s+)*?([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))"
    r"(?::|$)"
)
# a traceback's own lines, each logged at ERROR by vLLM: indented frames and code, blank lines, carets, the chaining
# sentences
CONTINUATION = re.compile(r"\s*$|\s+\S|\^|During handling of the above exception|The above exception was")
FRAMES_KEPT = 2  # innermost vLLM frames in a fingerprint: the function that raised and its caller


UNKNOWN_PROCESS = "server"  # a line without vLLM's process prefix


def process_of(line: str) -> str:
    m = PROCESS.search(line)
    return m.group(1) if m else UNKNOWN_PROCESS


@dataclass
class LogError:
    """One error of the server log: its lines (a traceback is one error), process, exception type and frames."""

    lines: list[str]
    process: str
    exception: str
    frames: list[str]

    @property
    def fingerprint(self) -> str:
        return "|".join(("unknown_signature", self.process, self.exception, *self.frames[-FRAMES_KEPT:]))

    @property
    def title(self) -> str:
        if self.exception == "error_line":  # no exception to name it by: its message says what it is
            return f"error logged: {_message(self.lines[0])[:100]} ({self.process})"
        where = self.frames[-1] if self.frames else "no vLLM frame"
        return f"{self.exception} in {where} ({self.process})"


def log_errors(lines: Iterable[str], sigs: Signatures) -> list[LogError]:
    """The errors of ``lines`` no signature names. A traceback's lines are grouped (it ends at its exception
    line); an error line a signature names, with its traceback, is a known one and left out. Each process's lines
    are read on their own: two API servers (``--api-server-count 2``) and the access log interleave in one log, and
    a line of another process between a refusal's heading and its traceback made the traceback an unknown error."""
    streams: dict[str, list[str]] = {}
    where: dict[str, int] = {}  # a line's first place in the log: the errors are told in the log's order
    for k, line in enumerate(lines):
        m = PROCESS.search(line)
        streams.setdefault(m.group(2) if m else "", []).append(line)
        where.setdefault(line, k)
    errors = [e for stream in streams.values() for e in _stream_errors(stream, sigs)]
    return sorted(errors, key=lambda e: where.get(e.lines[0], 0))


def _stream_errors(lines: list[str], sigs: Signatures) -> list[LogError]:
    out: list[LogError] = []
    block: list[str] = []
    header: str | None = None  # an error line without an exception: the heading of the traceback that may follow
    for line in lines:
        if "Traceback (most recent call last)" in line:
            block, header = [*([header] if header else []), line], None
            continue
        if header is not None:
            out.append(_error([header], "error_line"))
            header = None
        if block:
            block.append(line)
            m = EXCEPTION.search(_message(line))
            if m and not FRAME.search(line) and not line.strip().startswith("File "):
                out.append(_error(block, m.group(1)))
                block = []
            elif len(block) > 400:
                block = []  # not a traceback after all
            continue
        if ERROR_LINE.search(line) and CONTINUATION.match(_raw_message(line)):
            continue  # a line of a traceback already told (vLLM logs each of its lines at ERROR): no error of its own
        if ERROR_LINE.search(line):
            m = EXCEPTION.search(_message(line))
            if m:
                out.append(_error([line], m.group(1)))
            else:
                header = line
    if header is not None:
        out.append(_error([header], "error_line"))
    return [e for e in out if not any(sigs.match(x) for x in e.lines)]


def log_needle(exception: str | None, first_line: str) -> str:
    """What a reproducer looks for in the log to say a log finding came again: its exception's name, or, for an
    error line without one, the line's message up to its first number (ids and counts differ from run to run)."""
    if exception and exception != "error_line":
        return exception
    return re.split(r"\d", _message(first_line), maxsplit=1)[0].strip()[:80] or first_line.strip()[:80]


def _message(line: str) -> str:
    """The line without vLLM's prefix (process, level, time, source)."""
    return _raw_message(line).strip()


def _raw_message(line: str) -> str:
    """The line without vLLM's prefix, its own indentation kept."""
    text = re.sub(r"^\s*", "", PROCESS.sub("", line, count=1))
    return re.sub(r"^(?:ERROR|WARNING|INFO|CRITICAL|DEBUG)\s+\S+\s+\S+\s+\[[^\]]*\] ?", "", text)


def _error(block: list[str], exception: str) -> LogError:
    frames = [f"{m.group(1)}:{m.group(2)}" for x in block for m in [FRAME.search(x)] if m]
    return LogError(block, process_of(block[0]), exception.rsplit(".", 1)[-1], frames)


def status_finding(path: str, status: int | None, text: str, sigs: Signatures) -> tuple[str, str, str] | None:
    """(oracle, fingerprint, title) of an answer that is a finding: a 5xx; the drift answer is the lower class."""
    if status is None or status < 500:
        return None
    drift = sigs.drift_answer(status, text)
    if drift:
        return (
            "drift",
            f"drift|answer|{drift}",
            f"{status} answered for a cached image the engine did not have ({drift})",
        )
    kind, message = _error_type(text), _error_message(text)
    # one bug, whichever route met it: the fingerprint is the answer's error, its numbers left out
    said = re.sub(r"\d+", "N", message)[:80]
    return (
        "server_error",
        f"server_error|{status}|{kind}|{said}",
        f"{status} {kind}" + (f": {said}" if said else "") + f" (first from {path})",
    )


def _error_type(text: str) -> str:
    m = re.search(r'"type"\s*:\s*"([^"]+)"', text)
    return m.group(1) if m else re.sub(r"\d+", "N", (text.strip().splitlines() or ["(empty body)"])[0][:80])


def _error_message(text: str) -> str:
    m = re.search(r'"message"\s*:\s*"((?:[^"\\]|\\.)*)"', text)
    return m.group(1) if m else ""


def shared_fields(bodies: list[dict]) -> dict[str, object]:
    """The top-level fields, with their values, that every one of ``bodies`` carried (``model`` aside): what the
    requests a server left unanswered had in common, the likeliest cause."""
    if not bodies:
        return {}
    common = {k: v for k, v in bodies[0].items() if k != "model"}
    for b in bodies[1:]:
        common = {k: v for k, v in common.items() if k in b and b[k] == v}
    return common


def bad_response(answer: object, schema: dict | None) -> str | None:
    """Why a 200's body does not validate against the route's response schema (None: it does, or no schema)."""
    if schema is None:
        return None
    try:
        jsonschema.validate(answer, schema)
    except jsonschema.ValidationError as e:
        return f"{'/'.join(map(str, e.absolute_path)) or '(body)'}: {e.message[:160]}"
    except jsonschema.SchemaError:
        return None  # the server's schema itself does not hold: not the answer's fault
    return None


def embeddings(answer: object, body: dict) -> list[np.ndarray] | None:
    """The vectors of a 200's body, in input order; None for an answer that has none (a score's answer reads as
    nan vectors: not an embedding to compare)."""
    try:
        vectors = sameness.vectors(answer, body)  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if not vectors or any(v.size == 0 or not np.isfinite(v).all() for v in vectors):
        return None
    return vectors


class Answers:
    """The wrong-answer oracle over one server's life: each input's first answer, compared with every later one;
    and the first answers of distinct inputs with media, which must not collapse onto one vector."""

    def __init__(self) -> None:
        self.first: dict[str, object] = {}
        self.with_media: list[tuple[str, object]] = []

    def check(self, path: str, body: dict, answer: dict) -> list[str]:
        out: list[str] = []
        try:
            keys = sameness.input_keys(path, body)
        except (KeyError, TypeError, ValueError, AttributeError):
            return out
        vectors = embeddings(answer, body)
        if vectors is None:
            return out  # not an answer with vectors: nothing to compare
        media = "image_url" in str(body) or bool(body.get("images"))
        for key, vec in zip(keys, vectors):
            if key in self.first:
                if not sameness.agree(self.first[key], vec):  # type: ignore[arg-type]
                    c = sameness.cosine(self.first[key], vec)  # type: ignore[arg-type]
                    out.append(
                        f"the same input answered differently on {path} (cosine {c:.4f} < {sameness.COSINE_MIN})"
                    )
                continue
            self.first[key] = vec
            if media:
                if any(sameness.collapsed(v, vec) for k, v in self.with_media if k != key):  # type: ignore[arg-type]
                    out.append(f"two distinct inputs with images answered one vector on {path}")
                self.with_media.append((key, vec))
        return out

    def reset(self) -> None:
        """A new server: answers of the old one are not the new one's."""
        self.first.clear()
        self.with_media.clear()
