"""Campaign files (TOML): engine versions × named flag configurations × trials, a workload and a crash policy.

Everything is checked before anything runs, with the file, the line and a hint: keys, types and bounds by the
file's models (mmchaos/campaign_file.py), then what needs more than one key (files that must exist, keys that exclude
each other, vLLM flags the engine does not know).
"""

from __future__ import annotations

import itertools
import re
import tomllib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field

from mmchaos import arrivals, campaign_file, faults, options, paths, schema
from mmchaos.errors import MmchaosError
from mmchaos.options import OptionError, did_you_mean
from mmchaos.payloads.replay_plan import ReplayPlan
from mmchaos.payloads.traces import TraceError
from mmchaos.redact import split_command

from ..servers import engines

SWEEP = "sweep"  # [sweep]: knob = [values], one or two knobs; every combination is a point
MAX_SWEEP_KNOBS = 2


class CampaignError(MmchaosError):
    """One line: the file, the line, what is wrong and a hint."""


class PlannedWorkload(campaign_file.Workload):
    """[workload] as the plan runs it: the file's model (mmchaos/campaign_file.py Workload), its paths made
    absolute (trace, locustfile; cases_file and image_dir among the options), a trace's replay locustfile in place,
    and mix and options as the keys the file set (what Locust is told; the rest keep their defaults)."""

    # of another type than the file's model (pydantic allows it; to mypy, a base class's attribute changed)
    mix: dict[str, int] = Field(default_factory=dict)  # type: ignore[assignment]
    options: dict[str, Any] = Field(default_factory=dict)  # type: ignore[assignment]

    def table(self) -> dict:
        """As written to campaign.json, a trial's manifest and a rendered campaign file: every key."""
        return self.model_dump()


@dataclass(frozen=True)
class Config:
    name: str  # unique folder name (name@version when one named config is crossed with several engines)
    engine: str | None
    flags: tuple[str, ...]
    env: dict
    description: str = ""
    index: int = 0  # position of its [[config]] table in the file
    command: str = ""  # its own server command (target = "command"); empty: the campaign's


@dataclass
class CampaignPlan:
    """A campaign file, checked: what to run (the results of running it are analysis.results.CampaignResults)."""

    name: str
    path: Path
    description: str
    trials: int
    target: str
    command: str
    url: str
    model: str
    seed: int
    workload: PlannedWorkload
    crash: campaign_file.Crash  # with a [sweep] or a [[fault]], policy "restart" unless the file says otherwise
    configs: list[Config] = field(default_factory=list)
    sweep: dict[str, list] = field(default_factory=dict)  # knob -> values, as in [sweep]
    faults: list[faults.Fault] = field(default_factory=list)  # [[fault]]: injected into every trial

    @property
    def points(self) -> list[dict]:
        """Every combination of the sweep's values (one empty point without a sweep)."""
        return [dict(zip(self.sweep, vals)) for vals in itertools.product(*self.sweep.values())]

    def runs(self) -> list[Run]:
        """What to run, in order: per configuration, each repeat visits every point (so a stopped campaign has
        seen all points); ``trial`` numbers a configuration's trials in that order."""
        pts = self.points
        return [
            Run(cfg, pt, rep, rep * len(pts) + i)
            for cfg in self.configs
            for rep in range(self.trials)
            for i, pt in enumerate(pts)
        ]

    def workload_at(self, point: dict) -> PlannedWorkload:
        """The workload with a sweep point's values in place (users, a kind's weight, an option; each checked by
        the sweep)."""
        top = {k: v for k, v in point.items() if k in ("users", "rate")}
        mix = {**self.workload.mix, **{k: v for k, v in point.items() if k in options.WEIGHTS}}
        opts = {**self.workload.options, **{k: v for k, v in point.items() if k not in (*top, *options.WEIGHTS)}}
        return self.workload.model_copy(update={**top, "mix": mix, "options": opts})


@dataclass(frozen=True)
class Run:
    """One trial to run: a configuration at a sweep point, the ``repeat``-th time there."""

    config: Config
    point: dict
    repeat: int
    trial: int  # unique within the configuration

    @property
    def folder(self) -> str:
        return schema.trial_folder(self.repeat, self.point) if self.point else schema.trial_folder(self.trial)


