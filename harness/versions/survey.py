"""Affected versions: the deterministic probes on every vLLM release of a range, each with a few flag sets.

For each version (installed as `mmchaos engine install` does, cached), each flag set and each probe: a fresh
server (unless the previous probe left its server clean), which must answer a valid image request before a probe
on it means anything; then the probe's sequence (harness/minimize/repro.py) and the verdict of that server alone: did it
die, answer the retryable 503, log drift and go on, or stay clean. Every outcome is a row, also a release that
cannot be installed or started (a row saying why). Measured rows are kept under ``<results>/rows`` and reused by
the next run with the same flags; rows that say why nothing was measured are not (the next run tries again).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mmchaos import probe_sequences
from mmchaos.files import write_json_atomic
from mmchaos.redact import Redactor, secrets_of
from mmchaos.signatures import Match, Signatures

from ..minimize import repro
from ..servers import engines
from ..servers import model as model_build
from ..servers.server import Server, ServerError, Target

# outcomes of one probe on one server, worst first
CRASHED = "crashed"
FAILED = "failed, survived"  # the reuse was not answered 200 after retries, the server stayed up
RETRYABLE = "retryable 503"
DRIFT = "drift logged, survived"
CLEAN = "clean"
NOT_EXERCISED = "not exercised"  # the probe's trigger did not apply (e.g. the poison was not answered 400)
NOT_RUN = "not run"  # not installed, not started, not serving: the detail says why
MEASURED = (CRASHED, FAILED, RETRYABLE, DRIFT, CLEAN, NOT_EXERCISED)

CONFIG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]*")  # a flag set's name: a folder of the rows
DEFAULT_CONFIGS = {"default": [], "cache-off": ["--mm-processor-cache-gb", "0"]}
SETTLE_S = 20.0  # longest wait for a server whose reuse failed to die (its exit or failed /health ends it)


@dataclass
class Row:
    version: str
    config: str
    flags: str
    probe: str
    outcome: str
    chain: str = ""  # a crash's chain of signatures, root first (mmchaos.signatures: Signatures.chain)
    signatures: str = ""  # every signature the server logged, crash or not
    steps: str = ""  # the probe's statuses in order ("-" for no answer)
    detail: str = ""
    packages: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)  # what the row was measured with; a cached row must match
    measured_at: str = ""
    log: str = ""
    log_end: int = 0  # the bytes of the log that are this row's (0: all); a server we stopped logs its shutdown


def parse_version(text: str) -> tuple[int, ...] | None:
    """A final release's number as a tuple (0.27.1 -> (0, 27, 1)); None for anything else (pre, post, dev)."""
    return tuple(int(x) for x in text.split(".")) if re.fullmatch(r"\d+(\.\d+){1,3}", text) else None


def version_key(text: str) -> tuple[int, ...]:
    """A sort key for version numbers: final releases by number, anything else first."""
    return parse_version(text) or ()


def select(available: list[str], lo: str | None, hi: str | None) -> list[str]:
    """The final releases in [lo, hi] (either end open when None), oldest first."""
    bounds = [parse_version(b) if b else None for b in (lo, hi)]
    for b, t in zip((lo, hi), bounds):
        if b and t is None:
            raise engines.EngineError(f"'{b}' is not a vLLM version (expected e.g. 0.30.0)")
    if bounds[0] and bounds[1] and bounds[0] > bounds[1]:
        raise engines.EngineError(f"--from {lo} is newer than --to {hi}")
    lo_t, hi_t = bounds
    found = {t: v for v in available if (t := parse_version(v))}
    return [found[t] for t in sorted(found) if (not lo_t or t >= lo_t) and (not hi_t or t <= hi_t)]


def seen_in_order(matches: list[Match]) -> str:
    """Every signature the server logged, once each, in the order first logged."""
    return ", ".join(dict.fromkeys(m.signature.name for m in matches))


