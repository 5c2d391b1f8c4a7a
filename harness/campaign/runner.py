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
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pandas  # noqa: F401  (imported up front: a Ctrl-C must never land in its first, lazy import)
import pyarrow.parquet as pq

from mmchaos import faults, paths, schema
from mmchaos import options as locust_options
from mmchaos.auth import API_KEY_ENV
from mmchaos.files import write_files_atomic, write_json_atomic
from mmchaos.manifest import ProcessRow, ReplayAccount, TrialManifest
from mmchaos.manifest import read as read_manifest
from mmchaos.outcomes import unexpected
from mmchaos.redact import Redactor
from mmchaos.signatures import Signatures
from mmchaos.tables import PART_GLOB, PartWriter, compact, read_table, table_dir

from ..injection.control import FaultControl
from ..injection.injector import FaultInjector
from ..injection.proxy import FaultProxy, ProxyError
from ..servers import crash_watch, engines, model
from ..servers.model import takes_text_with_image
from ..servers.processes import wait_port_free
from ..servers.server import Server, ServerError, Target
from . import distributed, provenance
from .locust_command import locust_program
from .plan import CampaignPlan, Config, Run, fault_target
from .trial_processes import TrialProcesses

COMPLETED, INTERRUPTED, FAILED, RUNNING = "completed", "interrupted", "failed", "running"
DONE = "done"  # the progress phase reported once per trial, with its TrialResult
RETRY_PORT_WAIT = 15.0  # seconds a failed restart waits for its port to be free before its one more try
# a trial's Locust with its web UI instead of headless (campaign run --web-port): it starts at once, on loopback
WEB_UI_ARGS = ["--autostart", "--autoquit", "5", "--web-host", "127.0.0.1"]
TICK = 0.2  # seconds between observations of the server: detection within a second
LOCUST_GRACE = 20.0  # seconds Locust may take to stop its users and flush its rows
LOCUST_OVERRUN = 60.0  # seconds past its run time (and its workers' wait) after which a Locust that has not ended
# is stopped: a load loop is bounded in time whatever stalls on the client's side


def dump_greenlets(locust: subprocess.Popen) -> None:
    """Ask a stalled Locust for its greenlets' stacks (locustfiles/plugin/listeners.py logs them on SIGUSR2), before
    it is stopped: the one clue to a client-side stall."""
    try:
        os.kill(locust.pid, signal.SIGUSR2)
    except ProcessLookupError:
        pass


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
    point: dict = field(default_factory=dict)  # its sweep point ({} outside sweeps)


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


def run_dir(root: Path, camp: CampaignPlan, run: Run) -> Path:
    return root / camp.name / run.config.name / run.folder


def trial_status(folder: Path) -> str | None:
    m = folder / schema.MANIFEST
    return read_manifest(m)[0].status if m.is_file() else None


def make_target(camp: CampaignPlan, cfg: Config) -> Target:
    chosen = model.resolve(camp.model or None)  # a recipe name is its built folder
    if camp.target == "engine":
        return Target(mode="engine", engine=cfg.engine, model=chosen, flags=list(cfg.flags), env=dict(cfg.env))
    if camp.target == "command":
        return Target(
            mode="command",
            command=cfg.command or camp.command,
            url=camp.url or None,
            model=chosen,
            flags=list(cfg.flags),
            env=dict(cfg.env),
        )
    return Target(mode="attach", url=camp.url)


