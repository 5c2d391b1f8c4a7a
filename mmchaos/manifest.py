"""A trial's manifest (``manifest.json``): what was run and how it ended, as one pydantic model.

Writers: the campaign runner (harness/campaign/runner.py), which writes it as the trial starts and again as it
grows (the process groups it started, the load's window, a replay's account, how it ended); the synthetic
campaigns (tests/synthetic*.py) and the tests' trial helper. Reader: the trials table (analysis/results.py).

What we write is checked: a key the model does not name is an error (``extra="forbid"``), and so is a value of the
wrong type. What we read is read leniently: a manifest from another mmchaos version (a key it did not have yet, a
key since dropped, a value written as something else) is read with the keys this model knows, a key it does not
know is passed over, and a value it cannot read is left at its default and named in a note (:func:`read_data`).
On disk the JSON keeps its shape: only the keys a writer set are written (``model_dump(exclude_unset=True)``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .campaign_file import Crash
from .errors import MmchaosError

Status = Literal["running", "completed", "interrupted", "failed"]
TargetMode = Literal["engine", "command", "attach"]


class Record(BaseModel):
    """A record mmchaos writes: every key named, each of its type (assignments are checked too)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def dump(self) -> dict:
        """As JSON data: the keys that were set, nothing else (the file keeps the shape its writer gave it)."""
        return self.model_dump(mode="json", exclude_unset=True)


class TargetDetail(Record):
    """The server a trial ran (harness/servers/server.py ``Target.describe``), every secret masked."""

    mode: TargetMode | None = None
    engine: str | None = None
    model: str | None = None
    flags: list[str] = []
    env: dict[str, str] = {}
    command: str | None = None
    url: str | None = None


class ProcessRow(Record):
    """One process of the server, by role, as it became healthy (harness/servers/server_processes.py ``Identity``): the
    only pids a fault may go to."""

    role: str
    pid: Annotated[int, Field(ge=1)]
    create_time: float
    title: str = ""
    ppid: Annotated[int, Field(ge=0)] = 0
    restart: Annotated[int, Field(ge=0)] = 0


class ReplayAccount(BaseModel):
    """What a replay sent of its trace or log (``replay.json``, written by locustfiles/replay.py when its test
    stops), carried into the manifest as written (a key replay.py adds is kept)."""

    model_config = ConfigDict(extra="allow")

    source: str | None = None
    requests: Annotated[int, Field(ge=0)] = 0
    sent: Annotated[int, Field(ge=0)] = 0
    not_sent: int = 0
    complete: bool = False  # every request of the log was sent (and answered)
    cut_by_run_time: bool = False  # -t ended it first
    t_first: float | None = None  # the first lane's start
    t_done: float | None = None  # the last lane's last answer (complete replays)
    speed: float | None = None

    @classmethod
    def read(cls, path: Path) -> ReplayAccount | None:
        """The account in ``path``; None when there is none or it cannot be read (Locust died before writing it)."""
        try:
            return cls.model_validate(json.loads(Path(path).read_text()))
        except (OSError, ValueError):  # ValidationError is a ValueError
            return None

    def dump(self) -> dict:
        return self.model_dump(mode="json", exclude_unset=True)