def judge(
    res: repro.ReproResult, trigger_status: int | None, alive: bool, matches: list[Match], sigs: Signatures
) -> tuple[str, str]:
    """(outcome, detail) of one probe on its own server."""
    statuses = res.statuses()
    first = res.steps[0]
    if not alive:
        return CRASHED, "the server died after " + " → ".join(s.name for s in res.steps)
    if first.status != trigger_status:
        want = "a hang-up before any answer" if trigger_status is None else str(trigger_status)
        got = "no answer" if first.status is None else str(first.status)
        return NOT_EXERCISED, f"the {first.name} step got {got}, not {want} ({first.error or ''})".replace(" ()", "")
    last = res.steps[-1]
    if last.status != 200:
        return FAILED, f"{last.name} answered {last.status if last.status else 'nothing'}: {(last.error or '')[:120]}"
    if 503 in statuses:
        at = next(s.name for s, n in zip(res.steps, res.steps[1:]) if n.status == 503)
        return RETRYABLE, f"after {at}: answered 503 {statuses.count(503)}x, then 200"
    if any(m.signature.name in sigs.drift_names for m in matches):
        return DRIFT, "drift logged; the reuse was answered 200"
    return CLEAN, ""


def _steps_text(res: repro.ReproResult) -> str:
    return " ".join("-" if s is None else str(s) for s in res.statuses())


def _settle(server: Server, settle_s: float) -> bool:
    """Whether the server is still up; a server whose reuse failed gets ``settle_s`` to die first (its exit or a
    failed /health ends the wait, not a timer)."""
    deadline = time.monotonic() + settle_s
    while server.exit_code() is None and server.health()[0] and time.monotonic() < deadline:
        time.sleep(0.2)  # pacing the observation, not synchronisation
    return server.exit_code() is None and server.health()[0]


Launch = Callable[[str, list[str], Path], Server]  # (version, flags, log) -> a started server


def engine_launch(model: str | None = None) -> Launch:
    def launch(version: str, flags: list[str], log: Path) -> Server:
        return Server(Target(mode="engine", engine=version, model=model, flags=flags), log).start()

    return launch


