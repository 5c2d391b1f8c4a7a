"""Server-side faults, defined once: what each kind is, what it may target, which parameters it takes and what makes
one ill-formed. A campaign's ``[[fault]]`` tables, the web UI's fault form and the harness's control endpoint all
check a fault with :func:`problem`; the harness injects it (harness/fault_injector.py) and the analysis says what
it did (analysis/faults.py).

Process faults go only into processes mmchaos started, found by the identities it recorded at start
(harness/servers/server_processes.py): ``kill`` (SIGKILL) and ``stop`` (SIGSTOP for ``duration`` seconds, then
SIGCONT: a stalled accelerator). Network faults act in the fault proxy mmchaos puts between Locust and the server, on
loopback (harness/injection/proxy.py), for ``duration`` seconds. Operator actions are what a person (or an
autoscaler) does to a serving vLLM through its own routes (VLLM_SERVER_DEV_MODE=1 exposes them): ``pause`` and
``sleep`` last ``duration`` seconds and are undone by ``/resume`` and ``/wake_up``; the cache resets are at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

KILL, STOP = "kill", "stop"
LATENCY, BANDWIDTH, RESET, SILENCE, SLOW_READ = "latency", "bandwidth", "reset", "silence", "slow_read"
PAUSE, SLEEP, RESET_MM_CACHE, RESET_PREFIX_CACHE = "pause", "sleep", "reset_mm_cache", "reset_prefix_cache"
PROCESS_KINDS = (KILL, STOP)
NETWORK_KINDS = (LATENCY, BANDWIDTH, RESET, SILENCE, SLOW_READ)
OPERATOR_KINDS = (PAUSE, SLEEP, RESET_MM_CACHE, RESET_PREFIX_CACHE)
KINDS = PROCESS_KINDS + NETWORK_KINDS + OPERATOR_KINDS

# an operator action: the route it posts to and the one that undoes it (None: at once, nothing to undo)
OPERATOR_ROUTES: dict[str, tuple[str, str | None]] = {
    RESET_MM_CACHE: ("/reset_mm_cache", None),
    RESET_PREFIX_CACHE: ("/reset_prefix_cache", None),
    SLEEP: ("/sleep", "/wake_up"),
    PAUSE: ("/pause", "/resume"),
}
UNDO = {route: undo for route, undo in OPERATOR_ROUTES.values() if undo}  # "/pause" -> "/resume"
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"  # vLLM exposes the operator routes only when it is "1"
PAUSE_MODES = ("abort", "wait", "keep")  # vLLM's PauseMode: abort what the engine holds, let it drain, hold it
SLEEP_LEVELS = (0, 1, 2)  # 0: the engine paused, nothing freed (0.32.0); 1: weights kept in host memory; 2: discarded

# the processes of a vLLM server, by the role vLLM gives them (its process titles: VLLM::Worker_TP1, ...)
TP_WORKER, ENGINE_CORE, API_SERVER = "tp_worker", "engine_core", "api_server"
PROCESS_TARGETS = (TP_WORKER, ENGINE_CORE, API_SERVER)
NETWORK = "network"  # the proxy between the load and the server
SERVER = "server"  # the server's own HTTP routes (operator actions)
TARGETS = PROCESS_TARGETS + (NETWORK, SERVER)

# kind -> {parameter: (what it is, its default or None when it is required)}; a text parameter's values in CHOICES
PARAMETERS: dict[str, dict[str, tuple[str, float | str | None]]] = {
    KILL: {},
    STOP: {},
    LATENCY: {
        "latency_ms": ("added to each chunk of a response, ms", None),
        "jitter_ms": ("uniform +- spread around latency_ms, ms", 0.0),
    },
    BANDWIDTH: {"kbps": ("cap on each connection's bytes per second, both ways, in kB/s", None)},
    RESET: {"after_bytes": ("bytes of each response passed on before the connection is reset (RST)", None)},
    SILENCE: {},
    SLOW_READ: {
        "kbps": (
            "the rate the proxy reads each response from the server at, in kB/s (a small receive "
            "buffer: the server's writes block)",
            None,
        )
    },
    PAUSE: {"mode": ("what the engine does with the requests it holds: " + " | ".join(PAUSE_MODES), "abort")},
    SLEEP: {
        "level": ("0: paused only, 1: weights kept in host memory, 2: discarded", 1.0),
        "mode": ("what the engine does with the requests it holds: " + " | ".join(PAUSE_MODES), "abort"),
    },
    RESET_MM_CACHE: {},
    RESET_PREFIX_CACHE: {},
}
CHOICES: dict[str, tuple[str, ...]] = {"mode": PAUSE_MODES}  # the parameters that are words, not numbers
ZERO_OK = ("jitter_ms", "level")  # the numbers that may be 0
# what a fault's verdict is judged by (analysis/fault_effects.py; `mmchaos report --max-wedge-s/--max-recovery-s`)
WEDGE_S = 30.0  # a liveness probe of periodSeconds 10 and failureThreshold 3 (Kubernetes' defaults) fires after 30 s
DEFAULT_RECOVER_S = 180.0  # seconds after a fault by which the server serves again
NEEDS_DURATION = (STOP, *NETWORK_KINDS, PAUSE, SLEEP)  # a kill and a cache reset are at once; the others last


@dataclass
class Fault:
    """One fault of a trial. ``at`` (seconds since the load started) or ``after_requests`` (requests recorded)
    says when; ``rank`` picks one of several processes of a role (TP rank, API server index)."""

    kind: str
    target: str = ""  # empty: network for network kinds (the only target they have)
    rank: int = 0
    at: float | None = None
    after_requests: int | None = None
    duration: float = 0.0
    params: dict[str, float | str] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self):
        if not self.target and self.kind in NETWORK_KINDS:
            self.target = NETWORK
        if not self.target and self.kind in OPERATOR_KINDS:
            self.target = SERVER
        for p, (_, default) in PARAMETERS.get(self.kind, {}).items():
            if p not in self.params and default is not None:
                self.params[p] = default
        if not self.name:
            self.name = self.label()

    @property
    def is_process(self) -> bool:
        return self.kind in PROCESS_KINDS

    @property
    def is_operator(self) -> bool:
        return self.kind in OPERATOR_KINDS

    def request(self) -> tuple[str, str | None]:
        """An operator action's route with its query (``/pause?mode=abort``) and the route that undoes it."""
        route, undo = OPERATOR_ROUTES[self.kind]
        query = "&".join(f"{p}={_word(v)}" for p, v in sorted(self.params.items()))
        return (f"{route}?{query}" if query else route), undo

    def role(self) -> str:
        """The process it names: ``tp_worker:1``, ``engine_core``, ``api_server:0``; ``network``."""
        return self.target if self.target in (ENGINE_CORE, NETWORK, SERVER) else f"{self.target}:{self.rank}"

    def when(self) -> str:
        return f"after {self.after_requests} requests" if self.after_requests is not None else f"at {self.at:g} s"

    def label(self) -> str:
        """``kill tp_worker:1 at 20 s``, ``latency 200±50 ms for 10 s at 5 s``."""
        what = {
            LATENCY: lambda p: f"{p.get('latency_ms', 0):g}±{p.get('jitter_ms', 0):g} ms",
            BANDWIDTH: lambda p: f"{p.get('kbps', 0):g} kB/s",
            SLOW_READ: lambda p: f"{p.get('kbps', 0):g} kB/s",
            RESET: lambda p: f"after {p.get('after_bytes', 0):g} B",
            PAUSE: lambda p: f"mode={p.get('mode')}",
            SLEEP: lambda p: f"level={_word(p.get('level', 1))} mode={p.get('mode')}",
        }.get(self.kind)
        text = " ".join(
            x for x in (self.kind, self.role() if self.is_process else "", what(self.params) if what else "") if x
        )
        if self.kind in NEEDS_DURATION:
            text += f" for {self.duration:g} s"
        return f"{text} {self.when()}" if self.at is not None or self.after_requests is not None else text

    def to_dict(self) -> dict:
        return asdict(self)


