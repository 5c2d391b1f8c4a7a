"""`mmchaos hunt`: search for failures nobody listed, with requests generated from the server's own API.

The loop: start (or attach to) the target, read its /openapi.json, draw cases (:mod:`.cases`) with Hypothesis
from a seed, send each, and judge it by the oracles (:mod:`.oracles`); a crash restarts the server (a fresh
start: the state a case meets is a known one, and the cost is a start) while the other findings leave it up (its
cache then carries the earlier cases' images, as a production server's does). Each distinct finding is kept with
the case that found it; each crash is then shrunk by the minimizer on fresh servers to a confirmed reproducer.

Everything lives in the hunt's folder: ``state.json`` (seed, cases, requests, starts, minutes), ``cases.jsonl``
(every case sent and what it got), ``findings.json`` and ``findings/<n>/`` (the case, and for a crash the
minimizer's ``repro.py``, ``issue.md``, ``minimal.jsonl``), and the report. A re-run first sends again the case of
each finding already made (is it still there?), then searches on from where the last run stopped.
"""

from __future__ import annotations

import functools
import json
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import requests
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.errors import FlakyStrategyDefinition
from hypothesis.stateful import run_state_machine_as_test

from mmchaos.auth import auth_headers
from mmchaos.errors import MmchaosError
from mmchaos.files import write_json_atomic
from mmchaos.logtail import LogTail
from mmchaos.redact import Redactor
from mmchaos.signatures import Signatures

from ..servers import crash_watch, sigterm
from ..servers.server import Server, ServerError, Target
from . import api_schema, bodies, cases, corpus, lives, oracles, surface
from .coverage import EngineCoverage
from .findings import Finding
from .media import meant
from .reference import Reference
from .reproducers import HANG_PREFIX, Reproducers

TICK = 0.2  # seconds between observations of the server, as in a campaign
KNOWN_CRASH = 2  # times a crash is met before the search stops sending suspects (each meeting costs a restart)
SMALL_FIELD = 200  # characters of JSON: a request field kept to compare unanswered requests by
UNANSWERED_KEPT = 8  # the latest unanswered requests compared
SHRINK_RUNS = 7  # candidate runs kept for shrinking a crash (the minimizer's guesses, then its confirmation)


class HuntError(MmchaosError):
    """The hunt cannot run (one line; the command line says it and exits 2)."""


class MachineEnded(Exception):
    """Hypothesis ended a machine run as inconsistent (FlakyStrategyDefinition); the search goes on."""


class _Spent(BaseException):  # a BaseException: Hypothesis lets it through without replaying the case
    def __init__(self, why: str):
        self.why = why


@dataclass
class Budget:
    max_minutes: float
    max_starts: int
    max_requests: int
    max_cases: int

    def __post_init__(self) -> None:
        for name in ("max_minutes", "max_starts", "max_requests", "max_cases"):
            if getattr(self, name) <= 0:
                raise HuntError(f"--{name.replace('_', '-')} must be positive (got {getattr(self, name)})")