def _line_of(text: str, key: str, section: str | None = None, nth: int = 0) -> int:
    """Best-effort line number of ``key`` (inside the ``nth`` ``[section]`` when given) for error messages."""
    lines = text.splitlines()
    start = 0
    if section:
        heads = [i for i, ln in enumerate(lines) if re.match(rf"^\s*\[\[?{re.escape(section)}\]?\]", ln)]
        if heads:
            start = heads[min(nth, len(heads) - 1)]
    pat = re.compile(rf"^\s*\"?{re.escape(key)}\"?\s*=")
    for i in range(start, len(lines)):
        if pat.match(lines[i]):
            return i + 1
    return start + 1


class _Checker:
    def __init__(self, path: Path, text: str):
        self.path, self.text = path, text

    def fail(self, msg: str, key: str = "", section: str | None = None, nth: int = 0) -> CampaignError:
        line = _line_of(self.text, key, section, nth) if key or section else 1
        return CampaignError(f"{self.path}:{line}: {msg}")


def load(path: str | Path, check_flags: bool = True) -> CampaignPlan:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise CampaignError(f"{path}: cannot read the campaign file ({e.strerror})") from e
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CampaignError(f"{path}: not valid TOML: {e}") from e
    ck = _Checker(path, text)
    try:
        model = campaign_file.validate(data)
    except campaign_file.FileProblem as e:
        raise ck.fail(str(e), e.key, e.section or None, e.nth) from None
    c = model.campaign.model_dump()
    w = {
        **model.workload.model_dump(),
        "mix": model.workload.mix.model_dump(exclude_unset=True),
        "options": model.workload.options.model_dump(exclude_unset=True),
    }
    crash = model.crash
    if (SWEEP in data or data.get("fault")) and "policy" not in data.get("crash", {}):
        # a sweep measures crashes per exposure, a fault what follows it: keep loading after a crash
        crash = crash.model_copy(update={"policy": "restart"})
    raw_configs = [cfg.model_dump() for cfg in model.config]
    if c["target"] == "command" and not c["command"] and not all(r["command"] for r in raw_configs):
        raise ck.fail(
            'target = "command" needs command = "... {port} ..." here or in every [[config]]', "target", "campaign"
        )
    if c["target"] == "attach" and not c["url"]:
        raise ck.fail('target = "attach" needs url = "http://host:port"', "target", "campaign")
    _check_url(c["url"], ck)
    _check_workload(w, path, ck)
    sweep = _check_sweep(data.get(SWEEP), data.get("workload", {}), w, ck)
    _check_open_loop(w, data.get("workload", {}), set(sweep), ck)

    configs: list[Config] = []
    for i, cfg in enumerate(raw_configs):
        if cfg["command"] and c["target"] != "command":
            raise ck.fail(
                f"config '{cfg['name']}' has its own command, which only target = \"command\" runs; "
                'with target = "engine" name its version: engine = "0.30.0"',
                "command",
                "config",
                i,
            )
        versions = [cfg["engine"]] if cfg["engine"] else (cfg["engines"] or c["engines"])
        if c["target"] == "engine":
            if not versions:
                raise ck.fail(
                    f"config '{cfg['name']}' names no engine: set engine = \"0.30.0\" here or "
                    "engines = [...] in [campaign]",
                    "name",
                    "config",
                    i,
                )
            for v in versions:
                try:
                    engines.engine(v)
                except engines.EngineError as e:
                    raise ck.fail(f"config '{cfg['name']}': {e}", "engine", "config", i) from e
        else:
            versions = [None]
        for v in versions:
            name = cfg["name"] if len(versions) == 1 else f"{cfg['name']}@{v}"
            if any(x.name == name for x in configs):
                raise ck.fail(f"two configurations are named '{name}'", "name", "config", i)
            configs.append(
                Config(
                    name,
                    v,
                    tuple(cfg["flags"]),
                    {str(k): str(x) for k, x in cfg["env"].items()},
                    cfg["description"],
                    i,
                    cfg["command"],
                )
            )

    camp = CampaignPlan(
        name=c["name"],
        path=path,
        description=c["description"],
        trials=c["trials"],
        target=c["target"],
        command=c["command"],
        url=c["url"],
        model=c["model"],
        seed=c["seed"],
        workload=PlannedWorkload.model_validate(w),
        crash=crash,
        configs=configs,
        sweep=sweep,
        faults=_check_faults(data.get("fault", []), model.fault, c, configs, w, ck),
    )
    if check_flags and c["target"] == "engine":
        check_engine_flags(camp, ck)
    return camp


