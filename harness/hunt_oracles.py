"""What counts as a finding, and the fingerprint that says two findings are one.

- ``crash``: the server died or hung (the crash watcher), named by its signature chain;
- ``unknown_signature``: an ERROR line, traceback or assertion the signature table does not name, named from its
  exception type and innermost vLLM frame (file:function), so the user can add it to the table;
- ``5xx``: a 5xx answer to a request the schema allows; a 503 naming a cache miss, and a drift line in the log, are
  the lower class ``drift``;
- ``wrong_answer``: the same input answered with another embedding (mmchaos.sameness), or distinct images
  collapsing onto one;
- ``schema``: a 200 whose body does not validate against the server's own response schema.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from mmchaos.signatures import Signatures

ERRORISH = re.compile(r"\bERROR\b|Traceback \(most recent call last\)|AssertionError|\bassert ")
FRAME = re.compile(r'File "([^"]*?/vllm/[^"]+)", line \d+, in (\S+)')
EXCEPTION = re.compile(r"^\s*(?:\(\w+ pid=\d+\)\s*)?(?:[\w.]+\.)?([A-Z]\w*(?:Error|Exception|Exit))\b(?::|$)")
PROCESS = re.compile(r"\((EngineCore[\w_]*|APIServer[\w_]*|VllmWorker[\w_-]*|Worker[\w_-]*)\s+pid=\d+\)")
PREFIX = re.compile(r"^\(\S+ pid=\d+\)\s?")  # vLLM's prefix on a child process's lines
# log lines of a server we did not hurt: the harness's own hang-ups, shutdowns we asked for
BENIGN = re.compile(r"Aborted request|client disconnected|CancelledError|shutting down|Shutting down")


@dataclass
class Finding:
    oracle: str
    signature: str  # the chain, the new signature's name, the status, ...
    detail: str
    route: str = ""
    process: str = ""
    steps: list = field(default_factory=list)  # the case's steps up to and including the one that showed it
    at_step: int = -1
    salt: int = 0

    @property
    def fingerprint(self) -> str:
        key = "|".join((self.oracle, self.signature, self.process, self.route))
        return hashlib.sha256(key.encode()).hexdigest()[:12]

    @property
    def severity(self) -> str:
        return "drift" if self.oracle == "drift" else "finding"


def unknown_signatures(lines: list[str], sigs: Signatures) -> list[tuple[str, str, str]]:
    """(name, process, first line) of each block of error lines that no signature names. A traceback block runs
    from its first errorish line to the exception line; its name is ``<ExceptionType>@<file>:<function>`` of the
    innermost vLLM frame."""
    out, block = [], []
    for line in lines + [""]:
        body = PREFIX.sub("", line)
        if block and not (body.strip() and (body.startswith((" ", "\t")) or FRAME.search(body)
                                            or EXCEPTION.search(body) or ERRORISH.search(body))):
            out.append(_name(block))
            block = []
        if ERRORISH.search(line) or (block and line.strip()):
            block.append(line)
    return [o[:3] for o in out
            if o and not any(sigs.match(b) for b in o[3]) and not any(BENIGN.search(b) for b in o[3])]


def continues(line: str) -> bool:
    """The line may belong to an error block (so a block ending at it may still be open)."""
    body = PREFIX.sub("", line)
    return bool(body.strip()) and bool(body.startswith((" ", "\t")) or FRAME.search(body) or EXCEPTION.search(body)
                                       or ERRORISH.search(body))


def _name(block: list[str]):
    frames = [FRAME.search(b) for b in block]
    frames = [f for f in frames if f]
    exc = next((m.group(1) for b in reversed(block) if (m := EXCEPTION.search(b.split(" ", 3)[-1] if b else ""))
                or (m := EXCEPTION.search(b))), None)
    if exc is None and any("assert" in b for b in block):
        exc = "AssertionError"
    if exc is None and not frames:
        return None if not any(re.search(r"\bERROR\b", b) for b in block) else \
            (f"error:{_words(block[0])}", _process(block), block[0].strip()[:300], block)
    where = ""
    if frames:
        path, fn = frames[-1].group(1), frames[-1].group(2)
        where = "@" + path.split("/vllm/", 1)[1] + ":" + fn
    return (f"{exc or 'Error'}{where}", _process(block), block[0].strip()[:300], block)


def _process(block: list[str]) -> str:
    m = next((PROCESS.search(b) for b in block if PROCESS.search(b)), None)
    return re.sub(r"_?\d+$", "", m.group(1)) if m else "APIServer"


def _words(line: str) -> str:
    text = re.sub(r"^.*?\bERROR\b[^\]]*\]?\s*", "", line)
    return "_".join(re.findall(r"[A-Za-z]+", text)[:4]).lower() or "line"