@dataclass
class Hunt(Reproducers):
    target: Target
    out: Path
    budget: Budget
    seed: int = 0
    settle: float = 1.0  # seconds the server is watched after a case (a dying server dies within ~1 s)
    request_timeout: float = 60.0
    startup_timeout: float = 420.0
    minimize: bool = True
    repeats: int = 2
    server_log: Path | None = None  # an attached server's log file: the log oracles read it
    reference: str | None = None  # --reference: a second server's flags or URL (harness/reference.py)
    versions: list[str] = field(default_factory=list)  # --versions: where each crash's reproducer is run again
    coverage: bool = True  # measure vLLM's lines in the engine's processes and search by them (coverage.py)
    mutate_share: float = corpus.MUTATE_SHARE  # of the cases: mutants of corpus cases (corpus.py)
    # --flags-axis: the flags of this hunt's set (the last of the target's): a crash is shrunk to the fewest of them
    axis_flags: list[str] = field(default_factory=list)
    say: Callable[[str], None] = print
    sigs: Signatures = field(default_factory=Signatures.load)

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        # what a re-run resumes from (state.json): counts, seconds, findings
        self.state: dict[str, Any] = {
            "seed": self.seed,
            "cases": 0,
            "requests": 0,
            "starts": 0,
            "seconds": 0.0,
            "findings": [],
        }
        if (self.out / "state.json").exists():
            self.state = json.loads((self.out / "state.json").read_text())
        self.findings = {f["fingerprint"]: Finding.from_row(f) for f in self.state["findings"]}
        self.server: Server | None = None
        self.unanswered_at: float | None = None  # when the first request this server left unanswered was sent
        self.client: cases.Client | None = None
        self.hooks: cases.Hooks | None = None
        self.crash: crash_watch.Crash | None = None  # a crash seen during a case's steps
        self.ref: Reference | None = None
        # what findings, reports and reproducers say of the target and of --reference/--versions: keys masked
        self.redactor = Redactor.from_environment(self.target.secrets())
        self.t0 = time.time()
        self.seconds_before = float(self.state["seconds"])
        self.corpus = corpus.Corpus(self.state)
        self.surface = surface.Surface(swept=int((self.state.get("surface") or {}).get("swept", 0)))  # a re-run resumes
        self.state.setdefault("mutants", 0)
        self.state.setdefault("unanswered", [])  # small fields of the requests left unanswered (_unanswered)
        self.state.setdefault("first_steps", [])
        self._first_steps = set(self.state["first_steps"])
        self.cov: EngineCoverage | None = None
        self.blind = ""  # why the search has no coverage (said in the report); empty: it has
        if not self.coverage:
            self.blind = "coverage off (--no-coverage)"
        elif self.target.mode != "engine":
            self.blind = (
                "the target is not an engine mmchaos installed (--engine): its processes do not measure coverage"
            )
        else:
            self.cov = EngineCoverage(self.out / "coverage")
            self.cov.seen = self.cov.lines()  # a re-run: what earlier runs reached is not new
            self.cov.curve = [tuple(x) for x in self.state.get("coverage", {}).get("curve", [])]
        self.pids: list[int] = []

    # -- the run -------------------------------------------------------------------------------------------
    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        error: Exception | None = None
        try:
            self._start()
            if self.blind:
                self.say(f"hunt: searching blind: {self.blind}")
            if self.reference:
                self._start_reference()
            api, operators = self._api()
            self.say(
                f"hunt: {len(api)} pooling route(s) from /openapi.json ({', '.join(api)}); operator actions: "
                f"{', '.join(operators) or 'none (VLLM_SERVER_DEV_MODE=1 exposes them)'}"
            )
            skipped: set[str] = set()
            schemas = [(path, f) for path, route in sorted(api.items()) for f in api_schema.variants(route.request)]
            forms = [(path, bodies.form(f, self.model, functools.partial(_skip, skipped, path))) for path, f in schemas]
            if not forms:
                raise HuntError("the target's pooling routes list no JSON object body the hunt can build")
            if skipped:
                self.say(f"hunt: fields the schema library cannot draw from, left out: {', '.join(sorted(skipped))}")
            self.state["skipped_fields"] = sorted(skipped)
            self.surface.points = surface.points(schemas, self.model)
            self.say(f"hunt: the API's surface: {len(self.surface.points)} point(s), {self.surface.swept} swept before")
            self._replay_findings(api)
            try:
                self._search(forms, operators, api)
                why = "the case budget"
            except Exception as e:  # an error of the hunt's own: shown whole, and what was found still kept,
                # shrunk and reported before the command fails with it
                error, why = e, f"an error of its own ({type(e).__name__})"
                self.say("".join(traceback.format_exception(e)).rstrip())
        except _Spent as e:
            why = e.why
        finally:
            if self.server is not None:
                self.watch.finish()
                self.server.stop()
            if self.ref is not None:
                self.ref.stop()
            self._save()
        self.say(
            f"hunt: stopped after {why}: {self.state['cases']} case(s), {self.state['requests']} request(s), "
            f"{self.state['starts']} server start(s), {self._minutes():.1f} min; "
            f"{len(self.findings)} distinct finding(s)"
        )
        if self.minimize:
            self._minimize_crashes()
            self._fewest_flags()
            self._affected_versions()
            self._confirm_hangs()
        from .report import write as write_report

        files = write_report(self)
        self.say(f"hunt: report {files['md']}")
        if error is not None:
            raise HuntError(
                f"the search ended on an error of the hunt's own ({type(error).__name__}: {error}), its traceback "
                f"above; what it found is in {files['md']}"
            )
        return 1 if self.findings else 0

    def _search(self, forms, operators, api) -> None:
        """Run the case machine until the budget is spent. A crash during a case ends the machine's run (the server
        is restarted); the next run searches on from another seed."""
        assert self.client is not None
        hooks = cases.Hooks(
            self.client,
            self.life,
            self._after_step,
            lambda c, s: self._end_case(c, s, api),
            lambda: self._begin_case(api),
            self._vary,
            self.state.setdefault("media_drawn", {}),
            self._weighed,
            self.surface,
        )
        self.hooks = hooks
        while True:
            self._check_budget()
            machine = seed(self.state["seed"] + self.state["cases"])(cases.machine(forms, operators, hooks))
            try:
                run_cases(machine, max(1, self.budget.max_cases - self.state["cases"]))
            except cases.CaseOver:
                continue
            except MachineEnded:
                self.state["machine_runs_ended"] = self.state.get("machine_runs_ended", 0) + 1
                self.say("hunt: Hypothesis ended a machine run as inconsistent; the search goes on from the next seed")

    def _replay_findings(self, api) -> None:
        for f in list(self.findings.values()):
            folder = self.out / "findings" / str(f.first_case)
            if (folder / "case.json").exists() and f.oracle != "crash":  # a crash's case is re-run by its repro
                self._check_budget()
                self.say(f"hunt: sending again the case of finding {f.first_case} ({f.title})")
                case = cases.Case.from_json((folder / "case.json").read_text())
                assert self.client is not None
                self._end_case(case, cases.replay(case, self.client), api, "replay")

    # -- one case ------------------------------------------------------------------------------------------
    def _weighed(self, where: list) -> list:
        """The routes as the corpus weighs them, turned by the cases sent so far: Hypothesis's early examples draw
        the smallest choices, which picked the same route first in case after case."""
        w = self.corpus.weighted(where)
        k = self.state["cases"] % len(w) if w else 0
        return w[k:] + w[:k]

    def _begin_case(self, api) -> None:
        """Before the machine draws a case: the budget, and a mutant of a corpus case while mutants are below their
        share of the cases sent."""
        self._check_budget()
        while self.state["corpus"] and self.state["mutants"] < self.mutate_share * (self.state["cases"] + 1):
            self._send_mutant(api)
            self._check_budget()

    def _send_mutant(self, api) -> None:
        rng = random.Random(f"{self.state['seed']}:{self.state['cases']}")
        parents = self.corpus.parents(self.life.avoid_suspects)
        for _ in range(8 if parents else 0):  # a mutant nothing sent before: a few tries
            pair = rng.choices(parents, k=2)
            a, b = (cases.Case.from_json(self._corpus_case(n)) for n in pair)
            case, how = corpus.mutate(a, b, rng)
            case = cases.Case(cases.without_suspects(self._spare(case.steps), self.life))
            if self.corpus.novel(case):
                break
        else:
            self.state["mutants"] += 1  # counted as sent: the share is kept even when nothing new was made
            return
        self.state["mutants"] += 1
        assert self.client is not None
        if self._end_case(case, cases.replay(case, self.client), api, f"mutant ({how})") is not None:
            self.corpus.retire(*pair)

    def _corpus_case(self, n: int) -> str:
        return (self.out / "corpus" / f"{n}.json").read_text()

    def _vary(self, steps: list[cases.Step], earlier: list[cases.Step]) -> list[cases.Step]:
        """Requests as sent (:meth:`_varied`), without the fields every unanswered request shared, and once a crash
        is known without suspects (cases.without_suspects)."""
        return cases.without_suspects(self._spare(self._varied(steps, earlier)), self.life)

    def _varied(self, steps: list[cases.Step], earlier: list[cases.Step]) -> list[cases.Step]:
        """Requests as drawn, unless they would begin a case as one began before (each machine run's first
        example is Hypothesis's simplest, the same after every restart), repeat a request this case already sent
        ``cases.SAME_MAX`` times, or make the case begin, from its ``cases.WALKED_FROM``-th step, with the shape
        another case began with (Hypothesis's generator draws many cases of one rule, and copies a drawn case into
        the next ones: a third of its cases were of one rule, eight identical hang-ups in one); then a variation of
        them (corpus.mutate)."""
        rng = random.Random(f"{self.state['seed']}:{self.state['cases']}:{len(earlier)}")
        if not earlier:
            case = cases.Case(steps)
            for _ in range(8):
                key = corpus.case_hash(cases.Case(case.steps[:1]))
                if key not in self._first_steps:
                    self._first_steps.add(key)
                    self.state["first_steps"].append(key)
                    return case.steps
                case, _how = corpus.mutate(cases.Case(steps), cases.Case(steps), rng)
            return steps
        sent = [_request_key(s) for s in earlier]

        def stale(these: list[cases.Step]) -> bool:
            """The very same request a SAME_MAX-th time, or a case walking where others walked."""
            if any(sent.count(_request_key(s)) >= cases.SAME_MAX for s in these):
                return True
            return len(earlier) + len(these) >= cases.WALKED_FROM and self.corpus.walked([*earlier, *these]) > 0

        if not stale(steps):
            return steps
        for _ in range(8):
            case, _how = corpus.mutate(cases.Case(steps), cases.Case(earlier[-3:]), rng)
            # one after the other, as a varied request is sent (cases.machine sends a list of several together)
            varied = [replace(s, together=None) for s in case.steps][:1] if len(steps) == 1 else case.steps
            if not stale(varied):
                return varied
        return steps

    def _unanswered(self, body: dict, n: int) -> None:
        """Keep what a request the server left unanswered carried (its small fields); once KNOWN_CRASH were, the
        fields they all shared are left out of every request from then on (:meth:`_spare`): each costs the client's
        whole timeout, and the server's worker keeps computing it (minutes, measured)."""
        small = {k: v for k, v in body.items() if len(json.dumps(v)) <= SMALL_FIELD}
        kept = self.state["unanswered"] = [*self.state["unanswered"], small][-UNANSWERED_KEPT:]
        shared = oracles.shared_fields(kept) if len(kept) >= KNOWN_CRASH else {}
        if shared and self.state.get("spared", {}).get("fields") != shared:
            self.state["spared"] = {"case": n, "fields": shared, "of": len(kept)}

    def _spare_point(self, sets: dict, n: int) -> None:
        """A point of the surface that set one field on the simplest body went unanswered: that field is the cause,
        and is left out of every request from then on, without waiting for a second request to cost its wait."""
        points = self.state.setdefault("spared_points", {"case": n, "fields": {}})
        if any(points["fields"].get(k) != v for k, v in sets.items()):
            points["fields"].update(sets)

    def _spare(self, steps: list[cases.Step]) -> list[cases.Step]:
        fields = {
            **self.state.get("spared", {}).get("fields", {}),
            **self.state.get("spared_points", {}).get("fields", {}),
        }
        if not fields:
            return steps
        return [
            replace(s, body={k: v for k, v in s.body.items() if not (k in fields and fields[k] == v)})
            if s.body is not None and any(k in s.body and s.body[k] == v for k, v in fields.items())
            else s
            for s in steps
        ]

    def _after_step(self, sent: cases.Sent) -> None:
        """After each step: a request the server did not answer, or answered 5xx, may mean it died; then the case
        ends here (its other steps would meet a dead server)."""
        if sent.status is None or sent.status >= 500:
            crash = self.watch.check()
            if crash is not None:
                self.crash = crash
                raise cases.CaseOver

    def _end_case(self, case: cases.Case, sent: list[cases.Sent], api, why: str = "search") -> crash_watch.Crash | None:
        """Judge a case that was sent, keep what it found, and restart the server it crashed (returned)."""
        assert self.server is not None
        n = self.state["cases"] = self.state["cases"] + 1
        self.state["requests"] += len(case.steps)
        self.cases_of_life.append((case, sent))
        crash = self.crash or self._settle()
        self.crash = None
        for step, s in sorted(zip(case.steps, sent), key=lambda x: x[1].t):
            if not s.timed_out:
                continue
            # a hang is judged on the first request this server left unanswered only (later ones may wait behind
            # it); every one cost the client's timeout, so each counts toward the fields spared
            s.behind = self.unanswered_at is not None
            self.unanswered_at = s.t if self.unanswered_at is None else self.unanswered_at
            if step.body is not None:
                self._unanswered(step.body, n)
            if step.swept and len(step.swept) == 1 and not s.behind:
                self._spare_point(step.swept, n)
        lines = self.tail.new_lines()
        found = self._judge(case, sent, crash, lines, api)
        repeat = not self.corpus.sent(case)
        new_lines = self.cov.new_lines(n, self.pids) if self.cov is not None else None
        # the corpus keeps a case without its points of the surface: each is sent once, and a mutant that sent them
        # again (24 requests a sweep) learnt nothing from them
        kept = [(step, s.status) for step, s in zip(case.steps, sent) if not step.swept]
        searched = cases.Case([step for step, _ in kept])
        joins = bool(kept) and self.corpus.consider(
            n,
            searched,
            [status for _, status in kept],
            new_lines,
            any(x.fingerprint not in self.findings for x in found),
        )
        if crash is not None:
            self.corpus.retire(n)
        if joins:
            (self.out / "corpus").mkdir(exist_ok=True)
            (self.out / "corpus" / f"{n}.json").write_text(searched.to_json())
        with open(self.out / "cases.jsonl", "a") as f:
            f.write(
                json.dumps(
                    {
                        "case": n,
                        "why": why,
                        "seconds": round(self.seconds_before + time.time() - self.t0, 1),  # since the hunt began
                        "start": self.state["starts"],  # the server start it was sent to
                        "steps": json.loads(case.to_json()),
                        "statuses": [s.status for s in sent],
                        "ms": [round(s.ms) for s in sent],
                        "answers": [s.text[:160] for s in sent],
                        "findings": [x.fingerprint for x in found],
                        "crash": crash.chain if crash else None,
                        "shape": corpus.shape(case),
                        "repeat": repeat,
                        "new_lines": new_lines,
                        "corpus": joins,
                    },
                    separators=(",", ":"),
                )
                + "\n"
            )
        new = [x for x in found if x.fingerprint not in self.findings]
        for x in found:
            if x.fingerprint in self.findings:
                old = self.findings[x.fingerprint]
                old.count += 1
                old.cases.append(n)
                folder = self.out / "findings" / str(old.first_case)
            else:
                x.first_case, x.cases = n, [n]
                self.findings[x.fingerprint] = x
                folder = self.out / "findings" / str(n)
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "case.json").write_text(case.to_json())
                (folder / "answers.json").write_text(json.dumps(lives.answers(sent)))
                if x.oracle == "server_error" and x.step is not None and crash is None:
                    self._answer_repro(x, case, sent, folder)
                elif x.oracle == "hang" or (x.oracle in ("wrong_answer", "unknown_signature") and crash is None):
                    self._case_repro(x, case, sent, folder, run=crash is None)
            if x.oracle in ("crash", "hang"):  # the poison may have come in an earlier case of the server's life
                life = [{"steps": json.loads(c.to_json()), "answers": lives.answers(a)} for c, a in self.cases_of_life]
                (folder / "lives").mkdir(parents=True, exist_ok=True)
                (folder / "lives" / f"{n}.json").write_text(json.dumps(life))
        statuses = ",".join("-" if s.status is None else str(s.status) for s in sent)
        mark = f"; NEW: {'; '.join(x.title for x in new)}" if new else ""
        lines_said = f", +{new_lines} vLLM lines" if new_lines else ""
        self.say(f"  case {n} ({why}): {len(case.steps)} request(s) [{statuses}]{lines_said}{mark}")
        self._save()
        sigterm.check()  # a stop asked mid-case, its KeyboardInterrupt lost in a callback: the case is kept first
        if crash is not None:
            self._restart()
        return crash

    def _settle(self):
        end = time.time() + self.settle
        while time.time() < end:
            crash = self.watch.check()
            if crash is not None:
                return crash
            time.sleep(TICK)  # observation period, as the campaign runner's
        return None

    def _judge(self, case, sent, crash, lines, api) -> list[Finding]:
        out: dict[str, Finding] = {}

        flags = self.redactor.argv(self.target.flags)

        def add(oracle: str, fp: str, title: str, detail: str = "", step: int | None = None, **typed) -> None:
            out.setdefault(fp, Finding(oracle, fp, title, detail, step=step, flags=flags, **typed))

        if crash is not None:
            oracle = "hang" if crash.reason == crash_watch.HANG else "crash"
            add(
                oracle,
                f"{oracle}|{crash.chain or crash.signature}",
                f"the server died: {crash.chain}",
                f"reason {crash.reason}, exit code {crash.exit_code}",
                chain=crash.chain or crash.signature,
            )
        for m in self.sigs.scan("\n".join(lines)):
            if m.signature.drift:
                process = oracles.process_of(m.line)
                if process == oracles.UNKNOWN_PROCESS:  # a line whose prefix two processes' output garbled
                    known = [f for f in [*self.findings, *out] if f.startswith("drift|log|")]
                    known = [f for f in known if f.endswith(f"|{m.signature.name}")]
                    process = known[0].split("|")[2] if known else process
                add(
                    "drift",
                    f"drift|log|{process}|{m.signature.name}",
                    f"cache drift logged ({m.signature.name}, {process})",
                    m.line[:300],
                    process=process,
                )
        for e in oracles.log_errors(lines, self.sigs):
            add(
                "unknown_signature",
                e.fingerprint,
                e.title,
                "\n".join(e.lines[-12:])[:2000],
                exception=e.exception,
                process=e.process,
                frames=e.frames[-oracles.FRAMES_KEPT :],
            )
        for k, (step, s) in enumerate(zip(case.steps, sent)):
            got = oracles.status_finding(step.path, s.status, s.text, self.sigs)
            if got and crash is not None and got[0] == "server_error":
                continue  # the answer of a dying server: the crash is the finding
            if got:
                add(*got, s.text[:300], step=k, route=step.path, status=s.status)
            if s.timed_out and not s.behind and crash is None:
                add(
                    "hang",
                    f"{HANG_PREFIX}{step.path}",
                    f"no answer from {step.path} in {s.ms / 1000:.0f} s while /health answered 200",
                    s.text,
                    step=k,
                    route=step.path,
                )
            if s.status == 200 and step.body is not None and isinstance(s.answer, dict):
                route = api.get(step.path)
                why = oracles.bad_response(s.answer, route.response if route else None)
                if why:
                    add(
                        "bad_response",
                        f"bad_response|{step.path}|{why.split(':')[0]}",
                        f"a 200 from {step.path} does not match its response schema",
                        why,
                        route=step.path,
                    )
                body = meant(step.body, self.life.seen)
                for wrong in self.answers.check(step.path, body, s.answer):
                    add("wrong_answer", f"wrong_answer|{wrong.split(' on ')[0]}", wrong, step=k, route=step.path)
                for wrong in self.ref.disagreements(step.path, body, s.answer) if self.ref else []:
                    fp = f"wrong_answer|the reference answered otherwise|{step.path}"
                    add("wrong_answer", fp, wrong, step=k, route=step.path)
        return list(out.values())

    # -- the server ----------------------------------------------------------------------------------------
    def _start(self) -> None:
        if self.target.mode != "attach":
            self._take_start()
        log = self.out / "servers" / f"server-{self.state['starts']}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        if self.target.mode == "attach" and self.server_log is not None:
            log = Path(self.server_log)
        target = self.target if self.cov is None else replace(self.target, env={**self.target.env, **self.cov.env()})
        self.server = Server(target, log)
        try:
            self.server.start()
            self.server.wait_healthy(self.startup_timeout)
        except ServerError:
            self.server.stop()
            self.server = None
            raise
        self._measure()
        self.watch = crash_watch.CrashWatch(self.server, self.out / "servers" / str(self.state["starts"]), self.sigs)
        self.watch.healthy_at(self.server.healthy_at)
        self.tail = LogTail(log)
        if self.target.mode == "attach":
            self.watch.skip_existing()
            self.tail.skip_to_end()
        self.model = self.server.model_name()
        self.answers = oracles.Answers()
        self.cases_of_life: list[tuple[cases.Case, list[cases.Sent]]] = []  # the cases this server was sent
        self.unanswered_at = None  # a new server has left no request unanswered
        self.crash = None
        # a second meeting gives the minimizer a second life to shrink; without shrinking, one is enough to know it
        met = KNOWN_CRASH if self.minimize else 1
        known = [f for f in self.findings.values() if f.oracle == "crash" and f.count >= met]
        self.life = cases.Life(avoid_suspects=bool(known))
        if known and "suspects_avoided_from" not in self.state:
            # said in the report: from here on the search reuses only images the server answered
            self.state["suspects_avoided_from"] = {"case": self.state["cases"], "crash": known[0].title}
        if self.client is not None:
            self.client.close()
        headers = auth_headers(self.server.api_key) if self.server.api_key else {}
        self.client = cases.Client(self.server.base_url, headers, self.request_timeout, self.life)
        if self.hooks is not None:  # the machine sends to the new server from its next step
            self.hooks.client, self.hooks.life = self.client, self.life

    def _measure(self) -> None:
        """The new server's processes, whose coverage each case reads; a server none of whose processes answer
        leaves the hunt searching blind (said once)."""
        assert self.server is not None
        if self.cov is None:
            return
        self.pids = [i.pid for i in self.server.processes().values()]
        if self.cov.started(self.pids):
            return
        why = self.cov.unavailable() or "no process of the server answered for its coverage"
        self.blind = f"{why} (mmchaos engine install {self.target.engine} installs coverage.py into the engine)"
        self.cov = None

    def _start_reference(self) -> None:
        assert self.reference
        if not self.reference.startswith(("http://", "https://")):
            self.state["starts"] += 1  # a server of ours: a start of the budget
        log = self.out / "servers" / f"reference-{self.state['starts']}.log"
        try:
            self.ref = Reference.start(
                self.reference, self.target, log, self.startup_timeout, self.shown(self.reference)
            )
        except ServerError as e:
            raise HuntError(f"the reference server ({self.shown(self.reference)}) did not start: {e}") from e
        self.say(f"hunt: reference {self.ref.spec} at {self.ref.server.base_url}: its answers are compared")

    def _restart(self) -> None:
        assert self.server is not None
        self.watch.finish()
        self.server.stop()
        self.server = None
        if self.target.mode == "attach":
            raise _Spent("the attached server died (mmchaos cannot restart a server it did not start)")
        self._check_budget()
        self._start_again()

    def _start_again(self) -> None:
        # a start may fail for a reason of the moment (a port another process took between our pick and vLLM's
        # bind): one more try, then the search ends and what it found is still shrunk and reported
        for attempt in (1, 2):
            try:
                self._start()
                return
            except ServerError as e:
                self.say(f"hunt: the server did not start again (try {attempt} of 2): {e}")
                if attempt == 2:
                    raise _Spent(f"a server that did not start again ({e})") from e

    def _take_start(self) -> None:
        # once a crash is found, starts are kept for shrinking it: a few guesses and a confirmation, each run
        # `repeats` times, and one more
        crashed = any(f.oracle == "crash" for f in self.findings.values())
        reserve = SHRINK_RUNS * self.repeats + 1 if self.minimize and crashed and self.target.mode != "attach" else 0
        if self.state["starts"] >= self.budget.max_starts - reserve:
            why = f" ({reserve} kept for shrinking the crash)" if reserve else ""
            raise _Spent(f"{self.budget.max_starts} server start(s){why}")
        self.state["starts"] += 1

    def _api(self) -> tuple[dict[str, api_schema.Route], list[str]]:
        assert self.server is not None
        try:
            r = requests.get(
                self.server.base_url + "/openapi.json",
                timeout=30,
                headers=auth_headers(self.server.api_key) if self.server.api_key else {},
            )
            r.raise_for_status()
            doc = r.json()
        except (requests.RequestException, ValueError) as e:
            raise HuntError(
                f"the target serves no readable /openapi.json ({type(e).__name__}): the hunt builds its "
                "requests from it"
            ) from e
        try:
            api = api_schema.routes(doc)
        except api_schema.ApiSchemaError as e:
            raise HuntError(str(e)) from e
        if not api:
            raise HuntError(
                "the target's /openapi.json lists no pooling route (/v1/embeddings, /pooling, /score, "
                "...): nothing to hunt on"
            )
        return api, api_schema.operator_routes(doc)

    # -- budget and state ------------------------------------------------------------------------------------
    def _minutes(self) -> float:
        return (self.seconds_before + time.time() - self.t0) / 60

    def _check_budget(self) -> None:
        if self._minutes() >= self.budget.max_minutes:
            raise _Spent(f"{self.budget.max_minutes:g} minute(s)")
        if self.state["requests"] >= self.budget.max_requests:
            raise _Spent(f"{self.budget.max_requests} request(s)")
        if self.state["cases"] >= self.budget.max_cases:
            raise _Spent(f"{self.budget.max_cases} case(s)")

    def _save(self) -> None:
        self.state["seconds"] = self.seconds_before + time.time() - self.t0
        self.state["findings"] = [f.row() for f in self.findings.values()]
        self.state["blind"] = self.blind
        self.state["surface"] = {"points": len(self.surface.points), "swept": self.surface.swept}
        if self.cov is not None:
            self.state["coverage"] = {
                "areas": self.cov.by_area(),
                "curve": self.cov.curve,
            }
        write_json_atomic(self.out / "state.json", self.state)


def run_cases(machine: type, max_examples: int) -> None:
    """Run the case machine; what we raised to end it (a spent budget, a dead server) comes out as itself. Hypothesis
    checks, as an example ends, that the same choices drew alike: an example we cut short where an earlier one drew
    on (a budget spent as a case begins) is one it calls flaky, raising FlakyStrategyDefinition with ours as its
    context, which must not end the hunt in a traceback."""
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=max_examples,
                stateful_step_count=cases.MAX_STEPS,
                database=None,
                deadline=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            ),
        )
    except FlakyStrategyDefinition as e:
        ours: BaseException | None = e
        while ours is not None and not isinstance(ours, (_Spent, cases.CaseOver)):
            ours = ours.__context__
        if ours is None:
            # the case was sent and judged; what Hypothesis found inconsistent is its own record of the choices,
            # which the server's state (a death, a variation) makes differ: this machine run ends, the search goes
            # on from the next seed
            raise MachineEnded from e
        raise ours from None


def _request_key(step: cases.Step) -> str:
    """A request as the server sees it (its session and its place in a group aside)."""
    return corpus.case_hash(cases.Case([replace(step, session=0, together=None)]))


def _skip(skipped: set[str], path: str, name: str) -> None:
    skipped.add(f"{path} {name}")