def locust_argv(
    camp: CampaignPlan,
    cfg: Config,
    trial: int,
    folder: Path,
    base_url: str,
    model: str,
    run_id: str,
    point: dict | None = None,
    repeat: int | None = None,
    watch_url: str = "",
    fault_control: str = "",
    web_port: int | None = None,
) -> list[str]:
    """Locust's command line for a trial; ``base_url`` is where the users send (the fault proxy, when the trial has
    network faults), ``watch_url`` where /health and /metrics are polled (the server itself)."""
    w = camp.workload_at(point or {})
    # the same seed for the same repeat at every sweep point: points differ by their knobs, not by chance
    seed = camp.seed + (trial if repeat is None else repeat)
    locustfile = w.locustfile  # made absolute by the plan
    argv = [
        *locust_program(locustfile),
        *(["--headless"] if web_port is None else WEB_UI_ARGS + ["--web-port", str(web_port)]),
        "--only-summary",
        "-u",
        str(w.users),
        "-r",
        str(w.spawn_rate),
        "-t",
        f"{int(w.duration)}s",
        "--stop-timeout",
        "5",
        "--host",
        base_url,
        "--loglevel",
        "WARNING",
        "--json-file",
        str(folder / "locust"),
        "--results-dir",
        str(folder),
        "--run-id",
        run_id,
        "--config-name",
        cfg.name,
        "--trial",
        str(trial),
        "--seed",
        str(seed),
        "--model",
        model,
        "--shape",
        w.shape,
        "--max-requests",
        str(w.max_requests),
    ]
    argv += locust_options.to_argv(w.mix, w.options)
    if "images_alone" not in w.options and not takes_text_with_image(camp.model or None):
        argv.append("--images-alone")  # the campaign's model takes an image or a text, not both (CLIP)
    if w.rate:  # open loop; the campaign's report judges whether the rate was held, not Locust's gate
        argv += [
            "--rate",
            str(w.rate),
            "--arrival",
            w.arrival,
            "--burstiness",
            str(w.burstiness),
            "--max-concurrency",
            str(w.max_concurrency),
            "--min-rate-ratio",
            "0",
        ]
    if w.trace:
        argv += ["--replay", w.trace, "--replay-speed", str(w.replay_speed)]
    if watch_url and watch_url != base_url:
        argv += ["--watch-url", watch_url]
    if fault_control:
        argv += ["--fault-control", fault_control]
    return argv