def _check_url(url: str, ck: _Checker) -> None:
    if not url:
        return
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a port outside 0-65535)
    except ValueError as e:
        raise ck.fail(f"url {url!r}: {e}; ports are 1-65535", "url", "campaign") from e
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port == 0:
        raise ck.fail(f"url {url!r} must be http(s)://host[:port] with a port in 1-65535", "url", "campaign")


def _relative_to_file(raw: str, path: Path) -> Path:
    """A path in a campaign file: relative ones are relative to the file, like an include (absolute afterwards:
    Locust runs elsewhere)."""
    p = Path(raw).expanduser()
    return (p if p.is_absolute() else path.parent / p).resolve()


def _check_trace(w: dict, path: Path, ck: _Checker) -> None:
    """A workload that replays a trace or request log: it must be readable as one, and it replaces the mix."""
    if w["locustfile"]:
        raise ck.fail(
            "trace and locustfile exclude each other (a trace is replayed by locustfiles/replay.py)",
            "trace",
            "workload",
        )
    trace = _relative_to_file(w["trace"], path)
    try:
        ReplayPlan.load(trace)
    except (TraceError, OSError) as e:
        raise ck.fail(f"trace: {str(e).splitlines()[0]}", "trace", "workload") from e
    w["trace"], w["locustfile"] = str(trace), str(paths.locustfile("replay.py"))


def _check_workload(w: dict, path: Path, ck: _Checker) -> None:
    """Everything campaign run would find wrong in [workload] before (or instead of) Locust finding it minutes
    later: names and values of every option and weight, shape, times and rates, the files it names."""
    if w["trace"]:
        _check_trace(w, path, ck)
    locustfile = _relative_to_file(w["locustfile"], path) if w["locustfile"] else paths.locustfile()
    if not locustfile.is_file():
        raise ck.fail(f"locustfile {w['locustfile']} not found (relative to {path.parent})", "locustfile", "workload")
    w["locustfile"] = str(locustfile)
    try:
        options.to_argv(w["mix"], w["options"])
    except OptionError as e:
        raise ck.fail(str(e), e.key, e.section) from e
    opts = w["options"] = dict(w["options"])
    if not w["trace"]:
        _check_cases(opts, options.effective_mix(w["mix"]), path, ck)
    if opts.get("image_dir"):
        opts["image_dir"] = _check_image_dir(opts["image_dir"], path, ck)


def _check_open_loop(w: dict, raw: dict, swept: set, ck: _Checker) -> None:
    """rate, arrival, burstiness, max_concurrency: the rules of mmchaos.arrivals, in the file's words (a swept
    rate is checked per value by the sweep)."""
    rate_given = "rate" in raw or "rate" in swept
    if "rate" in raw and not w["rate"] > 0:
        raise ck.fail(
            f"rate must be more than 0 requests per second, not {w['rate']}; leave it out for a closed loop of `users`",
            "rate",
            "workload",
        )
    why = arrivals.problem(
        w["rate"] or (1 if rate_given else 0), w["arrival"], w["burstiness"], w["max_concurrency"], w["shape"], flag=str
    )
    if why:
        raise ck.fail(why[1], why[0], "workload")
    if rate_given and ("users" in raw or "users" in swept):
        raise ck.fail(
            "users and rate exclude each other: an open-loop run sizes its users for the rate (cap them "
            "with max_concurrency)",
            "users",
            SWEEP if "users" in swept else "workload",
        )


