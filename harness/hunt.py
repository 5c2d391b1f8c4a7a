"""`mmchaos hunt`: a generative, stateful search against a real server for failures nobody listed.

A case is a Hypothesis rule-based state machine run: a few steps (requests to each pooling route the server's
/openapi.json lists, with bodies from its schema and images from a small pool with reuse; hang-ups at chosen
delays; operator actions when exposed), each checked by the oracles (hunt_oracles). Findings are deduplicated by
fingerprint; each distinct one is shrunk on fresh servers (hunt_shrink) to a confirmed reproducer.

Server state: a case starts on the server the last case left alive, with images salted per case, so none of its
images is in any cache (the state the drift needs is per image); a crash costs a fresh start. A case that asked for
an operator action may have changed the server for the next case; the next case's salt keeps its images new anyway.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from hypothesis import HealthCheck, Phase, errors, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from mmchaos import sameness
from mmchaos.files import write_json_atomic
from mmchaos.signatures import Signatures

from . import crash_watch, hunt_api, hunt_media, hunt_oracles, hunt_steps, hunt_triage
from .server import Server, ServerError, Target

HANG_UP_MS = (1, 2, 4, 8, 16, 40)
STEPS_PER_CASE = 6
SETTLE_S = 10.0  # a server answering a request with no answer or a 5xx gets this long to die (ends at its exit)


class HuntError(Exception):
    """One line: why the hunt cannot run."""


class Budget:
    def __init__(self, max_minutes: float, max_starts: int, max_requests: int):
        self.deadline = time.time() + max_minutes * 60
        self.max_starts, self.max_requests = max_starts, max_requests
        self.starts = self.requests = 0

    def spent(self) -> str | None:
        if time.time() >= self.deadline:
            return "max-minutes"
        if self.requests >= self.max_requests:
            return "max-requests"
        return None


class Stop(Exception):
    """The budget is spent (or the server cannot be restarted): the search ends."""


class Hunt:
    def __init__(self, target: Target, out: Path, budget: Budget, seed: int, say, sigs: Signatures,
                 start_timeout: float = 300.0, request_timeout: float = 60.0):
        self.target, self.out, self.budget, self.seed, self.say = target, out, budget, seed, say
        self.sigs, self.start_timeout, self.request_timeout = sigs, start_timeout, request_timeout
        self.server: Server | None = None
        self.watch: crash_watch.CrashWatch | None = None
        self.state = self._load_state()
        self.findings: dict[str, dict] = self.state.setdefault("findings", {})
        self.answers: dict[str, list] = {}  # input key -> first embedding, over the server's life
        self.by_image: dict[tuple, tuple] = {}  # (salt, slot, kind) -> (key, embedding) for the collapse check

    # -- server ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self.target.mode == "attach":
            if self.server is None:
                self.server = Server(self.target, self.out / "server.log")
                self.server.start()
            if not self.server.health(timeout=5)[0]:
                raise Stop("the attached server is down")
            return
        if self.budget.starts >= self.budget.max_starts:
            raise Stop("max-starts")
        self.budget.starts += 1
        self.state["starts"] = self.state.get("starts", 0) + 1
        self.server = Server(self.target, self.out / "server.log")
        self.server.start()
        self.say(f"starting server ({self.budget.starts}/{self.budget.max_starts})")
        try:
            self.server.wait_healthy(self.start_timeout)
        except ServerError:
            self.server.stop()
            raise
        self.watch = crash_watch.CrashWatch(self.server, self.out, self.sigs)
        self.answers, self.by_image = {}, {}

    def stop(self) -> None:
        if self.server is not None and self.target.mode != "attach":
            if self.watch:
                self.watch.finish()
            self.server.stop()
        self.server = None

    def headers(self) -> dict:
        key = self.server.api_key if self.server else None
        return {"Authorization": f"Bearer {key}"} if key else {}

    # -- the search ------------------------------------------------------------------------------------------
    def run(self) -> int:
        self.start()
        try:
            spec = hunt_api.fetch(self.server.base_url, self.headers())
            self.routes = hunt_api.routes(spec)
            self.operators = hunt_api.operator_routes(spec)
            if not self.routes:
                raise HuntError("the server's /openapi.json lists no pooling route the hunt can build a body for")
            self.model = self.server.model_name()
            self.say(f"routes: {', '.join(sorted({r.path + ' (' + r.form + ')' for r in self.routes}))}"
                     + (f"; operator actions: {', '.join(self.operators)}" if self.operators else ""))
            self._search()
        finally:
            self.stop()
            self._save_state()
        self.triage()
        return 1 if self.findings else 0

    def versions_line(self) -> str:
        t = self.target
        what = f"vLLM {t.engine}" if t.mode == "engine" else t.mode
        return what + (f" {' '.join(t.flags)}" if t.flags else " (defaults)")

    def triage(self) -> None:
        shrinker = hunt_triage.Shrinker(self.target, self.routes, self.model, self.sigs, self.out / "shrink",
                                        self._take_start, start_timeout=self.start_timeout, say=self.say)
        for fp, f in self.findings.items():
            if f.get("repro_steps") is not None:
                continue  # triaged by an earlier run
            steps = f["steps"][: f["at_step"] + 1]
            if f["oracle"] == "crash" and self.target.mode != "attach":
                self.say(f"shrinking {fp} ({len(steps)} steps)")
                steps, f["confirmed"] = shrinker.shrink(f)
            f["repro_steps"] = len(steps)
            f["repro"] = steps
            hunt_triage.write_finding(self.out / "findings" / fp, f, steps, self.routes, self.model,
                                      self.versions_line())
            self._save_state()
        hunt_triage.report(self.out, self.state, self.versions_line())
        self.say(f"{len(self.findings)} findings in {self.state['cases']} cases, {self.state['requests']} requests, "
                 f"{self.state['starts']} server starts: {self.out / 'findings.md'}")

    def _take_start(self) -> bool:
        if self.budget.starts >= self.budget.max_starts:
            return False
        self.budget.starts += 1
        self.state["starts"] = self.state.get("starts", 0) + 1
        return True

    def _search(self) -> None:
        hunt = self
        route_st = st.sampled_from(self.routes)
        params_of = {(r.path, r.form): hunt_api.params_strategy(r) for r in self.routes}

        class Case(RuleBasedStateMachine):
            def __init__(self):
                super().__init__()
                hunt.begin_case()

            @rule(route=route_st, slot=hunt_media.slots, kind=hunt_media.kinds, data=st.data())
            def send(self, route, slot, kind, data):
                params = data.draw(params_of[route.path, route.form], label="params")
                hunt.step({"op": "send", "route": route.path, "form": route.form, "slot": slot, "kind": kind,
                           "params": params})

            @rule(route=route_st, slot=hunt_media.slots, kind=hunt_media.kinds, delay=st.sampled_from(HANG_UP_MS))
            def hang_up(self, route, slot, kind, delay):
                hunt.step({"op": "hangup", "route": route.path, "form": route.form, "slot": slot, "kind": kind,
                           "params": {}, "delay_ms": delay})

            @precondition(lambda self: bool(hunt.operators))
            @rule(action=st.sampled_from(self.operators or ["-"]))
            def operator(self, action):
                hunt.step({"op": "operator", "route": action})

        db = DirectoryBasedExampleDatabase(str(self.out / "examples"))
        # no shrinking here: a case replayed on a server it may have changed proves nothing; distinct findings
        # are shrunk on fresh servers (hunt_shrink)
        s = settings(max_examples=10**6, stateful_step_count=STEPS_PER_CASE, database=db, deadline=None,
                     phases=(Phase.explicit, Phase.reuse, Phase.generate), derandomize=False,
                     suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
        # A case's draws depend on the server (a dead server ends a case early), which Hypothesis's data tree
        # calls flaky: the search then goes on with a new run of the machine.
        while True:
            try:
                run_state_machine_as_test(Case, settings=s)
            except Stop as e:
                self.say(f"search ended: {e}")
                return
            except (errors.FlakyStrategyDefinition, errors.FlakyReplay):
                continue

    def begin_case(self) -> None:
        why = self.budget.spent()
        if why:
            raise Stop(why)
        self.state["cases"] = self.state.get("cases", 0) + 1
        self.case = {"salt": self.seed * 1_000_003 + self.state["cases"], "steps": []}
        if self.server is None:
            self.start()

    def step(self, step: dict) -> None:
        if self.server is None:  # the case's server died at an earlier step: the rest of the case has no target
            return
        why = self.budget.spent()
        if why:
            raise Stop(why)
        self.case["steps"].append(step)
        self.budget.requests += 1
        self.state["requests"] = self.state.get("requests", 0) + 1
        route = next((r for r in self.routes if r.path == step["route"] and r.form == step.get("form")), None)
        salt = self.case["salt"]
        if step["op"] == "operator":
            answer = hunt_steps.send(self.server.base_url, self.headers(), step["route"], None, self.request_timeout)
        else:
            body = hunt_steps.build_body(step, route, self.model, salt)
            if step["op"] == "hangup":
                answer = hunt_steps.hang_up(self.server.base_url, self.headers(), step["route"], body,
                                            step["delay_ms"])
            else:
                answer = hunt_steps.send(self.server.base_url, self.headers(), step["route"], body,
                                         self.request_timeout)
        self._judge(step, route, answer, body if step["op"] != "operator" else None)

    # -- oracles ---------------------------------------------------------------------------------------------
    def _judge(self, step: dict, route, answer: hunt_steps.Answer, body) -> None:
        dying = step["op"] == "send" and (answer.status is None or answer.status >= 500)
        crash = self._check_crash(settle=SETTLE_S if dying else 0.0)
        self._log_findings(step)
        if crash is not None:
            self.record("crash", crash.chain or crash.signature, f"{crash.reason}: {crash.signature}", step)
            self.stop()
            return
        if answer.status is not None and answer.status >= 500 and step["op"] == "send":
            drift = self.sigs.drift_answer(answer.status, answer.text)
            if drift:
                self.record("drift", f"{answer.status} {drift}", answer.text[:200], step)
            else:
                self.record("5xx", str(answer.status), answer.text[:200], step)
        if answer.status == 200 and route is not None and step["op"] == "send":
            why = hunt_api.schema_error(route, answer.json)
            if why:
                self.record("schema", why.split(":")[0], why, step)
            self._same_answer(step, route, body, answer.json)

    def _check_crash(self, settle: float):
        if self.watch is None:
            return None
        end = time.time() + settle
        while True:
            crash = self.watch.check()
            if crash or time.time() >= end or self.server.exit_code() is not None:
                return crash
            time.sleep(0.2)  # the crash watcher's cadence: its exit, not the timer, ends a dying server's wait

    def _log_findings(self, step: dict) -> None:
        if self.watch is None:
            return
        lines = getattr(self, "_seen_lines", 0)
        matches = self.watch.matches
        for m in matches[lines:]:
            if m.signature.drift and not m.signature.fatal:
                self.record("drift", m.signature.name, m.line[:200], step)
        self._seen_lines = len(matches)
        text = self.server.log_path.read_text(errors="replace").splitlines()
        start = getattr(self, "_log_lines", 0)
        end = len(text)
        while end > start and hunt_oracles.continues(text[end - 1]):
            end -= 1  # a traceback still being written is read whole at the next step
        for name, process, first in hunt_oracles.unknown_signatures(text[start:end], self.sigs):
            self.record("unknown_signature", name, first, step, process=process)
        self._log_lines = end

    def _same_answer(self, step: dict, route, body: dict, answer) -> None:
        try:
            keys = sameness.input_keys(step["route"], body)
            vectors = sameness.vectors(answer, body)
        except (ValueError, KeyError, TypeError):
            return
        image = (self.case["salt"], step["slot"], step["kind"])
        for key, vec in zip(keys, vectors):
            first = self.answers.setdefault(key, list(vec))
            if first is not vec and not sameness.agree(first, vec):
                self.record("wrong_answer", "same input, another answer",
                            f"cosine {sameness.cosine(first, vec):.5f} < {sameness.COSINE_MIN}", step)
            for other, (okey, ovec) in self.by_image.items():
                if other != image and okey != key and other[0] == image[0] and sameness.collapsed(ovec, vec) \
                        and step["kind"] not in hunt_media.BROKEN:
                    self.record("wrong_answer", "distinct images, one embedding",
                                f"{other[2]}#{other[1]} and {step['kind']}#{step['slot']}", step)
            self.by_image.setdefault(image, (key, list(vec)))

    def record(self, oracle: str, signature: str, detail: str, step: dict, process: str = "") -> None:
        f = hunt_oracles.Finding(oracle, signature, detail, step.get("route", ""), process,
                                 list(self.case["steps"]), len(self.case["steps"]) - 1, self.case["salt"])
        fp = f.fingerprint
        seen = self.findings.get(fp)
        if seen:
            seen["count"] += 1
            return
        self.findings[fp] = {**asdict(f), "fingerprint": fp, "severity": f.severity, "count": 1,
                             "first_case": self.state["cases"], "first_t": time.time(),
                             "first_request": self.state["requests"],
                             "first_start": self.state.get("starts", 0)}
        self.say(f"finding {fp}: {oracle} {signature} (case {self.state['cases']}, "
                 f"request {self.state['requests']})")
        self._save_state()

    # -- state -----------------------------------------------------------------------------------------------
    def _load_state(self) -> dict:
        path = self.out / "hunt.json"
        if path.exists():
            return json.loads(path.read_text())
        return {"seed": self.seed, "cases": 0, "requests": 0, "starts": 0, "findings": {}}

    def _save_state(self) -> None:
        self.state["target"] = self.target.describe(self.server.redactor) if self.server else \
            self.state.get("target")
        write_json_atomic(self.out / "hunt.json", json.loads(json.dumps(self.state, default=str)))