class CampaignRunner:
    def __init__(
        self,
        camp: CampaignPlan,
        results_root: Path | None = None,
        force: bool = False,
        progress=None,
        signatures: Signatures | None = None,
        web_port: int | None = None,
    ):
        self.camp = camp
        self.web_port = web_port  # each trial's Locust web UI on 127.0.0.1:web_port (None: headless)
        self.root = Path(results_root or paths.results_dir())
        self.force = force
        self.progress = progress  # callable(dict) for the live display
        self.sigs = signatures or Signatures.load()
        self.results: list[TrialResult] = []
        self._stop_requested = False
        # every secret of every configuration: what we write must not carry any of them
        self.redactor = Redactor.from_environment([s for cfg in camp.configs for s in make_target(camp, cfg).secrets()])

    def _write(self, path: Path, data: dict | TrialManifest) -> None:
        write_json_atomic(path, self.redactor.data(data.dump() if isinstance(data, TrialManifest) else data))

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
        self._write(
            camp_dir / schema.CAMPAIGN_MANIFEST,
            {
                "name": self.camp.name,
                "description": self.camp.description,
                "file": str(self.camp.path),
                "configs": [c.name for c in self.camp.configs],
                "trials": self.camp.trials,
                "workload": self.camp.workload.table(),
                "crash": self.camp.crash.model_dump(),
                "target": self.camp.target,
                "sweep": self.camp.sweep,
                "faults": [f.to_dict() for f in self.camp.faults],
            },
        )
        for run in self.camp.runs():
            cfg, trial = run.config, run.trial
            folder = run_dir(self.root, self.camp, run)
            if trial_status(folder) == COMPLETED and not self.force:
                result = TrialResult(cfg.name, trial, COMPLETED, skipped=True, point=run.point)
            else:
                self._report(config=cfg.name, trial=trial, point=run.point, phase="preparing")
                if folder.exists():
                    shutil.rmtree(folder)  # an unfinished or forced trial starts again from nothing
                result = self.run_trial(cfg, trial, folder, run.point, run.repeat)
            self.results.append(result)
            self._report(config=cfg.name, trial=trial, point=run.point, phase=DONE, result=result)
        return self.results

    def _manifest(
        self,
        cfg: Config,
        trial: int,
        target: Target,
        run_id: str,
        point: dict | None = None,
        repeat: int | None = None,
        **extra,
    ) -> TrialManifest:
        engine_info = None
        if target.mode == "engine":
            assert cfg.engine is not None  # an engine target's configurations each name one (the plan)
            engine_info = engines.require(cfg.engine).manifest().get("packages")
        return TrialManifest(
            campaign=self.camp.name,
            config=cfg.name,
            trial=trial,
            run_id=run_id,
            engine=cfg.engine,
            engine_packages=engine_info,
            flags=self.redactor.argv(cfg.flags),
            env=self.redactor.env(cfg.env),
            target=target.mode,
            target_detail=target.describe(self.redactor),
            workload={**(w := self.camp.workload_at(point or {})).table(), "mix": locust_options.effective_mix(w.mix)},
            sweep=dict(point or {}),
            repeat=trial if repeat is None else repeat,
            faults=[f.to_dict() for f in self.camp.faults],
            seed=self.camp.seed + (trial if repeat is None else repeat),
            crash_policy=self.camp.crash.model_dump(),
            git_rev=provenance.git_revision(),
            machine=provenance.machine(),
            tools=provenance.tool_versions(),
            **extra,
        )

    def _record_pgid(self, manifest: TrialManifest, folder: Path, key: str, pgid: int) -> None:
        """Record a process group we started as soon as it exists: whoever finds the trial folder (a user after
        mmchaos itself was killed, a test) knows which processes were ours without looking them up by name."""
        setattr(manifest, key, [*getattr(manifest, key), pgid])
        self._write(folder / schema.MANIFEST, manifest)

    def _bind_processes(
        self, injector: FaultInjector, server: Server, manifest: TrialManifest, folder: Path, restart: int
    ) -> None:
        """The server's processes by role, recorded as it becomes healthy: the only pids a fault may go to."""
        identities = server.processes()
        injector.bind(identities, restart, server.base_url, server.api_key)
        manifest.processes = [
            *manifest.processes,
            *(ProcessRow(**i.row(), restart=restart) for i in identities.values()),
        ]
        self._write(folder / schema.MANIFEST, manifest)

    def run_trial(
        self, cfg: Config, trial: int, folder: Path, point: dict | None = None, repeat: int | None = None
    ) -> TrialResult:
        """One trial into ``folder``; ``point``: its sweep point, ``repeat``: which repeat at that point."""
        folder.mkdir(parents=True)
        run_id = uuid.uuid4().hex[:12]
        target = make_target(self.camp, cfg)
        manifest = self._manifest(
            cfg, trial, target, run_id, point, repeat, status=RUNNING, t_start=time.time(), t_end=None
        )
        self._write(folder / schema.MANIFEST, manifest)
        result = TrialResult(cfg.name, trial, RUNNING, point=dict(point or {}))
        procs = TrialProcesses(
            Server(target, folder / schema.SERVER_LOG, redactor=self.redactor), manifest, LOCUST_GRACE
        )
        try:
            with procs:
                model = self._start_server(procs, cfg, trial, folder, result)
                if model is None or not self._start_faults(procs, cfg, trial, folder, result):
                    return result
                deadline = self._start_locust(procs, cfg, trial, folder, model, run_id, point, repeat)
                counter = RowCounter(folder)
                overran = self._load(procs, cfg, trial, folder, target, result, counter, deadline)
                self._judge_end(procs, folder, result, counter, overran)
                return result
        except KeyboardInterrupt:
            result.status = INTERRUPTED
            raise
        finally:
            code = procs.locust_code
            if code is not None and code < 0 and result.status == COMPLETED and not result.crashes:
                result.status = INTERRUPTED  # Locust was killed by a signal, not by the end of its run
            if self.camp.workload.trace and procs.locust is not None and result.status == COMPLETED:
                self._replay_status(folder, result, code, manifest)
            self._finish(folder, manifest, result, code)

    def _start_server(
        self, procs: TrialProcesses, cfg: Config, trial: int, folder: Path, result: TrialResult
    ) -> str | None:
        """Start the trial's server and wait until it answers: the model it serves, or None (the result says why)."""
        server = procs.server
        self._report(config=cfg.name, trial=trial, phase="starting server")
        # every group it launches (a failed start is tried again) is recorded; an attached server launches none
        server.on_start = lambda pgid: self._record_pgid(procs.manifest, folder, "server_pgids", pgid)
        try:
            server.start()
            server.wait_healthy(
                self.camp.crash.startup_timeout,
                progress=lambda t, _: self._report(config=cfg.name, trial=trial, phase=f"starting server ({t:.0f} s)"),
            )
            model = server.model_name()
        except (ServerError, OSError, ValueError, KeyError) as e:
            result.status, result.error = FAILED, str(e).splitlines()[0]
            return None
        procs.watch = crash_watch.CrashWatch(server, folder, self.sigs, hang_after=self.camp.crash.hang_after)
        procs.watch.healthy_at(server.healthy_at)
        return model

    def _start_faults(self, procs: TrialProcesses, cfg: Config, trial: int, folder: Path, result: TrialResult) -> bool:
        """The fault proxy (in front of the server's url, for network faults and the web UI's form), the injector
        and the control, when the trial has faults or a web UI; False when the proxy could not start."""
        if not (self.camp.faults or self.web_port is not None):
            return True
        server = procs.server
        if self.web_port is not None or any(f.kind in faults.NETWORK_KINDS for f in self.camp.faults):
            up = urlsplit(server.base_url)  # an attached server's, a command's own
            up_port = up.port or (443 if up.scheme == "https" else 80)
            try:
                procs.proxy = FaultProxy(up.hostname or server.host, up_port, seed=self.camp.seed + trial).start()
            except ProxyError as e:
                result.status, result.error = FAILED, str(e)
                return False
            procs.manifest.fault_proxy = procs.proxy.url
        procs.injector = FaultInjector(self.camp.faults, folder, procs.proxy)
        self._bind_processes(procs.injector, server, procs.manifest, folder, 0)
        fits = fault_target(cfg, self.camp.target, self.camp.command, procs.proxy is not None)
        procs.control = FaultControl(procs.injector, fits).start()
        return True

    def _start_locust(
        self,
        procs: TrialProcesses,
        cfg: Config,
        trial: int,
        folder: Path,
        model: str,
        run_id: str,
        point: dict | None,
        repeat: int | None,
    ) -> float:
        """Locust (the master, with workers), and this machine's workers, each a process group of its own; returns
        when a Locust still running has overrun its run time (and its workers' wait)."""
        server = procs.server
        argv = locust_argv(
            self.camp,
            cfg,
            trial,
            folder,
            procs.proxy.url if procs.proxy else server.base_url,
            model,
            run_id,
            point,
            repeat,
            watch_url=server.base_url,
            fault_control=procs.control.url if procs.control else "",
            web_port=self.web_port,
        )
        dist = distributed.Distribution.of(self.camp.workload)
        if dist:
            argv += dist.master_args()
        env = {**os.environ, **({API_KEY_ENV: server.api_key} if server.api_key else {})}  # the server's own key
        with open(folder / schema.LOCUST_LOG, "ab") as llog:

            def spawn(argv: list[str]) -> subprocess.Popen:  # a process group of its own, recorded at once
                p = subprocess.Popen(
                    argv,
                    stdout=llog,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    cwd=paths.PROJECT_ROOT,
                    env=env,
                )
                self._record_pgid(procs.manifest, folder, "locust_pgids", p.pid)
                return p

            procs.locust = spawn(argv)
            workers_argv = dist.local_workers_argv(self.camp.workload.locustfile) if dist else None
            if workers_argv:
                procs.local_workers = spawn(workers_argv)
        t_load = procs.manifest.t_load_start = time.time()
        if procs.control is not None:
            procs.control.t_start = t_load
        return t_load + self.camp.workload.duration + LOCUST_OVERRUN + (dist.max_wait if dist else 0)

    def _load(
        self,
        procs: TrialProcesses,
        cfg: Config,
        trial: int,
        folder: Path,
        target: Target,
        result: TrialResult,
        counter: RowCounter,
        deadline: float,
    ) -> bool:
        """Watch the server while Locust runs: faults by hand fired, crashes met by the crash policy (a restart
        replaces ``procs.server``), progress said. True when Locust overran its run time (stopped then)."""
        t_load = procs.manifest.t_load_start
        assert procs.locust is not None and procs.watch is not None and t_load is not None
        crash_cfg, watch = self.camp.crash, procs.watch
        while procs.locust.poll() is None:
            if time.time() > deadline:
                dump_greenlets(procs.locust)
                return True
            if procs.control is not None:
                for row in procs.control.tick(counter.requests):
                    self._report(config=cfg.name, trial=trial, phase=f"fault: {row['fault']} ({row['outcome']})")
            crash = watch.check()
            if crash:
                result.crashes.append(crash)
                self._report(config=cfg.name, trial=trial, phase=f"crash: {crash.signature}")
                if crash_cfg.policy == "stop" or len(result.crashes) > crash_cfg.max_restarts:
                    break
                new = self._restart(procs.server, target, folder, watch, cfg, trial, result)
                if new is None:
                    break
                procs.server = new
                if new.pgid is not None:
                    self._record_pgid(procs.manifest, folder, "server_pgids", new.pgid)
                if procs.injector is not None:
                    self._bind_processes(procs.injector, new, procs.manifest, folder, watch.restart)
            counter.update()
            self._report(
                config=cfg.name,
                trial=trial,
                phase="load",
                elapsed=time.time() - t_load,
                requests=counter.requests,
                unexpected=counter.errors,
                crashes=len(result.crashes),
            )
            time.sleep(TICK)  # observation period
        return False

    def _judge_end(
        self, procs: TrialProcesses, folder: Path, result: TrialResult, counter: RowCounter, overran: bool
    ) -> None:
        """How the load ended: completed, or interrupted or failed with why (a replay is judged once Locust has
        written what it sent: :meth:`_replay_status`)."""
        t_load = procs.manifest.t_load_start
        assert procs.locust is not None and t_load is not None
        locust, w = procs.locust, self.camp.workload
        result.status = COMPLETED
        ran = time.time() - t_load
        counter.update()
        if overran:  # a client-side stall: the trial says so and a re-run does it again
            result.status = INTERRUPTED
            result.error = (
                f"Locust did not end {LOCUST_OVERRUN:.0f} s after its run time: stopped (its "
                "greenlets' stacks are in locust.log)"
            )
        elif locust.poll() not in (None, 0) and not counter.requests and not result.crashes:
            # Locust could not start (a bad option, a locustfile that does not load): its own reason
            result.status, result.error = FAILED, f"Locust could not run: {locust_reason(folder)}"
        elif w.trace:
            pass
        elif locust.poll() is not None and not result.crashes and not w.max_requests and ran < w.duration:
            # Locust ended before its run time (-t counts from after its start-up): stopped (SIGINT) or gave up; a
            # re-run must not skip this trial as completed
            result.status = INTERRUPTED
            result.error = (
                f"Locust ended after {ran:.1f} s of {w.duration} s (exit code {locust.returncode}; see locust.log)"
            )

    def _replay_status(
        self, folder: Path, result: TrialResult, locust_code: int | None, manifest: TrialManifest
    ) -> None:
        """A replay is completed when it sent its whole log, however short against ``duration`` (its load time is
        then the log's: TrialManifest.load_window); cut by ``duration``, it is completed too and says how much it
        did not send; stopped early, it is interrupted."""
        replay = ReplayAccount.read(folder / schema.REPLAY)
        if replay is not None:
            manifest.replay = replay
        if replay is not None and replay.complete:
            return
        if replay is not None and replay.cut_by_run_time:
            result.error = (
                f"replay cut at the {self.camp.workload.duration} s duration: "
                f"{replay.not_sent:,} of {replay.requests:,} requests not sent"
            )
        elif result.crashes:
            if replay is not None:
                result.error = (
                    result.error
                    or f"replay ended with the crash: {replay.not_sent:,} of {replay.requests:,} requests not sent"
                )
        else:
            result.status = INTERRUPTED
            sent = f"{replay.sent:,} of {replay.requests:,} requests sent" if replay else "nothing sent"
            result.error = f"replay stopped before the end of its log ({sent}; exit code {locust_code}; see locust.log)"

    def _restart(
        self, server: Server, target: Target, folder: Path, watch, cfg, trial, result: TrialResult
    ) -> Server | None:
        """Same port, so Locust keeps loading the same URL; its requests meanwhile are recorded as refused."""
        port = server.port
        server.stop()
        self._report(config=cfg.name, trial=trial, phase="restarting server")
        # one more try when a start fails: the freed port is an ephemeral one, which another process's outgoing
        # connection may hold for a moment (on a busy machine), and a start may fail for a reason of the moment
        for attempt in (1, 2):
            new = Server(target, folder / schema.SERVER_LOG, port=port, redactor=self.redactor)
            try:
                new.start()
                new.wait_healthy(
                    self.camp.crash.startup_timeout,
                    progress=lambda t, _: self._report(
                        config=cfg.name, trial=trial, phase=f"restarting server ({t:.0f} s)"
                    ),
                )
                break
            except ServerError as e:
                new.stop()
                why = str(e).splitlines()[0]
                if attempt == 2:
                    result.error = f"restart failed: {why}"
                    return None
                self._report(config=cfg.name, trial=trial, phase=f"restart failed ({why}); one more try")
                if port is not None:
                    wait_port_free(port, RETRY_PORT_WAIT)
            except BaseException:  # Ctrl-C while it starts: the caller only knows the old server
                new.stop()
                raise
        watch.rebind(new)
        watch.healthy_at(new.healthy_at)
        return new

    def _finish(self, folder: Path, manifest: TrialManifest, result: TrialResult, locust_code) -> None:
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
        workers = distributed.ledger(folder)  # with Locust workers: each one, and those lost mid-trial
        if workers.get("workers_lost"):
            note = distributed.lost_note(workers["workers_lost"])
            result.error = f"{result.error}; {note}" if result.error else note
        ended = {
            **workers,
            "status": result.status,
            "t_end": time.time(),
            "locust_exit_code": locust_code,
            "requests": result.requests,
            "cut": int((requests["outcome"] == schema.CUT).sum()),
            "locust_requests": locust_count(folder),
            "crashes": len(result.crashes),
            "error": result.error,
        }
        for key, value in ended.items():
            setattr(manifest, key, value)
        self._write(folder / schema.MANIFEST, manifest)