class Survey:
    """The probes on versions × flag sets. ``launch`` starts a server of a version with flags (the embedded
    engine by default; tests give the stand-in); ``prepare`` makes a version usable (install, cached) and
    returns its packages, or raises EngineError with the reason it cannot be."""

    def __init__(
        self,
        results: Path,
        *,
        configs: dict[str, list[str]] | None = None,
        probes: list[str] | None = None,
        launch: Launch | None = None,
        prepare: Callable[[str], dict] | None = None,
        say: Callable[[str], None] = print,
        startup_timeout: float = 300.0,
        abort_after_ms: int | None = None,
        force: bool = False,
        settle_s: float = SETTLE_S,
        signatures: Signatures | None = None,
        model: str | None = None,
    ):
        self.results = Path(results)
        self.model = model  # a model other than the default: part of what a kept row was measured on
        # an image alone where the model takes no text beside it (CLIP), else the probe's text beside it
        self.text = repro.PROBE_TEXT if model_build.takes_text_with_image(model) else None
        self.configs = configs if configs is not None else dict(DEFAULT_CONFIGS)
        try:
            self.probes = probe_sequences.parse(",".join(probes or ()))
        except ValueError as e:
            raise engines.EngineError(str(e)) from e
        self.launch = launch or engine_launch()
        self.prepare = prepare or install_engine
        self.say = say
        self.startup_timeout = startup_timeout
        self.abort_after_ms = abort_after_ms
        self.force = force
        self.settle_s = settle_s
        self.sigs = signatures or Signatures.default()
        self.redactor = Redactor.from_environment([v for f in self.configs.values() for v in secrets_of(f)])
        self.nonce = int(time.time() * 1000) % 2**31

    def _params(self, flags: list[str], probe: str) -> dict:
        hang_ups = [self.abort_after_ms] if self.abort_after_ms else list(repro.ABORT_LADDER_MS)
        return {
            "flags": self.redactor.argv(flags),
            **({"model": self.model} if self.model else {}),  # rows of the default model keep their params as before
            **({"abort_after_ms": hang_ups} if probe == "abort_reuse" else {}),
        }

    def _cache_path(self, version: str, config: str, probe: str) -> Path:
        return self.results / "rows" / version / config / f"{probe}.json"

    def _cached(self, version: str, config: str, probe: str, flags: list[str]) -> Row | None:
        p = self._cache_path(version, config, probe)
        if self.force or not p.is_file():
            return None
        try:
            row = Row(**json.loads(p.read_text()))
        except (ValueError, TypeError):
            return None
        if row.params != self._params(flags, probe) or row.outcome not in MEASURED:
            return None
        # named again from its log (a newer signature table names it better); a clean row's server may have gone
        # on to the next probe, whose lines are not this row's
        if row.outcome != CLEAN and Path(row.log).is_file():
            matches = self.sigs.scan(_log_text(Path(row.log), row.log_end))
            row.signatures = seen_in_order(matches)
            row.chain = self.sigs.chain(matches) if row.outcome == CRASHED else ""
        return row

    def _keep(self, row: Row) -> Row:
        if row.outcome in MEASURED:
            self._cache_path(row.version, row.config, row.probe).parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self._cache_path(row.version, row.config, row.probe), self.redactor.data(asdict(row)))
        return row

    def run(self, versions: list[str]) -> list[Row]:
        rows: list[Row] = []
        total = len(versions) * len(self.configs) * len(self.probes)
        for version in versions:
            todo = [
                (c, f, p) for c, f in self.configs.items() for p in self.probes if not self._cached(version, c, p, f)
            ]
            packages, why = {}, ""
            if todo:
                try:
                    packages = self.prepare(version)
                except engines.EngineError as e:
                    why = f"cannot be installed here: {e}"
            for config, flags in self.configs.items():
                self._config_rows(rows, total, version, config, flags, packages, why)
        return rows

    def _config_rows(
        self, rows: list[Row], total: int, version: str, config: str, flags: list[str], packages: dict, why: str
    ) -> None:
        """The probes of one version and flag set. A probe gets a fresh server unless the previous one left its
        server clean (nothing logged, answered as asked): then no state of the server can matter to a probe
        whose image it has never seen, and a start (30-150 s here) is saved."""
        reason = why or self._flag_problem(version, flags)
        live = None
        try:
            for probe in self.probes:
                at = f"[{len(rows) + 1}/{total}] {version} {config} {probe}"
                row = self._cached(version, config, probe, flags)
                if row:
                    self.say(f"{at}: {cell(row)} (measured {row.measured_at})")
                elif reason:
                    row = self._row(version, config, flags, probe, NOT_RUN, detail=reason, packages=packages)
                else:
                    if live is None:
                        self.say(f"{at}: fresh server")
                        live = self._start(version, config, flags, probe)
                    else:
                        self.say(f"{at}: the previous probe's server (it was left clean)")
                    if isinstance(live, str):  # it would not start or serve: nor will it for the next probe
                        row = self._row(version, config, flags, probe, NOT_RUN, packages=packages, detail=live)
                        reason, live = live, None
                    else:
                        row = self._keep(self._probe(live, version, config, flags, probe, packages))
                        if row.outcome != CLEAN or row.signatures:
                            live.server.stop()
                            live = None
                    self.say(f"{at}: {cell(row)}")
                rows.append(row)
        finally:
            if live is not None and not isinstance(live, str):
                live.server.stop()

    def _flag_problem(self, version: str, flags: list[str]) -> str:
        try:
            known = engines.require(version).serve_flags()
        except engines.EngineError:
            return ""  # not one of our engines (the stand-in): its own start-up judges the flags
        bad = [f.split("=", 1)[0] for f in flags if f.startswith("--") and f.split("=", 1)[0] not in known]
        return f"vLLM {version} has no flag {', '.join(bad)}" if bad else ""

    def _row(self, version, config, flags, probe, outcome, **kw) -> Row:
        return Row(
            version=version,
            config=config,
            flags=" ".join(self.redactor.argv(flags)),
            probe=probe,
            outcome=outcome,
            params=self._params(flags, probe),
            measured_at=time.strftime("%Y-%m-%d %H:%M %Z"),
            **kw,
        )

    def _start(self, version: str, config: str, flags: list[str], probe: str) -> _Live | str:
        """A started server that has answered a valid image request, or why there is none (it is stopped)."""
        log = self.results / "logs" / version / f"{config}-{probe}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.unlink(missing_ok=True)
        server = None
        try:
            server = self.launch(version, flags, log)
            t = server.wait_healthy(self.startup_timeout, progress=_heartbeat(self.say, version, config, probe))
            self.say(f"  server healthy after {t:.0f} s")
            model = server.model_name()
            self.nonce += 1
            warm = repro.embed_image(server.base_url, model, nonce=self.nonce, text=self.text)
            if warm.status == 200:
                return _Live(server, log, model)
            why = f"a valid image request was answered {warm.status or warm.error}: {(warm.error or '')[:200]}"
        except (ServerError, OSError, ValueError, KeyError) as e:
            why = f"did not start: {str(e).splitlines()[0][:300]}"  # the server's error names its log
        except BaseException:
            if server is not None:
                server.stop()
            raise
        if server is not None:
            server.stop()
        return why

    def _probe(self, live: _Live, version: str, config: str, flags: list[str], probe: str, packages: dict) -> Row:
        """One probe on a running server; a server that died (or whose probe was not clean) is stopped after it,
        so its log is complete when the row is named from it."""
        server = live.server
        sequence, trigger = repro.SEQUENCES[probe]
        self.nonce += 1
        kw: dict[str, Any] = {"abort_after_ms": self.abort_after_ms} if probe == "abort_reuse" else {}
        res = sequence(server.base_url, live.model, nonce=self.nonce, text=self.text, **kw)
        alive = (
            _settle(server, self.settle_s)
            if res.steps[-1].status != 200
            else server.exit_code() is None and server.health()[0]
        )
        outcome, _ = judge(res, trigger, alive, [], self.sigs)
        # what a live server logs once we stop it (its shutdown: EngineDeadError in the output handler on 0.30)
        # is not the probe's; a dead one's last lines are its death
        end = live.log.stat().st_size if alive else 0
        if outcome != CLEAN:
            server.stop()  # the log is complete once the group is gone
        matches = self.sigs.scan(_log_text(live.log, end))
        outcome, detail = judge(res, trigger, alive, matches, self.sigs)
        return self._row(
            version,
            config,
            flags,
            probe,
            outcome,
            steps=_steps_text(res),
            detail=detail,
            chain=self.sigs.chain(matches) if outcome == CRASHED else "",
            signatures=seen_in_order(matches),
            packages=packages,
            log=str(live.log),
            log_end=end,
        )


@dataclass
class _Live:
    server: Server
    log: Path
    model: str


def _log_text(log: Path, end: int = 0) -> str:
    data = log.read_bytes()
    return (data[:end] if end else data).decode(errors="replace")


def _heartbeat(say, version, config, probe, every_s: float = 15.0):
    last = [0.0]

    def progress(t: float, line: str) -> None:
        if t - last[0] >= every_s:
            last[0] = t
            say(f"  … starting {version} ({config}, {probe}): {t:.0f} s: {line[-100:]}")

    return progress


def install_engine(version: str, say: Callable[[str], None] = print) -> dict:
    """Install (a no-op when installed) and return the engine's package versions."""
    return engines.install(version, say=say).manifest().get("packages", {})


def cell(row: Row) -> str:
    """What one probe did, as a table cell."""
    if row.outcome == CRASHED:
        return f"crashed: {row.chain or 'no signature'}"
    if row.outcome in (NOT_RUN, NOT_EXERCISED, FAILED):
        return f"{row.outcome}: {row.detail.split(' (log: ')[0]}"  # the log's path is in table.csv
    return row.outcome