def problem(f: Fault) -> str | None:
    """Why ``f`` is not a fault mmchaos can inject, in words (None when it is well-formed). Whether the target
    server has the process it names is the campaign's check (it knows the flags)."""
    if f.kind not in KINDS:
        return f"kind '{f.kind}' is not a fault; kinds: {', '.join(KINDS)}"
    if f.is_process and f.target not in PROCESS_TARGETS:
        return f"a {f.kind} needs target = one of {', '.join(PROCESS_TARGETS)}, not '{f.target or '(none)'}'"
    if f.kind in NETWORK_KINDS and f.target != NETWORK:
        return f'a {f.kind} acts on the network between the load and the server: target = "network" or none'
    if f.is_operator and f.target != SERVER:
        return f'a {f.kind} is sent to the server\'s own route {OPERATOR_ROUTES[f.kind][0]}: target = "server" or none'
    if f.rank < 0 or (f.target in (ENGINE_CORE, NETWORK, SERVER) and f.rank):
        return f"rank {f.rank} does not apply to {f.target}" if f.rank >= 0 else "rank must be 0 or more"
    if (f.at is None) == (f.after_requests is None) and (f.at is not None):
        return "say when with at (seconds) or after_requests (a count), not both"
    if f.at is not None and f.at < 0:
        return f"at must be 0 s or later, not {f.at}"
    if f.after_requests is not None and f.after_requests < 0:
        return f"after_requests must be 0 or more, not {f.after_requests}"
    if f.kind in NEEDS_DURATION and not f.duration > 0:
        return f"a {f.kind} lasts: give duration = seconds (more than 0)"
    if f.kind not in NEEDS_DURATION and f.duration:
        return f"a {f.kind} is at once: remove duration"
    known = PARAMETERS[f.kind]
    for p, v in f.params.items():
        if p not in known:
            return f"{f.kind} takes no '{p}'" + (f"; it takes {', '.join(known)}" if known else "")
        if p in CHOICES:
            if v not in CHOICES[p]:
                return f"{p} must be one of {', '.join(CHOICES[p])}, not {v!r}"
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (p not in ZERO_OK and v == 0):
            return f"{p} must be a positive number, not {v!r}"
    if f.kind == SLEEP and f.params.get("level") not in SLEEP_LEVELS:
        return f"level must be one of {', '.join(map(str, SLEEP_LEVELS))}, not {f.params.get('level')!r}"
    for p, (_, default) in known.items():
        if default is None and p not in f.params:
            return f"a {f.kind} needs {p} ({known[p][0]})"
    return None