def _check_cases(opts: dict, mix: dict, path: Path, ck: _Checker) -> None:
    """The case file loads (it is made absolute), every case named in malformed_cases exists, and each malformed
    kind with weight has a case to draw from (the rule the traffic itself applies)."""
    from mmchaos.payloads.catalogue import CaseFileError, load_cases

    files = [_relative_to_file(opts["cases_file"], path)] if opts.get("cases_file") else []
    try:
        cases = load_cases(*files)
    except (OSError, CaseFileError) as e:
        raise ck.fail(f"cases_file: {str(e).splitlines()[0]}", "cases_file", "workload.options") from e
    if files:
        opts["cases_file"] = str(files[0])
    names = [n.strip() for n in opts.get("malformed_cases", "").split(",") if n.strip()]
    for name in names:
        if name not in cases:
            raise ck.fail(
                f"malformed_cases: unknown case {name!r}; {did_you_mean(name, cases)}",
                "malformed_cases",
                "workload.options",
            )
    max_model_len = opts.get("max_model_len", options.BY_NAME["max_model_len"].default)
    try:
        cases.by_kind(max_model_len, names, [k for k, w in mix.items() if w > 0])
    except ValueError as e:
        raise ck.fail(str(e), "malformed_cases", "workload.options") from e


def _check_image_dir(raw: str, path: Path, ck: _Checker) -> str:
    """A user image folder is read now, not by Locust minutes later: missing folders and unreadable images are
    errors of the file."""
    from mmchaos.payloads.user_images import load_image_dir

    folder = _relative_to_file(raw, path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # skipped non-images and duplicates are fine here
            load_image_dir(folder)
    except (OSError, ValueError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ck.fail(
            f"image_dir: {msg}; point image_dir at a folder of readable images, or remove it to use generated ones",
            "image_dir",
            "workload.options",
        ) from e
    return str(folder)


def sweep_knobs() -> list[str]:
    """What a [sweep] can vary: users, a kind's weight (by the kind's name, as in [workload.mix]) and every
    option of [workload.options] that takes a number or one of a few choices."""
    settable = [
        o.name
        for o in options.OPTIONS
        if o.name not in options.HARNESS_OWNED
        and not o.name.startswith("weight_")
        and (o.type in (int, float) or o.choices)
    ]
    return ["users", "rate", *options.WEIGHTS, *settable]


def _check_sweep(raw, raw_workload: dict, w: dict, ck: _Checker) -> dict[str, list]:
    """[sweep]: one or two knobs, each a list of distinct values its option accepts, set nowhere else; every
    point must still send something."""
    if raw is None:
        return {}
    if not raw:
        raise ck.fail("[sweep] is empty: name one or two knobs, e.g. malformed_post = [0, 2, 10]", section=SWEEP)
    if len(raw) > MAX_SWEEP_KNOBS:
        raise ck.fail(
            f"[sweep] varies {len(raw)} knobs ({', '.join(raw)}); at most {MAX_SWEEP_KNOBS} (every combination is run)",
            next(iter(raw)),
            SWEEP,
        )
    known = sweep_knobs()
    elsewhere = {
        "users": raw_workload,
        "rate": raw_workload,
        **{k: raw_workload.get("mix", {}) for k in options.WEIGHTS},
        **{k: raw_workload.get("options", {}) for k in known if k not in options.WEIGHTS},
    }
    for knob, values in raw.items():
        if knob not in known:
            kind = knob.removeprefix("weight_")
            why = (
                f"is written as the kind's name, as in [workload.mix]: {kind}"
                if kind in options.WEIGHTS
                else "is set by the harness, not swept"
                if knob in options.HARNESS_OWNED
                else "takes text, not a number: it cannot be swept"
                if knob in options.BY_NAME
                else f"is no knob; {did_you_mean(knob, known)}"
            )
            raise ck.fail(f"[sweep] {knob} {why}", knob, SWEEP)
        if knob in elsewhere[knob]:
            where = (
                "[workload]"
                if knob in ("users", "rate")
                else "[workload.mix]"
                if knob in options.WEIGHTS
                else "[workload.options]"
            )
            raise ck.fail(f"[sweep] {knob} is also set in {where}: set it in one place", knob, SWEEP)
        if not isinstance(values, list) or not values:
            raise ck.fail(f"[sweep] {knob} must be a list of values, e.g. {knob} = [1, 5]", knob, SWEEP)
        for v in values:
            problem = _sweep_value_problem(knob, v)
            if problem:
                raise ck.fail(f"[sweep] {knob} = {v!r}: {problem}", knob, SWEEP)
        if len({schema.sweep_value(v) for v in values}) < len(values):
            raise ck.fail(f"[sweep] {knob} lists a value twice: {values}", knob, SWEEP)
    sweep = {k: list(v) for k, v in raw.items()}
    weights = options.effective_mix(w["mix"])
    for vals in itertools.product(*sweep.values()):
        point = dict(zip(sweep, vals))
        if not sum({**weights, **{k: v for k, v in point.items() if k in weights}}.values()):
            raise ck.fail(
                f"[sweep] at {schema.sweep_label(point)} every kind's weight is 0: nothing would be sent",
                next(iter(sweep)),
                SWEEP,
            )
    return sweep


def _sweep_value_problem(knob: str, value) -> str | None:
    if knob == "users":
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        return None if ok else f"users must be an integer of at least 1, not {value!r}"
    if knob == "rate":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        return None if ok else f"rate must be more than 0 requests per second, not {value!r}"
    name = f"weight_{knob}" if knob in options.WEIGHTS else knob
    return options.BY_NAME[name].problem(value)


def _check_faults(raw: list, tables: list, c: dict, configs: list[Config], w: dict, ck: _Checker) -> list[faults.Fault]:
    """[[fault]] tables: each well-formed (mmchaos.faults.problem), due within the load, and aimed at a process
    every configuration's server has and mmchaos starts (never an attached server's)."""
    out: list[faults.Fault] = []
    for i, (table, model) in enumerate(zip(raw, tables)):
        f = model.model_dump()
        params = {p: f[p] for kind in faults.PARAMETERS.values() for p in kind if f[p] not in (-1, "")}
        at = f["at"] if f["at"] != -1 else None
        after = f["after_requests"] if f["after_requests"] != -1 else None
        fault = faults.Fault(f["kind"], f["target"], f["rank"], at, after, f["duration"], params, f["name"])
        where = f"fault {i + 1} ({fault.kind})"
        if at is None and after is None:
            raise ck.fail(
                f"{where}: say when: at = seconds after the load starts, or after_requests = N", "kind", "fault", i
            )
        why = faults.problem(fault)
        if why:
            key = next((k for k in table if k in why), "kind")
            raise ck.fail(f"{where}: {why}", key, "fault", i)
        if at is not None and at >= w["duration"]:
            raise ck.fail(f"{where}: at = {at:g} s is not within the load's {w['duration']:g} s", "at", "fault", i)
        for cfg in configs:
            why = fault_target(cfg, c["target"], c["command"]).refuses(fault)
            if why:
                key = "target" if c["target"] == "attach" and fault.is_process else "rank" if "rank" in why else "kind"
                raise ck.fail(f"{where}: config '{cfg.name}' {why}", key, "fault", i)
        if any(x.name == fault.name for x in out):
            raise ck.fail(f"two faults are named '{fault.name}': name them apart", "name", "fault", i)
        out.append(fault)
    return out


def fault_target(cfg: Config, target: str, command: str, proxy: bool = True) -> faults.Target:
    """What configuration ``cfg``'s server can take (mmchaos.faults.Target: the one rule of the web UI's form too);
    ``target`` and ``command`` are the campaign's."""
    from ..servers.server import api_server_count, tensor_parallel_size

    argv = [*split_command(cfg.command or command), *cfg.flags]
    attached = target == "attach"
    return faults.Target(
        started=not attached,
        tp=tensor_parallel_size(argv),
        api_servers=api_server_count(argv),
        dev_mode=attached or faults.dev_mode(cfg.env),  # an attached server's routes: found by its answers
        proxy=proxy,
    )


def check_engine_flags(camp: CampaignPlan, ck: _Checker | None = None) -> None:
    """Reject flags the config's engine does not accept (needs the engine installed: its --help is the truth)."""
    for cfg in camp.configs:
        assert cfg.engine is not None  # called for an engine target: its configurations each name one
        try:
            known = engines.require(cfg.engine).serve_flags()
        except engines.EngineError as e:
            raise CampaignError(f"{camp.path}: config '{cfg.name}': {e}") from e
        for f in cfg.flags:
            if f.startswith("-") and not re.fullmatch(r"-\d.*", f):
                opt = f.split("=", 1)[0]
                if opt not in known:
                    line = _line_of(ck.text, "flags", "config", cfg.index) if ck else 1
                    raise CampaignError(
                        f"{camp.path}:{line}: config '{cfg.name}': vLLM {cfg.engine} has no flag "
                        f"{opt}; {did_you_mean(opt, known)}"
                    )
