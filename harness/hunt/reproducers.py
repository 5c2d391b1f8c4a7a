"""The hunt's findings made reproducible, once the search ends: each crash shrunk by the minimizer on fresh servers
from the lives it ended (then to the fewest of the axis's flags), a one-request or one-case ``repro.py`` for every
other oracle class, hangs confirmed alone on a fresh server, and each reproducer run on ``--versions``.

A mixin of :class:`.search.Hunt`: it works on the hunt's state, findings, target and budget, which the hunt owns.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from mmchaos.payloads.pool import content_hash
from mmchaos.payloads.traces import Trace
from mmchaos.redact import Redactor
from mmchaos.signatures import Signatures

from ..minimize import repro_script
from ..servers.server import Server, ServerError, Target
from . import cases, flag_draw, lives, oracles, versions
from .findings import Finding
from .reference import Reference
from .versions import Affected

HANG_PREFIX = "hang|no answer|"  # a request hang's fingerprint, its route after it
ONE_STEP_TRIES = 6  # steps of a case tried alone for an unknown log line's reproducer


class Reproducers:
    # what the hunt (search.Hunt) holds, which these methods use
    target: Target
    out: Path
    budget: Any
    repeats: int
    startup_timeout: float
    versions: list[str]
    axis_flags: list[str]
    say: Callable[[str], None]
    sigs: Signatures
    state: dict[str, Any]
    findings: dict[str, Finding]
    redactor: Redactor
    request_timeout: float
    server: Server | None
    ref: Reference | None

    def _save(self) -> None:
        raise NotImplementedError

    def _minutes(self) -> float:
        raise NotImplementedError

    # -- shrinking -----------------------------------------------------------------------------------------
    def _minimize_crashes(self) -> None:
        for f in self.findings.values():
            if f.oracle != "crash" or self.target.mode == "attach":
                continue
            folder = self.out / "findings" / str(f.first_case)
            if (folder / "minimized" / "repro.py").exists():
                continue
            self.say(f"hunt: shrinking finding {f.first_case} ({f.title}) on fresh servers, {self.repeats} run(s) each")
            # the lives the crash ended, shortest first, until one shrinks to a confirmed reproducer: a crash of a
            # hang-up's race may not come again on a fresh server, and a short life costs few starts to find out
            done: tuple[Path, Any] | None = None
            for case_n, life in lives.lives(folder):
                if self.budget.max_starts - self.state["starts"] <= 0:
                    self.say(f"hunt: finding {f.first_case}: no server start left in the budget to shrink it")
                    break
                result = self._shrink(f, life, folder / "lives" / f"{case_n}.shrink")
                if result is not None and (done is None or _rank(result[1]) > _rank(done[1])):
                    done = result
                if done is not None and done[1].confirmed:
                    break
            if done is None:
                continue
            shutil.copytree(done[0], folder / "minimized", dirs_exist_ok=True)
            result = done[1]
            f.reproducer, f.confirmed = str((folder / "minimized" / "repro.py").relative_to(self.out)), result.confirmed
            f.detail = (
                f"{f.detail}\nshrunk to {len(result.trace)} request(s), "
                f"{'confirmed' if result.confirmed else result.note}"
            ).strip()
            self._save()

    def _answer_repro(self, f: Finding, case: cases.Case, sent: list[cases.Sent], folder: Path) -> None:
        """A 5xx's reproducer: the one request that got it, as a standalone script (repro_script.py, expecting a
        5xx), run at once against the server that answered it."""
        assert f.step is not None and self.server is not None
        trace, _ = lives.trace_of(lives.alone(case, sent, f.step, plain=True))
        about = f"Found by mmchaos hunt (case {f.first_case}, step {f.step + 1}) on {self._found_on()}."
        script = folder / _repro_name(f)
        script.write_text(
            repro_script.render(trace, repro_script.ScriptInfo(f.title, about, repro_script.SERVER_ERROR))
        )
        p = subprocess.run(
            [sys.executable, str(script), "--url", self.server.base_url, "--settle", "0", "--json"],
            capture_output=True,
            text=True,
            timeout=self.request_timeout + 30,
            env={**os.environ, **({"VLLM_API_KEY": self.server.api_key} if self.server.api_key else {})},
        )
        self.state["requests"] += 1
        f.reproducer, f.confirmed = str(script.relative_to(self.out)), _reproduced(p)
        said = "confirmed on the server that answered it" if f.confirmed else "not reproduced when sent again"
        f.detail = f"{f.detail}\nreproducer: {script} ({said})".strip()

    def _case_repro(self, f: Finding, case: cases.Case, sent: list[cases.Sent], folder: Path, run: bool) -> None:
        """The reproducer of a wrong answer (its request sent twice, or to the reference too: the answers compared),
        an unknown log line (the case sent again, the server's log read) or a hang (the case sent again, a request
        that gets no answer while /health is 200); run at once against the server that gave it, where it is still
        up (``run``)."""
        assert self.server is not None
        args = ["--settle", "0"]
        if f.oracle == "wrong_answer" and f.step is not None:
            again = lives.alone(case, sent, f.step, plain=True)
            by_ref = self.ref is not None and "reference" in f.fingerprint
            trace, _ = lives.trace_of(again if by_ref else again * 2)
            info = repro_script.ScriptInfo(f.title, "", repro_script.WRONG, compare=() if by_ref else ((1, 2),))
            if by_ref:
                assert self.ref is not None
                args += ["--reference", self.ref.server.base_url]
        elif f.oracle == "unknown_signature":
            needle = oracles.log_needle(f.exception, (f.detail.splitlines() or [f.title])[0])
            info = repro_script.ScriptInfo(f.title, "", repro_script.LOG, log_needle=needle)
            args += ["--log", str(self.server.log_path)]
            trace, _ = lives.trace_of([(case, sent)])
            if run:
                trace = self._one_step_that_logs(f, case, sent, replace(info, about="(a try)"), args, folder) or trace
        else:
            # a request left unanswered: it alone
            trace, _ = lives.trace_of(lives.alone(case, sent, f.step) if f.step is not None else [(case, sent)])
            info = repro_script.ScriptInfo(f.title, "", repro_script.HANG)
            # a fresh server is the reproducer's to try: the one that hung was restarted, or still computes it
            run = False
        about = f"Found by mmchaos hunt (case {f.first_case}) on {self._found_on()}."
        script = folder / _repro_name(f)
        script.write_text(repro_script.render(trace, replace(info, about=about)))
        f.reproducer = str(script.relative_to(self.out))
        if not run:
            return
        p = subprocess.run(
            [sys.executable, str(script), "--url", self.server.base_url, *args, "--json"],
            capture_output=True,
            text=True,
            timeout=self.request_timeout * 2 + 60,
            env={**os.environ, **({"VLLM_API_KEY": self.server.api_key} if self.server.api_key else {})},
        )
        self.state["requests"] += len(trace)
        f.confirmed = _reproduced(p)
        said = "confirmed on the server that gave it" if f.confirmed else "not reproduced when sent again"
        f.detail = f"{f.detail}\nreproducer: {script} ({said})".strip()

    def _one_step_that_logs(
        self, f: Finding, case: cases.Case, sent: list[cases.Sent], info, args: list[str], folder: Path
    ) -> Trace | None:
        """The first step of ``case`` that alone makes the server log the finding's line again (those answered 5xx
        or not at all tried first, at most ``ONE_STEP_TRIES``): a one-request reproducer instead of the case."""
        assert self.server is not None

        def answered_well(k: int) -> bool:
            status = sent[k].status
            return status is not None and status < 500

        # a request the server left unanswered is not tried: sent again it waits as long, and the hang is its finding
        steps = enumerate(case.steps[: len(sent)])
        order = sorted((k for k, s in steps if s.body is not None and not sent[k].timed_out), key=answered_well)
        for k in order[:ONE_STEP_TRIES]:
            trace, _ = lives.trace_of(lives.alone(case, sent, k))
            script = folder / "one-step.py"
            script.write_text(repro_script.render(trace, info))
            try:
                p = subprocess.run(
                    [sys.executable, str(script), "--url", self.server.base_url, *args, "--json"],
                    capture_output=True,
                    text=True,
                    timeout=self.request_timeout + 60,
                    env={**os.environ, **({"VLLM_API_KEY": self.server.api_key} if self.server.api_key else {})},
                )
            except subprocess.TimeoutExpired:
                continue  # not this step alone; raised, it ended the case's judging and lost its other findings
            finally:
                self.state["requests"] += 1
                script.unlink()
            if _reproduced(p):
                f.detail = f"{f.detail}\nshrunk to step {k + 1} of its case, alone".strip()
                return trace
        return None

    def _found_on(self) -> str:
        return " ".join(self.redactor.argv([self.target.engine or self.target.mode, *self.target.flags]))

    def shown(self, spec: str) -> str:
        """A user's flags or URL (--reference, --versions) as findings say it: --api-key values masked."""
        return shlex.join(self.redactor.argv(shlex.split(spec)))

    def _affected_versions(self) -> None:
        """Each crash's confirmed reproducer on the other versions and configurations given (versions.py)."""
        for f in self.findings.values():
            repro = self.out / "findings" / str(f.first_case) / "minimized" / "repro.py"
            if f.oracle != "crash" or not self.versions or not repro.exists() or f.affected:
                continue
            lines = []
            for spec in self.versions:
                self.say(f"hunt: finding {f.first_case}: its reproducer on {self.shown(spec)}")
                got = self._repro_on(repro, spec, "versions")
                self.say(f"  {got.line()}" + (f": {got.detail}" if got.result == versions.COULD_NOT_RUN else ""))
                lines.append(got.line())
                f.affected.append({"spec": self.shown(spec), "result": got.result})
            f.detail = f"{f.detail}\naffected: {self._found_on()}: crashed (found there); {'; '.join(lines)}".strip()
            self._save()

    def _repro_on(self, repro: Path, spec: str, why: str, args: tuple[str, ...] = ()) -> Affected:
        """A reproducer on fresh servers of ``spec`` (their logs under servers/``why``)."""
        return versions.run_on(
            repro,
            spec,
            self.shown(spec),
            self.target,
            self.out / "servers" / why,
            self.startup_timeout,
            runs=max(1, self.repeats),
            on_start=self._count_start,
            args=args,
        )

    def _confirm_hangs(self) -> None:
        """Each request hang's reproducer (its one request) on a fresh server of the target: the server that left it
        unanswered may have been busy with what its life was sent before, so only a fresh one says the request
        hangs alone. A hang it does not reproduce stays a finding, said unconfirmed."""
        if self.target.mode != "engine" or not self.target.engine:
            return
        spec = shlex.join([self.target.engine, *self.target.flags])
        for f in self.findings.values():
            if f.oracle != "hang" or not f.fingerprint.startswith(HANG_PREFIX) or not f.reproducer:
                continue
            if f.confirmed is not None:
                continue
            self.say(f"hunt: finding {f.first_case}: its reproducer on a fresh server")
            got = self._repro_on(self.out / f.reproducer, spec, "hangs", ("--timeout", f"{self.request_timeout:g}"))
            f.confirmed = got.result == versions.CRASHED  # exit 1: "reproduced"
            said = "reproduced alone on a fresh server" if f.confirmed else "not reproduced alone on a fresh server"
            f.detail = f"{f.detail}\nreproducer: {said} ({got.detail})".strip()
            self._save()

    def _fewest_flags(self) -> None:
        """Each crash found under a flag set of the axis and shrunk to a confirmed reproducer: the reproducer run on
        fresh servers with one of the set's options left out at a time; an option it still crashes without is
        dropped for good (one server per try, within the start budget)."""
        options = flag_draw.options(self.axis_flags)
        if not options or self.target.mode != "engine":
            return
        base = self.target.flags[: len(self.target.flags) - len(self.axis_flags)]
        for f in self.findings.values():
            repro = self.out / "findings" / str(f.first_case) / "minimized" / "repro.py"
            if f.oracle != "crash" or not f.confirmed or not repro.exists() or f.needs_flags is not None:
                continue
            kept, tried = list(options), True
            for option in options:
                if self.budget.max_starts - self.state["starts"] <= 0:
                    tried = False
                    break
                without = [o for o in kept if o is not option]
                spec = shlex.join([str(self.target.engine), *base, *[w for o in without for w in o]])
                self.say(f"hunt: finding {f.first_case}: its reproducer without {shlex.join(option)}")
                got = self._repro_on(repro, spec, "flags")
                self.say(f"  {got.line()}")
                if got.result == versions.CRASHED:
                    kept = without
            needs = [w for o in kept for w in o]
            if tried:
                f.needs_flags = self.redactor.argv(needs)
                f.detail = f"{f.detail}\nflags it needs: {shlex.join(f.needs_flags) or 'none of its flag set'}"
            else:
                f.detail = f"{f.detail}\nflags not shrunk: no server start left in the budget"
            self._save()

    def _count_start(self) -> None:
        self.state["starts"] += 1

    def _shrink(self, finding: Finding, life: list, folder: Path) -> tuple[Path, Any] | None:
        """Shrink one life the crash ended (the minimizer, on fresh servers): (its minimized folder, its result)."""
        from ..minimize import bug_report
        from ..minimize.minimizer import MinimizeError, Minimizer

        trace, named = lives.shrink_input(life)
        try:
            m = Minimizer(
                trace,
                masked(self.target),
                finding.chain or finding.fingerprint.split("|", 1)[1],
                folder / "minimized",
                named=named,
                origin=f"mmchaos hunt {self.out.resolve()} (finding {finding.first_case})",
                repeats=self.repeats,
                max_starts=self.budget.max_starts - self.state["starts"],
                max_minutes=max(1.0, self.budget.max_minutes - self._minutes()),
                startup_timeout=self.startup_timeout,
                keep_images=True,
                signatures=self.sigs,
                progress=lambda line: self.say("    " + line),
            )
        except (MinimizeError, ServerError) as e:
            self.say(f"hunt: finding {finding.first_case} not shrunk: {e}")
            return None
        self.say(f"  the life that ended at case {folder.name.split('.')[0]}: {len(m.start)} request(s)")
        try:
            result = m.run()
        except ServerError as e:  # a fresh server that did not start: the next life may be shrunk on another
            self.say(f"hunt: finding {finding.first_case} not shrunk from this life: {e}")
            return None
        finally:
            self.state["starts"] += m.budget.starts
            self._save()
        bug_report.write(m, result)
        return folder / "minimized", result


def _reproduced(p: subprocess.CompletedProcess) -> bool:
    """Whether a reproducer said it reproduced its finding (its --json summary; an exit code of 1 alone may be a
    Python error)."""
    got = repro_script.parse_result(p.stdout)
    return p.returncode == 1 and bool(got and got.get("reproduced"))


def _repro_name(f: Finding) -> str:
    """A finding's own reproducer beside its case (several findings may share a first case)."""
    return f"repro-{content_hash(f.fingerprint.encode())[:8]}.py"


def _rank(result) -> tuple[bool, bool, int]:
    """A confirmed reproducer first, then one that crashed a fresh server at least once, then the shortest."""
    return result.confirmed, result.outcome is not None, -len(result.trace)


def masked(target: Target) -> Target:
    """``target`` with its keys masked, as the minimizer's servers and reproducers get it (a masked key is a key all
    the same: the minimizer's client sends the mask; a reproducer never carries the real one)."""
    redactor = Redactor.from_environment(target.secrets())
    return replace(target, flags=redactor.argv(target.flags), env=redactor.env(target.env))