def dev_mode(env: dict[str, str]) -> bool:
    """Whether a server started with ``env`` exposes the operator routes."""
    return str(env.get(DEV_MODE_ENV, "")).strip().lower() in ("1", "true")


def _word(v: float | str | None) -> str:
    """A parameter as a query value: ``2`` for 2.0, a word as it is."""
    return f"{v:g}" if isinstance(v, (int, float)) else str(v)


@dataclass(frozen=True)
class Target:
    """What a server can take: whether mmchaos started it (its processes are ours to signal), its TP size and
    API servers, whether its operator routes are exposed, whether a fault proxy is in front of it. The one rule for
    `campaign check` (per configuration) and the web UI's fault form (the server under load)."""

    started: bool
    tp: int = 1
    api_servers: int = 1
    dev_mode: bool = False
    proxy: bool = True

    def refuses(self, f: Fault) -> str | None:
        """Why this server cannot take ``f`` (None when it can); ``f`` itself is checked by :func:`problem`."""
        if f.is_process and not self.started:
            return (
                "is attached: an attached server's processes are not mmchaos's to signal; process faults need a "
                'server mmchaos starts (target = "engine" or "command")'
            )
        if f.target == TP_WORKER and f.rank >= self.tp:
            ranks = "TP rank 0 only (tensor parallel size 1)" if self.tp == 1 else f"TP ranks 0-{self.tp - 1}"
            return (
                f"has {ranks}, not {f.rank}: it has no tp_worker:{f.rank} (add --tensor-parallel-size, or aim at a "
                "rank it has)"
            )
        if f.target == API_SERVER and f.rank >= self.api_servers:
            return f"runs {self.api_servers} API server(s) (--api-server-count): it has no api_server rank {f.rank}"
        if f.is_operator and not self.dev_mode:
            return (
                f'does not expose {OPERATOR_ROUTES[f.kind][0]}: add env = {{ {DEV_MODE_ENV} = "1" }} to it '
                "(vLLM's operator routes are dev mode only)"
            )
        if f.kind in NETWORK_KINDS and not self.proxy:
            return "has no fault proxy in front of it: network faults act in the proxy the load goes through"
        return None

    def offers(self) -> dict[str, list[str]]:
        """Each kind it can take -> the roles it can be aimed at (what the web UI's form lists)."""
        out: dict[str, list[str]] = {}
        for kind in KINDS:
            if kind in PROCESS_KINDS:
                roles = [f"{TP_WORKER}:{r}" for r in range(self.tp)] + [ENGINE_CORE]
                roles += [f"{API_SERVER}:{r}" for r in range(self.api_servers)]
            else:
                roles = [NETWORK if kind in NETWORK_KINDS else SERVER]
            fine = [r for r in roles if self.refuses(Fault(kind, *_role(r), duration=1.0)) is None]
            if fine:
                out[kind] = fine
        return out


def _role(role: str) -> tuple[str, int]:
    """``tp_worker:1`` -> ("tp_worker", 1); ``engine_core`` -> ("engine_core", 0)."""
    name, _, rank = role.partition(":")
    return name, int(rank or 0)


def from_role(kind: str, role: str, **kw) -> Fault:
    """A fault aimed at a role as :meth:`Fault.role` names it (the web UI's form sends roles)."""
    return Fault(kind, *_role(role), **kw)
