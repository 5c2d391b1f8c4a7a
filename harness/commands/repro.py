"""`mmchaos repro`: the report's deterministic trigger (a 400, then the same image) and what it did to the server."""

from __future__ import annotations

import time
from pathlib import Path

from mmchaos import paths
from mmchaos.signatures import Signatures

from ..servers import model as model_build
from .common import add_server_args, console, start, target_from_args

HELP = (
    "run the report's deterministic trigger (400 then the same image) and say what happened; exit 0 "
    "survived, 1 crashed, 2 could not run"
)


def add_parser(sub) -> None:
    s = sub.add_parser("repro", help=HELP, description=HELP)
    add_server_args(s)
    s.add_argument("--settle", type=float, default=20, help="seconds to wait for a dying server to die (default 20)")
    s.add_argument("--signatures", nargs="*", default=[], help="extra signature TOML files")
    s.set_defaults(func=run)


def run(a) -> int:
    from ..minimize import repro

    target = target_from_args(a, a.passthrough)
    sigs = Signatures.load(*a.signatures)
    log = Path(a.log or paths.home() / "logs" / f"repro-{time.strftime('%Y%m%d-%H%M%S')}.log")
    server = start(target, log, a.port, a.timeout)
    try:
        text = repro.PROBE_TEXT if model_build.takes_text_with_image(target.model) else None
        res = repro.poison_then_reuse(server.base_url, server.model_name(), nonce=int(time.time()), text=text)
        for s in res.steps:
            detail = f"{s.dim}-dim embedding" if s.dim else (s.error or "")
            print(f"{s.name:8} {s.status if s.status is not None else '-':>4}  {s.latency_ms:7.0f} ms  {detail}")
        if res.steps[0].status != 400:
            console.print(
                f"the trigger did not apply: the poison request was answered {res.steps[0].status}, not 400 "
                "(a model with Matryoshka embeddings accepts dimensions=5)"
            )
            return 2
        if res.steps[-1].status != 200 and target.mode != "attach":
            # give a dying server the chance to die, and its log the lines that say why: its exit or a fatal line, not
            # a timer, ends the wait (in one CI run /health said 503 before the assertion reached the log)
            deadline = time.time() + a.settle
            while server.exit_code() is None and time.time() < deadline:
                if not server.health()[0] and _fatal(sigs, log):
                    break
                time.sleep(0.2)
        alive, status, _ = server.health()
        matches = sigs.scan(log.read_text(errors="replace")) if target.mode != "attach" else []
        seen = sorted({m.signature.name for m in matches})
        print(
            f"health after: {status if status else 'down'}; server {'up' if alive else 'DOWN'}"
            + (f"; log signatures: {', '.join(seen)}" if seen else "")
        )
        if alive:
            print("survived" + (" (with a retryable cache miss)" if 503 in res.statuses() else ""))
            return 0
        print("crashed" + (f": {sigs.classify_crash(matches)}" if matches else ""))
        return 1
    finally:
        server.stop()


def _fatal(sigs: Signatures, log: Path) -> bool:
    """Whether the server's log holds a line of a fatal signature yet."""
    return any(m.signature.fatal for m in sigs.scan(log.read_text(errors="replace")))