def preflight(camp: CampaignPlan, results_root: Path) -> None:
    """What can be checked before anything runs, writing nothing: an attached server answers, the results folder
    can be written. Raises ServerError (one line). `campaign check` and `campaign run` both call it."""
    if camp.target == "attach":
        server = Server(Target(mode="attach", url=camp.url), os.devnull)
        ok, status, err = server.health(timeout=5)
        if not ok:
            raise ServerError(
                f"{server.base_url}/health did not answer 200 ({status or err}): start the server "
                f"or fix url in {camp.path}"
            )
    camp_dir = results_root / camp.name
    existing = next(p for p in (camp_dir, *camp_dir.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        why = "Not a directory" if not existing.is_dir() else "Permission denied"
        raise ServerError(
            f"results folder {camp_dir} is not writable ({why}): pick another with --results or fix its permissions"
        )


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
        lines = [
            ln.strip() for ln in (folder / schema.LOCUST_LOG).read_text(errors="replace").splitlines() if ln.strip()
        ]
    except OSError:
        return "no locust.log"
    ours = [ln.split("mmchaos:", 2)[-1].strip() for ln in lines if "/ERROR/mmchaos:" in ln]  # our reason first
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (ours or errors or lines or ["no output"])[-1][:300]


def locust_count(folder: Path) -> int | None:
    """Locust's own final request count (its --json-file stats); None if Locust died before writing them."""
    f = folder / "locust.json"
    try:
        return sum(e["num_requests"] for e in json.loads(f.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
