"""Server-side faults, defined once: what each kind is, what it may target, which parameters it takes and what makes
one ill-formed. A campaign's ``[[fault]]`` tables, the web UI's fault form and the harness's control endpoint all
check a fault with :func:`problem`; the harness injects it (harness/fault_injector.py) and the analysis says what
it did (analysis/faults.py).

Process faults go only into processes mmchaos started, found by the identities it recorded at start
(harness/server_processes.py): ``kill`` (SIGKILL) and ``stop`` (SIGSTOP for ``duration`` seconds, then SIGCONT: a
stalled accelerator). Network faults act in the fault proxy mmchaos puts between Locust and the server, on loopback
(harness/fault_proxy.py), for ``duration`` seconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

KILL, STOP = "kill", "stop"
LATENCY, BANDWIDTH, RESET, SILENCE, SLOW_READ = "latency", "bandwidth", "reset", "silence", "slow_read"
PROCESS_KINDS = (KILL, STOP)
NETWORK_KINDS = (LATENCY, BANDWIDTH, RESET, SILENCE, SLOW_READ)
KINDS = PROCESS_KINDS + NETWORK_KINDS

# the processes of a vLLM server, by the role vLLM gives them (its process titles: VLLM::Worker_TP1, ...)
TP_WORKER, ENGINE_CORE, API_SERVER = "tp_worker", "engine_core", "api_server"
PROCESS_TARGETS = (TP_WORKER, ENGINE_CORE, API_SERVER)
NETWORK = "network"  # the proxy between the load and the server
TARGETS = PROCESS_TARGETS + (NETWORK,)

# kind -> {parameter: (what it is, its default or None when it is required)}
PARAMETERS: dict[str, dict[str, tuple[str, float | None]]] = {
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
}
NEEDS_DURATION = (STOP, *NETWORK_KINDS)  # a kill is at once; the others last


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
    params: dict[str, float] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self):
        if not self.target and self.kind in NETWORK_KINDS:
            self.target = NETWORK
        for p, (_, default) in PARAMETERS.get(self.kind, {}).items():
            if p not in self.params and default is not None:
                self.params[p] = default
        if not self.name:
            self.name = self.label()

    @property
    def is_process(self) -> bool:
        return self.kind in PROCESS_KINDS

    def role(self) -> str:
        """The process it names: ``tp_worker:1``, ``engine_core``, ``api_server:0``; ``network``."""
        return self.target if self.target in (ENGINE_CORE, NETWORK) else f"{self.target}:{self.rank}"

    def when(self) -> str:
        return f"after {self.after_requests} requests" if self.after_requests is not None else f"at {self.at:g} s"

    def label(self) -> str:
        """``kill tp_worker:1 at 20 s``, ``latency 200±50 ms for 10 s at 5 s``."""
        what = {
            LATENCY: lambda p: f"{p.get('latency_ms', 0):g}±{p.get('jitter_ms', 0):g} ms",
            BANDWIDTH: lambda p: f"{p.get('kbps', 0):g} kB/s",
            SLOW_READ: lambda p: f"{p.get('kbps', 0):g} kB/s",
            RESET: lambda p: f"after {p.get('after_bytes', 0):g} B",
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
    if not f.is_process and f.target != NETWORK:
        return f'a {f.kind} acts on the network between the load and the server: target = "network" or none'
    if f.rank < 0 or (f.target in (ENGINE_CORE, NETWORK) and f.rank):
        return f"rank {f.rank} does not apply to {f.target}" if f.rank >= 0 else "rank must be 0 or more"
    if (f.at is None) == (f.after_requests is None) and (f.at is not None):
        return "say when with at (seconds) or after_requests (a count), not both"
    if f.at is not None and f.at < 0:
        return f"at must be 0 s or later, not {f.at}"
    if f.after_requests is not None and f.after_requests < 0:
        return f"after_requests must be 0 or more, not {f.after_requests}"
    if f.kind in NEEDS_DURATION and not f.duration > 0:
        return f"a {f.kind} lasts: give duration = seconds (more than 0)"
    if f.kind == KILL and f.duration:
        return "a kill is at once: remove duration"
    known = PARAMETERS[f.kind]
    for p, v in f.params.items():
        if p not in known:
            return f"{f.kind} takes no '{p}'" + (f"; it takes {', '.join(known)}" if known else "")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (p != "jitter_ms" and v == 0):
            return f"{p} must be a positive number, not {v!r}"
    for p, (_, default) in known.items():
        if default is None and p not in f.params:
            return f"a {f.kind} needs {p} ({known[p][0]})"
    return None
