"""Run a campaign: for each configuration and trial, start the server, run Locust headless, watch the server,
record every outcome under ``results/<campaign>/<config>/<trial>/``.

A re-run resumes: trials whose manifest says completed are skipped unless ``force``. Ctrl-C stops Locust and
the server and leaves valid partial results (the trial's manifest says interrupted).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pandas  # noqa: F401  (imported up front: a Ctrl-C must never land in its first, lazy import)
import pyarrow.parquet as pq

from mmchaos import options as locust_options
from mmchaos import paths, schema
from mmchaos.auth import API_KEY_ENV
from mmchaos.files import write_files_atomic, write_json_atomic
from mmchaos.redact import Redactor
from mmchaos.outcomes import unexpected
from mmchaos.signatures import Signatures
from mmchaos.tables import PART_GLOB, PartWriter, compact, read_table, table_dir

from . import crash_watch, engines, provenance
from .campaign_plan import CampaignPlan, Config
from .processes import stop_group
from .server import Server, ServerError, Target

COMPLETED, INTERRUPTED, FAILED, RUNNING = "completed", "interrupted", "failed", "running"
DONE = "done"  # the progress phase reported once per trial, with its TrialResult
TICK = 0.2  # seconds between observations of the server: detection within a second
LOCUST_GRACE = 20.0  # seconds Locust may take to stop its users and flush its rows


@dataclass
class TrialResult:
    config: str
    trial: int
    status: str
    requests: int = 0
    errors: int = 0
    crashes: list = field(default_factory=list)
    error: str | None = None
    skipped: bool = False


class RowCounter:
    """Requests and errors recorded so far in a trial, read incrementally from the finished parts."""

    def __init__(self, trial_dir: Path):
        self.folder = table_dir(trial_dir, "requests")
        self.seen: set[str] = set()
        self.requests = self.errors = 0

    def update(self) -> None:
        if not self.folder.is_dir():
            return
        for p in self.folder.glob(PART_GLOB):
            if p.name in self.seen:
                continue
            self.seen.add(p.name)
            t = pq.read_table(p, columns=["outcome", "status", "expected_status"]).to_pandas()
            self.requests += len(t)
            self.errors += int(unexpected(t).sum())


def trial_dir(root: Path, camp: CampaignPlan, cfg: Config, trial: int) -> Path:
    return root / camp.name / cfg.name / schema.trial_folder(trial)


def trial_status(folder: Path) -> str | None:
    m = folder / schema.MANIFEST
    return json.loads(m.read_text()).get("status") if m.is_file() else None


def make_target(camp: CampaignPlan, cfg: Config) -> Target:
    if camp.target == "engine":
        return Target(mode="engine", engine=cfg.engine, model=camp.model or None, flags=list(cfg.flags),
                      env=dict(cfg.env))
    if camp.target == "command":
        return Target(mode="command", command=camp.command, url=camp.url or None, model=camp.model or None,
                      flags=list(cfg.flags), env=dict(cfg.env))
    return Target(mode="attach", url=camp.url)


def locust_argv(camp: CampaignPlan, cfg: Config, trial: int, folder: Path, base_url: str, model: str,
                run_id: str) -> list[str]:
    w = camp.workload
    locustfile = w["locustfile"]  # made absolute by the plan
    argv = [
        sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "--only-summary",
        "-u", str(w["users"]), "-r", str(w["spawn_rate"]), "-t", f"{int(w['duration'])}s",
        "--stop-timeout", "5", "--host", base_url, "--loglevel", "WARNING", "--json-file", str(folder / "locust"),
        "--results-dir", str(folder), "--run-id", run_id, "--config-name", cfg.name, "--trial", str(trial),
        "--seed", str(camp.seed + trial), "--model", model, "--shape", w["shape"],
        "--max-requests", str(w["max_requests"]),
    ]
    argv += locust_options.to_argv(w["mix"], w["options"])
    return argv


class CampaignRunner:
    def __init__(self, camp: CampaignPlan, results_root: Path | None = None, force: bool = False, progress=None,
                 signatures: Signatures | None = None):
        self.camp = camp
        self.root = Path(results_root or paths.results_dir())
        self.force = force
        self.progress = progress  # callable(dict) for the live display
        self.sigs = signatures or Signatures.load()
        self.results: list[TrialResult] = []
        self._stop_requested = False
        # every secret of every configuration: what we write must not carry any of them
        self.redactor = Redactor.from_environment([s for cfg in camp.configs for s in make_target(camp, cfg).secrets()])

    def _write(self, path: Path, data: dict) -> None:
        write_json_atomic(path, self.redactor.data(data))

    def _report(self, **state) -> None:
        """Progress, and the safe point where a Ctrl-C takes effect (between observations, never in the middle
        of an import or a write)."""
        if self._stop_requested:
            raise KeyboardInterrupt
        if self.progress:
            self.progress(state)

    def _on_interrupt(self, signum, frame) -> None:
        if self._stop_requested:
            raise KeyboardInterrupt  # a second Ctrl-C: now
        self._stop_requested = True

    def preflight(self) -> None:
        preflight(self.camp, self.root)

    def run(self) -> list[TrialResult]:
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, self._on_interrupt) if main else None
        try:
            return self._run()
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)

    def _run(self) -> list[TrialResult]:
        self.preflight()
        camp_dir = self.root / self.camp.name
        camp_dir.mkdir(parents=True, exist_ok=True)
        self._write(camp_dir / schema.CAMPAIGN_MANIFEST, {
            "name": self.camp.name, "description": self.camp.description, "file": str(self.camp.path),
            "configs": [c.name for c in self.camp.configs], "trials": self.camp.trials,
            "workload": self.camp.workload, "crash": self.camp.crash, "target": self.camp.target,
        })
        for cfg in self.camp.configs:
            for trial in range(self.camp.trials):
                folder = trial_dir(self.root, self.camp, cfg, trial)
                if trial_status(folder) == COMPLETED and not self.force:
                    result = TrialResult(cfg.name, trial, COMPLETED, skipped=True)
                else:
                    self._report(config=cfg.name, trial=trial, phase="preparing")
                    if folder.exists():
                        shutil.rmtree(folder)  # an unfinished or forced trial starts again from nothing
                    result = self.run_trial(cfg, trial, folder)
                self.results.append(result)
                self._report(config=cfg.name, trial=trial, phase=DONE, result=result)
        return self.results

    def _manifest(self, cfg: Config, trial: int, target: Target, run_id: str, **extra) -> dict:
        engine_info = None
        if target.mode == "engine":
            engine_info = engines.require(cfg.engine).manifest().get("packages")
        return {
            "campaign": self.camp.name, "config": cfg.name, "trial": trial, "run_id": run_id,
            "engine": cfg.engine, "engine_packages": engine_info, "flags": self.redactor.argv(cfg.flags),
            "env": self.redactor.env(cfg.env), "target": target.mode, "target_detail": target.describe(self.redactor),
            "workload": {**self.camp.workload, "mix": locust_options.effective_mix(self.camp.workload["mix"])},
            "seed": self.camp.seed + trial, "crash_policy": self.camp.crash, "git_rev": provenance.git_revision(),
            "machine": provenance.machine(), "tools": provenance.tool_versions(), **extra,
        }

    def _record_pgid(self, manifest: dict, folder: Path, key: str, pgid: int) -> None:
        """Record a process group we started as soon as it exists: whoever finds the trial folder (a user after
        mmchaos itself was killed, a test) knows which processes were ours without looking them up by name."""
        manifest[key] = [*manifest.get(key, []), pgid]
        self._write(folder / schema.MANIFEST, manifest)

    def run_trial(self, cfg: Config, trial: int, folder: Path) -> TrialResult:
        folder.mkdir(parents=True)
        run_id = uuid.uuid4().hex[:12]
        target = make_target(self.camp, cfg)
        manifest = self._manifest(cfg, trial, target, run_id, status=RUNNING, t_start=time.time(), t_end=None)
        self._write(folder / schema.MANIFEST, manifest)
        result = TrialResult(cfg.name, trial, RUNNING)
        counter = RowCounter(folder)
        crash_cfg = self.camp.crash
        server = Server(target, folder / schema.SERVER_LOG, redactor=self.redactor)
        locust = None
        watch = None
        t_load = None
        try:
            self._report(config=cfg.name, trial=trial, phase="starting server")
            try:
                server.start()
                self._record_pgid(manifest, folder, "server_pgids", server.pgid)
                server.wait_healthy(crash_cfg["startup_timeout"],
                                    progress=lambda t, _: self._report(config=cfg.name, trial=trial,
                                                                       phase=f"starting server ({t:.0f} s)"))
                model = server.model_name()
            except (ServerError, OSError, ValueError, KeyError) as e:
                result.status, result.error = FAILED, str(e).splitlines()[0]
                return result
            watch = crash_watch.CrashWatch(server, folder, self.sigs, hang_after=crash_cfg["hang_after"])
            watch.healthy_at(server.healthy_at)
            argv = locust_argv(self.camp, cfg, trial, folder, server.base_url, model, run_id)
            env = {**os.environ, **({API_KEY_ENV: server.api_key} if server.api_key else {})}  # the server's own key
            with open(folder / schema.LOCUST_LOG, "ab") as llog:
                locust = subprocess.Popen(argv, stdout=llog, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True, cwd=paths.PROJECT_ROOT, env=env)
            self._record_pgid(manifest, folder, "locust_pgids", locust.pid)
            t_load = time.time()
            manifest["t_load_start"] = t_load
            while locust.poll() is None:
                crash = watch.check()
                if crash:
                    result.crashes.append(crash)
                    self._report(config=cfg.name, trial=trial, phase=f"crash: {crash.signature}")
                    if crash_cfg["policy"] == "stop" or len(result.crashes) > crash_cfg["max_restarts"]:
                        break
                    new = self._restart(server, target, folder, watch, cfg, trial, result)
                    if new is None:
                        break
                    server = new
                    self._record_pgid(manifest, folder, "server_pgids", server.pgid)
                counter.update()
                self._report(config=cfg.name, trial=trial, phase="load", elapsed=time.time() - t_load,
                             requests=counter.requests, unexpected=counter.errors, crashes=len(result.crashes))
                time.sleep(TICK)  # observation period
            result.status = COMPLETED
            ran = time.time() - t_load
            counter.update()
            if locust.poll() not in (None, 0) and not counter.requests and not result.crashes:
                # Locust could not start (a bad option, a locustfile that does not load): its own reason
                result.status, result.error = FAILED, f"Locust could not run: {locust_reason(folder)}"
            elif locust.poll() is not None and not result.crashes and not self.camp.workload["max_requests"] \
                    and ran < self.camp.workload["duration"]:
                # Locust ended before its run time (-t counts from after its start-up): stopped (SIGINT) or
                # gave up; a re-run must not skip this trial as completed
                result.status = INTERRUPTED
                result.error = f"Locust ended after {ran:.1f} s of {self.camp.workload['duration']} s " \
                               f"(exit code {locust.returncode}; see locust.log)"
            return result
        except KeyboardInterrupt:
            result.status = INTERRUPTED
            raise
        finally:
            if t_load is not None:
                manifest["t_load_end"] = time.time()  # before the stops: a trial's clock is its load
            # Locust on SIGTERM stops its users and flushes its recorder; whatever of its group is left after the
            # grace is killed (a forked worker too: it was ours)
            locust_code = stop_group(locust, LOCUST_GRACE) if locust else None
            if watch:
                watch.finish()
            server.stop()
            if locust_code is not None and locust_code < 0 and result.status == COMPLETED and not result.crashes:
                result.status = INTERRUPTED  # Locust was killed by a signal, not by the end of its run
            self._finish(folder, manifest, result, locust_code)

    def _restart(self, server: Server, target: Target, folder: Path, watch, cfg, trial,
                 result: TrialResult) -> Server | None:
        """Same port, so Locust keeps loading the same URL; its requests meanwhile are recorded as refused."""
        port = server.port
        server.stop()
        self._report(config=cfg.name, trial=trial, phase="restarting server")
        new = Server(target, folder / schema.SERVER_LOG, port=port, redactor=self.redactor)
        try:
            new.start()
            new.wait_healthy(self.camp.crash["startup_timeout"],
                             progress=lambda t, _: self._report(config=cfg.name, trial=trial,
                                                                phase=f"restarting server ({t:.0f} s)"))
        except ServerError as e:
            new.stop()
            result.error = f"restart failed: {str(e).splitlines()[0]}"
            return None
        except BaseException:  # Ctrl-C while it starts: the caller only knows the old server
            new.stop()
            raise
        watch.rebind(new)
        watch.healthy_at(new.healthy_at)
        return new

    def _finish(self, folder: Path, manifest: dict, result: TrialResult, locust_code) -> None:
        requests = read_table(folder, "requests").to_pandas()
        for c in result.crashes:
            # the server died between its last healthy answer and the detection: count at the former
            c.in_flight = crash_watch.count_in_flight(requests, c.t_last_healthy or c.t_detected)
        if result.crashes:
            w = PartWriter(table_dir(folder, "crashes"), schema.CRASHES, tag="harness")
            for c in result.crashes:
                w.add(c.row())
            w.flush()
        for name in schema.TABLES:
            compact(table_dir(folder, name))  # one file per table: loading many trials stays fast
        result.requests, result.errors = len(requests), int(unexpected(requests).sum())
        # every request sent is a row; Locust counts all but those cut by the end of the run
        for name in (schema.LOCUST_LOG, "locust.json"):  # Locust's own files: server text can be anywhere in them
            redact_file(folder / name, self.redactor)
        manifest.update(status=result.status, t_end=time.time(), locust_exit_code=locust_code,
                        requests=result.requests, cut=int((requests["outcome"] == schema.CUT).sum()),
                        locust_requests=locust_count(folder), crashes=len(result.crashes), error=result.error)
        self._write(folder / schema.MANIFEST, manifest)


def preflight(camp: CampaignPlan, results_root: Path) -> None:
    """What can be checked before anything runs, writing nothing: an attached server answers, the results folder
    can be written. Raises ServerError (one line). `campaign check` and `campaign run` both call it."""
    if camp.target == "attach":
        server = Server(Target(mode="attach", url=camp.url), os.devnull)
        ok, status, err = server.health(timeout=5)
        if not ok:
            raise ServerError(f"{server.base_url}/health did not answer 200 ({status or err}): start the server "
                              f"or fix url in {camp.path}")
    camp_dir = results_root / camp.name
    existing = next(p for p in (camp_dir, *camp_dir.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        why = "Not a directory" if not existing.is_dir() else "Permission denied"
        raise ServerError(f"results folder {camp_dir} is not writable ({why}): pick another with --results or fix "
                          "its permissions")


def redact_file(path: Path, redactor: Redactor) -> None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return
    clean = redactor.text(text)
    if clean != text:
        write_files_atomic(path.parent, {path.name: clean.encode()})


def locust_reason(folder: Path) -> str:
    """Locust's own one-line reason for stopping (the last line of its log that says error), else its last line."""
    try:
        lines = [ln.strip() for ln in (folder / schema.LOCUST_LOG).read_text(errors="replace").splitlines()
                 if ln.strip()]
    except OSError:
        return "no locust.log"
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["no output"])[-1][:300]


def locust_count(folder: Path) -> int | None:
    """Locust's own final request count (its --json-file stats); None if Locust died before writing them."""
    f = folder / "locust.json"
    try:
        return sum(e["num_requests"] for e in json.loads(f.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
