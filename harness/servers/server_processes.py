"""The processes of a vLLM server mmchaos started, by role: each API server, the engine core, each TP worker.

vLLM names its processes with setproctitle (``vllm/utils/system_utils.py``: ``<prefix>::<name>``, the prefix
``VLLM`` unless ``VLLM_PROCESS_NAME_PREFIX`` says otherwise): ``EngineCore``, ``Worker_TP<rank>``,
``Worker`` on a CPU server of TP=1, ``APIServer_<index>`` (only with ``--api-server-count`` > 1; with one, the
API server is the engine core's parent, which keeps its command line: the process we launched, or its child under
a wrapper script). The titles are read from ``/proc/<pid>/cmdline`` (what setproctitle rewrites), and
the tree is checked too: a worker is a child of the engine core, the engine core and the API servers descend from
the process we launched. Only members of the process group we launched are looked at, so a process that is not
ours is never found. Each identity keeps the process's start time: a pid reused by another process after ours
died is not ours (:func:`alive`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import psutil

from mmchaos.faults import API_SERVER, ENGINE_CORE, TP_WORKER

from .processes import group_members

DEFAULT_PREFIX = "VLLM"


@dataclass(frozen=True)
class Identity:
    role: str  # tp_worker:1, engine_core, api_server:0
    pid: int
    create_time: float  # psutil's, seconds since the epoch: with the pid, names one process for good
    title: str
    ppid: int

    def row(self) -> dict:
        return asdict(self)


def _title(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline()).strip()
    except psutil.Error:
        return ""


def identify(pgid: int, leader_pid: int, prefix: str = DEFAULT_PREFIX) -> dict[str, Identity]:
    """role -> identity of every vLLM process of the group ``pgid`` (whose leader we launched)."""
    # a worker's title carries _TP<rank> only when TP > 1 (and _DP/_PP... parts of other parallelisms); on CPU a
    # TP=1 server runs its model in one worker too (the mp executor: OpenMP needs it), titled plain "Worker"
    title_re = re.compile(rf"^{re.escape(prefix)}::(EngineCore|Worker((?:_[A-Z]+\d+)*)|APIServer_(\d+))(\s|$)")
    found: dict[str, Identity] = {}
    members = {p.pid: p for p in group_members(pgid)}
    for pid, p in members.items():
        m = title_re.match(_title(p))
        if not m:
            continue
        if m.group(1) == "EngineCore":
            role = ENGINE_CORE
        elif m.group(1).startswith("Worker"):
            tp = re.search(r"_TP(\d+)", m.group(2))
            role = f"{TP_WORKER}:{int(tp.group(1)) if tp else 0}"
        else:
            role = f"{API_SERVER}:{int(m.group(3))}"
        try:
            found[role] = Identity(role, pid, p.create_time(), _title(p), p.ppid())
        except psutil.Error:
            continue
    core = found.get(ENGINE_CORE)
    for role, ident in list(found.items()):
        # a worker's parent is the engine core (its executor forks it); anything else is not the server's worker
        if role.startswith(TP_WORKER) and (core is None or ident.ppid != core.pid):
            del found[role]
    front = core.ppid if core is not None else leader_pid
    if not any(r.startswith(API_SERVER) for r in found) and front in members:
        try:
            found[f"{API_SERVER}:0"] = Identity(
                f"{API_SERVER}:0", front, members[front].create_time(), _title(members[front]), members[front].ppid()
            )
        except psutil.Error:
            pass
    return dict(sorted(found.items()))


def alive(ident: Identity) -> bool:
    """The recorded process still runs (the same process: its start time too; a zombie is not running)."""
    try:
        p = psutil.Process(ident.pid)
        return abs(p.create_time() - ident.create_time) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