class TrialManifest(Record):
    """One trial's manifest. Every key has a default: manifests written before a key existed still read."""

    campaign: str = ""
    config: str = ""  # the folder's name is the truth (a reader notes a manifest that says otherwise)
    trial: Annotated[int | None, Field(ge=0)] = None  # None: numbered by its folder
    run_id: str = ""  # stamped on every row Locust wrote
    engine: str | None = None  # the engine version (target = "engine")
    engine_packages: dict[str, Any] | None = None  # the engine's key packages and their versions
    flags: list[str] = []  # the server's flags, secrets masked
    env: dict[str, str] = {}  # the server's environment, secrets masked
    target: TargetMode | None = None
    target_detail: TargetDetail | None = None
    # the campaign file's [workload] as this trial ran it (mmchaos/campaign_file.py Workload's keys, the sweep
    # point's values in place, the effective mix): checked when the campaign was loaded, kept as a table here
    workload: dict[str, Any] = {}
    sweep: dict[str, Any] = {}  # knob -> value of the trial's sweep point ({} outside sweeps)
    repeat: Annotated[int | None, Field(ge=0)] = None  # which repeat at its sweep point
    faults: list[dict[str, Any]] = []  # mmchaos/faults.py Fault.to_dict of each [[fault]]
    seed: int | None = None  # the campaign's seed + the trial's repeat
    crash_policy: Crash | None = None  # the campaign's [crash] as run
    git_rev: str | None = None
    machine: dict[str, Any] | str | None = None
    tools: dict[str, str | None] = {}
    status: Status | None = None
    t_start: float | None = None  # the trial: from preparing its server ...
    t_end: float | None = None  # ... to its last write
    t_load_start: float | None = None  # the load: Locust started ...
    t_load_end: float | None = None  # ... and stopped (or was found stopped)
    server_pgids: list[int] = []  # process groups mmchaos started, recorded as each one started
    locust_pgids: list[int] = []
    fault_proxy: str | None = None  # the fault proxy's URL, when the trial had network faults
    processes: list[ProcessRow] = []
    replay: ReplayAccount | None = None
    workers: list[dict[str, Any]] = []  # Locust workers (harness/campaign/distributed.py ledger)
    workers_lost: list[str] = []  # those lost mid-trial
    locust_exit_code: int | None = None
    requests: Annotated[int | None, Field(ge=0)] = None  # rows in the requests table
    cut: Annotated[int | None, Field(ge=0)] = None  # of which still in flight when the run ended
    locust_requests: Annotated[int | None, Field(ge=0)] = None  # Locust's own count (None: it died before writing it)
    crashes: Annotated[int | None, Field(ge=0)] = None
    error: str | None = None

    def load_window(self) -> tuple[float | None, float | None]:
        """When the trial's load ran, the clock of its tables. A replay that sent its whole log ran the log's time,
        from its first request to its last answer, however long Locust took to start and stop around it; else
        the runner's window (Locust started to Locust stopped); a manifest from before load windows, the whole
        trial."""
        r = self.replay
        if r is not None and r.complete and r.t_first is not None and r.t_done is not None:
            return r.t_first, r.t_done
        return self.t_load_start or self.t_start, self.t_load_end or self.t_end


class ManifestError(MmchaosError, ValueError):
    """A manifest that is no JSON object at all (one line: the file and why)."""


def read(path: Path | str) -> tuple[TrialManifest, list[str]]:
    """The manifest in ``path`` and what of it could not be read (see :func:`read_data`). OSError when it cannot be
    opened, ManifestError when it is not a JSON object."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise ManifestError(f"{path}: not JSON ({e})") from None
    return read_data(data, str(path))


def read_data(data: Any, where: str = "manifest") -> tuple[TrialManifest, list[str]]:
    """A manifest's data as the model, leniently: keys it does not know are passed over (a manifest of another
    mmchaos version), a value it cannot read is left at its default and named in the returned notes (one line
    each: where, the key, what it should be)."""
    if not isinstance(data, dict):
        raise ManifestError(f"{where}: a manifest is a JSON object, not {type(data).__name__}")
    known = {k: v for k, v in data.items() if k in TrialManifest.model_fields}
    notes: list[str] = []
    while True:
        try:
            return TrialManifest.model_validate(known), notes
        except ValidationError as e:
            first: dict[str, Any] = {}  # the first error of each key (a union's members each say why)
            for x in e.errors():
                first.setdefault(str(x["loc"][0]) if x["loc"] else "", x)
            unreadable = [k for k in first if k in known]
            if not unreadable:  # an error of no key: cannot happen, but never loop
                raise ManifestError(f"{where}: {e.errors()[0]['msg']}") from None
            for key in unreadable:
                notes.append(f"{where}: '{key}' {_words(first[key])}; read as not given")
                del known[key]


def _words(error: dict) -> str:
    inner = ".".join(str(p) for p in error["loc"][1:] if isinstance(p, int) or str(p).isidentifier())
    msg = error["msg"].removeprefix("Input ")
    return f"{'(' + inner + ') ' if inner else ''}{msg}, not {error.get('input')!r:.60}"
