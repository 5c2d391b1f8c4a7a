"""From a crashing trial to a minimal reproducer (``mmchaos minimize``).

The trial's trace up to its first crash is the starting sequence. A candidate sequence *crashes* when it crashes a
fresh server of the trial's engine and flags with the trial's crash signature, in each of ``repeats`` runs (the
drift is racy: one crash is not enough, one survival is). The search, cheapest first:

1. a targeted guess: the request the crash (or its drift line) names, after the last poison request (a
   post-render failure, an abort) that sent one of its images;
2. if no guess crashed, the whole sequence once (a replay that does not crash ends the search), then delta
   debugging (ddmin) over the requests, which keeps each user's order;
3. all requests on one connection, one after the other;
4. fewer and smaller images: a request's extra images dropped, each image scaled down (not with ``keep_images``);
   aborts hanging up sooner (while the image is rendered, not racing its render);
5. the result confirmed ``repeats`` times more.

Every server start counts against ``max_starts`` and the wall time against ``max_minutes``; results are kept in
``state.json`` by the candidate's script, so an interrupted or over-budget search resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from mmchaos import paths, schema
from mmchaos.errors import MmchaosError
from mmchaos.files import write_json_atomic
from mmchaos.manifest import ManifestError
from mmchaos.manifest import read as read_manifest
from mmchaos.payloads import trace_edits
from mmchaos.payloads.traces import Trace
from mmchaos.signatures import Signatures
from mmchaos.tables import read_table

from ..servers import engines
from ..servers.server import Target, engine_base_flags
from . import repro_script
from .candidate_run import Outcome, run_candidate, target_of

HUNT_KIND = "hunt"  # rows of a hunt's case (harness/hunt.py)
SOONEST_ABORT_MS = 1.0  # an abort is tried hanging up this soon after sending (likeliest to poison: repro.py)
SMALL_SIDES = (64,)  # the long sides an image is tried at (vLLM scales small images up to its minimum anyway)


class MinimizeError(MmchaosError):
    """The trial cannot be minimized (one line)."""


class BudgetSpent(Exception):
    pass


@dataclass
class Budget:
    max_starts: int
    max_seconds: float
    starts: int = 0
    t0: float = field(default_factory=time.time)

    def take(self) -> None:
        if self.starts >= self.max_starts:
            raise BudgetSpent(f"{self.max_starts} server starts")
        if time.time() - self.t0 >= self.max_seconds:
            raise BudgetSpent(f"{self.max_seconds / 60:g} minutes")
        self.starts += 1


@dataclass
class Result:
    trace: Trace  # the smallest sequence found that crashes
    confirmed: bool  # crashed in `repeats` more runs at the end
    minimal: bool  # the search finished (not stopped by its budget)
    outcome: Outcome | None  # the last crashing run of it (its server log, its statuses)
    note: str = ""


class Minimizer:
    def __init__(
        self,
        trace: Trace,
        target: Target,
        signature: str,
        out: Path,
        *,
        named: list[str] | None = None,
        origin: str = "",
        repeats: int = 2,
        max_starts: int = 40,
        max_minutes: float = 60,
        settle: float = 10.0,
        startup_timeout: float = 420,
        progress: Callable[[str], None] = print,
        signatures: Signatures | None = None,
        keep_images: bool = False,
        packages: dict | None = None,
        start_label: str = "the sequence that crashed",
    ):
        """Shrink ``trace`` (the requests sent before a crash) to what still kills a fresh server of ``target`` with
        the crash ``signature`` (its chain, root first: the same death by another mechanism is another bug).
        ``named``: the request ids the crash's log named (the first guesses); ``origin``: where it was found, for
        the reproducer's docstring."""
        self.start, self.target, self.signature = trace, target, signature
        self.packages = packages if packages is not None else _engine_packages(target)  # for the text
        self.named, self.origin = list(named or []), origin
        self.start_label = start_label  # what its progress calls the sequence it starts from
        self.out, self.repeats, self.settle = Path(out), repeats, settle
        self.keep_images = keep_images  # no fewer or smaller images tried
        self.startup_timeout, self.progress = startup_timeout, progress
        self.sigs = signatures or Signatures.load()
        self.budget = Budget(max_starts, max_minutes * 60)
        if not len(trace):
            raise MinimizeError(f"{origin or 'the trace'}: no request was sent before its crash")
        self.state_file = self.out / "state.json"
        self.state = self._load_state()
        self.runs = len(list((self.out / "runs").glob("[0-9]*"))) if (self.out / "runs").is_dir() else 0

    @classmethod
    def from_trial(cls, trial: Path, out: Path, **kw) -> Minimizer:
        """A crashed trial of a campaign (or a replay): its trace up to the first crash, its server, its crash."""
        trial = Path(trial)
        try:
            manifest, _ = read_manifest(trial / schema.MANIFEST)
        except (OSError, ManifestError) as e:
            raise MinimizeError(f"{trial} is not a trial folder (no readable {schema.MANIFEST})") from e
        crashes = read_table(trial, "crashes").to_pandas().sort_values("t_detected")
        if crashes.empty:
            raise MinimizeError(f"trial {trial} did not crash: nothing to minimize")
        crash = crashes.iloc[0]
        chain = crash.get("chain")
        signature = str(chain if isinstance(chain, str) and chain else crash["signature"])
        trace = Trace.load(trial)
        before = trace.requests.index[trace.requests["t_start"] <= float(crash["t_detected"])]
        if before.empty:
            raise MinimizeError(f"no request of trial {trial} was sent before its crash")
        events = read_table(trial, "log_events").to_pandas()
        events = events[(events["t"] <= float(crash["t_detected"]) + 5) & events["request_id"].notna()]
        return cls(
            trace.subset(before),
            target_of(manifest),
            signature,
            out,
            named=events["request_id"].tolist(),
            origin=f"trial {trial.resolve()}",
            packages=manifest.engine_packages or {},
            start_label="the trial's sequence",
            **kw,
        )

    # -- the search ----------------------------------------------------------------------------------------
    def run(self) -> Result:
        best, minimal, note = self.start, False, ""
        self.best = best
        try:
            best = self.best = self._guess(best)
            if best is self.start and not self._crashes(best, self.start_label):
                # ddmin needs a sequence that crashes: without one every start after this would be wasted
                hint = (
                    "try --repeats 1, or another crashed trial"
                    if self.repeats > 1
                    else "run it again, or try another crashed trial"
                )
                return Result(
                    best,
                    False,
                    False,
                    None,
                    f"the trial's {len(best)} requests did not crash a fresh server when replayed: the "
                    f"crash needs timing or state the replay does not reproduce ({hint})",
                )
            images = () if self.keep_images else (self._fewer_images, self._smaller_images)
            for step in (self._ddmin, self._serialize, *images, self._sooner_aborts):
                best = self.best = step(best)
            minimal = True
        except BudgetSpent as e:
            best = self.best
            note = f"stopped after {e}: the sequence is the smallest found so far, not a minimal one"
        confirmed = False
        try:
            confirmed = minimal and self._crashes(best, "confirm", repeats=self.repeats, fresh=True)
        except BudgetSpent as e:
            note = f"stopped after {e} before the result was confirmed"
        if minimal and not confirmed and not note:
            note = f"the result did not crash in {self.repeats} of {self.repeats} more runs: the crash is racy here"
        return Result(best, confirmed, minimal, self.outcome_of(best), note)

    def outcome_of(self, trace: Trace) -> Outcome | None:
        """A recorded crash of ``trace`` (this session's or an earlier one's), if there is one."""
        key = hashlib.sha256(self.script(trace).encode()).hexdigest()[:16]
        o = self.state.get("outcomes", {}).get(key)
        return Outcome(True, o["signature"], o["statuses"], None, o["log_lines"], Path(o["folder"])) if o else None

    def _guess(self, trace: Trace) -> Trace:
        for guess in self._guesses(trace):
            if len(guess) < len(trace) and self._crashes(guess, "targeted guess"):
                return guess
        return trace

    def _guesses(self, trace: Trace) -> list[Trace]:
        """The request the crash names (or the last ones sent), each after the poison requests that sent one of
        its images: the last such one, then all of them; on one connection, one after the other (in the trial they
        may have overlapped, and a reuse that reaches the server before the poison was rendered cannot crash it)."""
        r = trace.requests
        named = set(self._named_requests())
        unanswered = r["status"].isna() & (r["outcome"] != schema.ABORTED)
        triggers = (
            [i for i in r.index if r.at[i, "request_id"] in named]
            or list(r.index[unanswered])
            or list(reversed(r.index))
        )
        out = []
        for i in triggers[:3]:
            images = self._images(trace, i)
            poisoners = [j for j in r.index[:i] if _poisons(r.loc[j]) and images & self._images(trace, j)]
            # a poison request the server answered as built (its 400) poisoned for sure; one it did not, maybe
            answered = [
                j for j in poisoners if r.at[j, "status"] == r.at[j, "expected_status"] or r.at[j, "kind"] == "abort"
            ]
            # the last poison request answered as built, then the last one; in a hunt's trace (where a 4xx may have
            # failed before its image was read) the last four, each alone, answered ones first (a hang-up's poison is
            # a race a replay may lose)
            if (r["kind"] == HUNT_KIND).all():
                firsts = sorted(poisoners, key=lambda j: (r.at[j, "outcome"] != schema.ABORTED, j), reverse=True)[:4]
            else:
                firsts = [*answered[-1:], *poisoners[-1:]]
            for last in dict.fromkeys(firsts):
                out += _abort_sooner_first(trace_edits.serialized(trace.subset([last, i])))
            if len(poisoners) > 1:
                out += _abort_sooner_first(trace_edits.serialized(trace.subset([*poisoners, i])))
        return out

    def _named_requests(self) -> list[str]:
        return self.named

    @staticmethod
    def _images(trace: Trace, i: int) -> set[str]:
        row_images = trace.requests.at[i, "image_hashes"] if "image_hashes" in trace.requests else None
        out = set(trace.image_hashes(i))
        if isinstance(row_images, str):
            out |= set(row_images.split(","))
        return out

    def _ddmin(self, trace: Trace) -> Trace:
        items, n = list(range(len(trace))), 2
        while len(items) >= 2:
            chunks = [items[k * len(items) // n : (k + 1) * len(items) // n] for k in range(n)]
            for label, candidate in [("subset", c) for c in chunks] + [
                ("complement", [x for x in items if x not in c]) for c in chunks
            ]:
                if (
                    candidate
                    and len(candidate) < len(items)
                    and self._crashes(trace.subset(candidate), f"ddmin {label} of {n}")
                ):
                    items, n = candidate, (2 if label == "subset" else max(n - 1, 2))
                    self.best = trace.subset(items)  # kept if the budget runs out before the search ends
                    break
            else:
                if n >= len(items):
                    break
                n = min(len(items), 2 * n)
        return trace.subset(items)

    def _serialize(self, trace: Trace) -> Trace:
        if len(trace.lanes()) < 2:
            return trace
        one = trace_edits.serialized(trace)
        return one if self._crashes(one, "one connection") else trace

    def _fewer_images(self, trace: Trace) -> Trace:
        for i in range(len(trace)):
            j = 0
            while j < len(trace.image_hashes(i)):
                fewer = trace_edits.without_image(trace, i, j)
                if fewer is not None and self._crashes(fewer, f"request {i + 1} without image {j + 1}"):
                    trace = fewer
                else:
                    j += 1
        return trace

    def _smaller_images(self, trace: Trace) -> Trace:
        for h in list(trace.images):
            for side in SMALL_SIDES:
                if h not in trace.images:
                    break
                smaller = trace_edits.with_smaller_image(trace, h, side)
                if smaller is not None and self._crashes(smaller, f"image {h[:8]} at {side} px"):
                    trace = smaller
                    break
        return trace

    def _sooner_aborts(self, trace: Trace) -> Trace:
        for i in range(len(trace)):
            sooner = trace_edits.with_sooner_abort(trace, i, SOONEST_ABORT_MS)
            label = f"request {i + 1} hanging up after {SOONEST_ABORT_MS:g} ms"
            if sooner is not None and self._crashes(sooner, label):
                trace = sooner
        return trace

    # -- running candidates --------------------------------------------------------------------------------
    def _crashes(self, trace: Trace, label: str, repeats: int | None = None, fresh: bool = False) -> bool:
        """Whether ``trace`` crashes with the trial's signature in each of ``repeats`` runs. Runs already made
        (this session or one before it) count; ``fresh`` runs are counted apart from the search's (a
        confirmation), and kept too, so a finished search resumes without a start."""
        repeats = repeats or self.repeats
        script = self.script(trace)
        key = ("confirm:" if fresh else "") + hashlib.sha256(script.encode()).hexdigest()[:16]
        known = list(self.state["runs"].get(key, []))
        results = list(known)
        while len(results) < repeats and all(results):
            self.budget.take()
            outcome = self._run(script, label, len(trace), len(results) + 1, repeats)
            crashed = outcome.crashed and outcome.signature == self.signature
            results.append(crashed)
            if crashed:  # what the issue snippet shows: the statuses and log lines of a crash of this sequence
                self.state.setdefault("outcomes", {})[key.removeprefix("confirm:")] = {
                    "statuses": outcome.statuses,
                    "log_lines": outcome.log_lines,
                    "signature": outcome.signature,
                    "folder": str(outcome.folder),
                }
            self.state["runs"][key] = results
            self._save_state()
        verdict = all(results[:repeats])
        if len(results) == len(known) and known:
            self.progress(f"{label}: {len(trace)} request(s) -> {'crashes' if verdict else 'survives'} (known)")
        return verdict

    def _run(self, script: str, label: str, n: int, i: int, k: int) -> Outcome:
        self.runs += 1
        folder = self.out / "runs" / f"{self.runs:03d}"
        took = time.time()
        outcome = run_candidate(script, self.target, folder, self.sigs, self.settle, self.startup_timeout)
        what = f"crashed ({outcome.signature})" if outcome.crashed else "survived"
        if outcome.crashed and outcome.signature != self.signature:
            what += f", not the trial's {self.signature}"
        elapsed = time.time() - self.budget.t0
        self.progress(
            f"[{elapsed / 60:4.1f} min, start {self.budget.starts}/{self.budget.max_starts}] {label}: "
            f"{n} request(s), run {i}/{k}: {what} ({time.time() - took:.0f} s)"
        )
        return outcome

    def script(self, trace: Trace) -> str:
        """The reproducer of ``trace`` (the same text for the same trace: candidates are known by it)."""
        title = f"{len(trace)} request(s) that crashed a vLLM server ({self.signature})"
        about = f"Found by mmchaos minimize from {self.origin}.\nServer: {self.server_command()}"
        return repro_script.render(trace, repro_script.ScriptInfo(title, about))

    def server_command(self) -> str:
        """How the trial's server was started (secrets masked, as in its manifest)."""
        t = self.target
        if t.mode == "engine":
            # the base flags the server took (a model shorter than 4,096 positions has its own --max-model-len)
            base = engine_base_flags(t.model or str(paths.default_model_dir()))
            return shlex.join(["vllm", "serve", "MODEL", *base, *t.flags])
        return f"{t.command} {shlex.join(t.flags)}".strip()

    # -- state ---------------------------------------------------------------------------------------------
    def _load_state(self) -> dict:
        fresh = {"trial": self.origin, "signature": self.signature, "runs": {}}
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return fresh
        return state if state.get("trial") == fresh["trial"] and state.get("signature") == self.signature else fresh

    def _save_state(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.state_file, self.state)


def _engine_packages(target: Target) -> dict:
    """The package versions of an installed engine (its manifest), none for a command's server."""
    if target.mode != "engine" or not target.engine:
        return {}
    try:
        return dict(engines.engine(target.engine).manifest().get("packages") or {})
    except (OSError, ValueError, engines.EngineError):
        return {}


def _abort_sooner_first(guess: Trace) -> list[Trace]:
    """``guess`` with its aborts hanging up after SOONEST_ABORT_MS, then as recorded: a client that hangs up while
    the image is still being rendered poisons the cache every time, one that waits longer races the render (in the
    demo, a 40 ms abort then its image again crashed 0.30.0 in 3 of 4 fresh servers)."""
    sooner = guess
    for i in range(len(guess)):
        sooner = trace_edits.with_sooner_abort(sooner, i, SOONEST_ABORT_MS) or sooner
    return [sooner, guess] if sooner is not guess else [guess]


def _poisons(row: pd.Series) -> bool:
    """A request that can leave P0 ahead of P1: a post-render failure or an abort (or the probes' such steps)."""
    kind, case = row["kind"], row.get("case")
    if kind == HUNT_KIND:  # a hunt's request: it does not know the stage a 4xx failed at, so any 4xx may have
        status = row.get("status")
        return row.get("outcome") == schema.ABORTED or (status == status and status is not None and 400 <= status < 500)
    return kind in schema.POISON_KINDS or (kind == "probe" and case in schema.POISON_PROBE_STEPS)
