"""What a campaign file may hold: every section and key, its type, default and bounds, as pydantic models.

One definition serves three readers: `campaign check`/`run` (harness/campaign/plan.py validates a file with them and
turns pydantic's errors into one line with the file, the line and a did-you-mean), `mmchaos campaign schema` (the
JSON Schema editors complete and check campaign files with) and the docs site's campaign reference (docs/hooks.py).
What needs more than a key's own value (a file that must exist, an engine that must know a flag, keys that exclude
each other) is checked by the plan after these models.
"""

from __future__ import annotations

import json
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from mmchaos.errors import MmchaosError

from . import faults, options

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$"
SCHEMA_FILE = "campaign.schema.json"  # shipped next to the campaign files, named by their `#:schema` line
Number = int | float  # kept as written: 8 stays 8 on Locust's command line and in manifests


class Says:
    """What an out-of-bounds or misshapen value of this key is told, when the bounds alone say it badly."""

    def __init__(self, text: str):
        self.text = text


def _key(default, description: str, **schema_extra):
    """A key: its default and its help (the reference page and editors show it); bounds go in its type."""
    return Field(default, description=description, json_schema_extra=schema_extra or None)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


Shape = Literal[options.SHAPES]  # type: ignore[valid-type]
Name = Annotated[str, Field(pattern=NAME_PATTERN), Says("must be letters, digits, . _ - @")]


class Campaign(Section):
    """[campaign]: what is compared and where it runs."""

    name: Name = Field(description="the campaign's name: its results go to results/<name>/")
    description: str = _key("", "one line for the report")
    engines: list[str] = _key([], "engine versions every [[config]] without its own engine runs on")
    trials: Annotated[int, Field(ge=1)] = _key(1, "trials per configuration (per sweep point)")
    target: Literal["engine", "command", "attach"] = _key(
        "engine",
        "engine: an engine mmchaos installed; command: your server command, started per trial; "
        "attach: a server already running at url",
    )
    command: str = _key("", 'target = "command": the server command, with {port} where its port goes')
    url: str = _key("", 'target = "attach" (or a command\'s server): http(s)://host[:port]')
    model: str = _key("", "the model folder or name to serve (empty: the tiny test model)")
    seed: int = _key(1, "seed of the traffic's choices; trial k runs with seed + k")


def _option_field(o: options.Option):
    """A Locust option as a key of [workload.options] or [workload.mix]: its type, choices and bounds."""
    kind: Any = {int: int, float: Number, str: str, bool: bool}[o.type]
    if o.choices:
        kind = Literal[o.choices]
    bounds: dict[str, Any] = {k: v for k, v in (("ge", o.minimum), ("le", o.maximum)) if v is not None}
    return Annotated[kind, Field(**bounds)], Field(o.default, description=o.help)


MIX_KINDS = {k: o for k in options.WEIGHTS if (o := options.BY_NAME[f"weight_{k}"])}
SETTABLE_OPTIONS = {
    o.name: o for o in options.OPTIONS if o.name not in options.HARNESS_OWNED and not o.name.startswith("weight_")
}
Mix = create_model(
    "Mix",
    __base__=Section,
    __doc__="[workload.mix]: a request kind's weight (relative; 0 turns it "
    "off); kinds not named keep their default weight",
    **{k: _option_field(o) for k, o in MIX_KINDS.items()},
)
Options = create_model(
    "Options",
    __base__=Section,
    __doc__="[workload.options]: the traffic's knobs, as the Locust flags of the same name (--pool-size for pool_size)",
    **{n: _option_field(o) for n, o in SETTABLE_OPTIONS.items()},
)


class Workload(Section):
    """[workload]: the load every trial sends."""

    locustfile: str = _key("", "a locustfile of yours, relative to this file (empty: mmchaos's realistic mix)")
    trace: str = _key("", "a trace folder or JSONL request log to replay instead of a mix, relative to this file")
    replay_speed: Annotated[Number, Field(ge=0), Says("must be 0 (as fast as possible) or more")] = _key(
        1.0, "speed of the trace's replay: 1 as recorded, k times faster, 0 as fast as possible"
    )
    users: Annotated[int, Field(ge=1)] = _key(8, "concurrent Locust users")
    spawn_rate: Annotated[Number, Field(gt=0), Says("must be positive (users started per second)")] = _key(
        8, "users started per second"
    )
    duration: Annotated[Number, Field(ge=1), Says("must be at least 1 s")] = _key(30, "seconds of load per trial")
    max_requests: Annotated[int, Field(ge=0), Says("must be 0 (no limit) or more")] = _key(
        0, "stop a trial after this many requests per Locust process (0: only the duration)"
    )
    shape: Shape = _key("steady", "load shape: steady, ramp, spike or soak")
    # open loop (mmchaos.arrivals, whose rule checks them together): requests per second sent when due
    rate: Number = _key(
        0,
        "open loop: requests per second, sent when due by users sized for the rate (not `users`); "
        "0 or left out: a closed loop of `users`",
    )
    arrival: str = _key("poisson", "open loop: the arrival process of rate: poisson, constant or gamma")
    burstiness: Number = _key(
        1.0, 'open loop, arrival = "gamma": the shape of the gaps (1 = Poisson, below 1 burstier)'
    )
    max_concurrency: int = _key(0, "open loop: the most requests in flight at once (0: sized for the rate)")
    mix: Mix = _key(Mix(), "request kinds' weights")
    options: Options = _key(Options(), "the traffic's knobs")
    # Locust's master and workers (harness/campaign/distributed.py)
    processes: Annotated[int, Field(ge=0, le=1024)] = _key(0, "local Locust worker processes (0: one process)")
    expect_workers: Annotated[int, Field(ge=0, le=1024)] = _key(
        0, "workers from other machines (`mmchaos worker`) the master waits for"
    )
    master_bind_host: Annotated[
        str,
        Field(pattern=r"^[A-Za-z0-9_.:*-]+$"),
        Says("must be an address: 127.0.0.1 (this machine's workers only), an interface's address, or * (all)"),
    ] = _key("127.0.0.1", "where the master listens for workers: loopback takes only this machine's; * opens it")
    master_bind_port: Annotated[int, Field(ge=1, le=65535), Says("must be a port (1-65535)")] = _key(
        5557, "the master's port for its workers"
    )
    expect_workers_max_wait: Annotated[Number, Field(ge=1), Says("must be at least 1 s")] = _key(
        300, "seconds the master waits for its workers"
    )


class Crash(Section):
    """[crash]: what a crash does to a trial, and when a server counts as hung or failed to start."""

    policy: Literal["stop", "restart"] = _key(
        "stop",
        "stop: the trial ends at the first crash; restart: start the server again and keep loading "
        "(the default with a [sweep])",
    )
    hang_after: Annotated[Number, Field(gt=0), Says("must be positive (seconds)")] = _key(
        10, "seconds without an answer on /health that make a hang"
    )
    startup_timeout: Annotated[Number, Field(ge=1), Says("must be at least 1 s")] = _key(
        300, "seconds a server may take to become healthy"
    )
    max_restarts: Annotated[int, Field(ge=0), Says("must be 0 or more")] = _key(
        20, 'restarts per trial under policy = "restart"'
    )


class Config(Section):
    """[[config]]: one named flag configuration (with several engines, one per engine: name@version)."""

    name: Name = Field(description="the configuration's name: its results go to results/<campaign>/<name>/")
    description: str = _key("", "one line for the report")
    engine: str = _key("", 'the engine version it runs on (target = "engine")')
    engines: list[str] = _key([], "several engine versions: one configuration each, named name@version")
    command: str = _key(
        "", "target = \"command\": this configuration's own server command (e.g. another virtualenv's vllm serve)"
    )
    flags: Annotated[list[str], Says('must be strings, e.g. ["--mm-processor-cache-gb", "0"]')] = _key(
        [], 'vLLM flags, verbatim, e.g. ["--mm-processor-cache-gb", "0"]'
    )
    env: Annotated[dict[str, str | int | float | bool], Says('must be a table of NAME = "value"')] = _key(
        {}, "environment variables of the server"
    )


# each fault parameter (mmchaos/faults.py) a key of [[fault]] (declared apart: mypy types an inline **{...} of
# create_model without its field definitions' type)
_PARAMETER_KEYS: dict[str, Any] = {
    p: (str, Field("", description=f"{p} of the fault: {' | '.join(faults.CHOICES[p])} (empty: its default)"))
    if p in faults.CHOICES
    else (Number, Field(-1, description=f"{p} of the fault (-1: not given)"))
    for kind in faults.PARAMETERS.values()
    for p in kind
}
Fault = create_model(
    "Fault",
    __base__=Section,
    __doc__="[[fault]]: one fault injected into every trial (mmchaos/faults.py checks "
    "its kind, target and parameters together)",
    kind=(str, Field(description="what to do: the fault's kind (docs: faults)")),
    target=(str, Field("", description="the process or link it is aimed at")),
    rank=(int, Field(0, description="which of several such processes (TP rank, API server)")),
    at=(Number, Field(-1, description="seconds after the load starts (-1: not given; after_requests then)")),
    after_requests=(int, Field(-1, description="after this many requests (-1: not given)")),
    duration=(Number, Field(0, description="seconds it lasts (0: an instant)")),
    name=(str, Field("", description="its name in the report (empty: made from its kind)")),
    **_PARAMETER_KEYS,
)


class CampaignFile(Section):
    """A campaign file: engine versions × named flag configurations × trials, a workload and a crash policy."""

    campaign: Campaign
    workload: Workload = _key(Workload(), "the load")
    crash: Crash = _key(Crash(), "the crash policy")
    config: Annotated[list[Config], Field(min_length=1)] = Field(description="the flag configurations compared")
    fault: list[Fault] = _key([], "faults injected into every trial")
    # its knobs and values are checked by the plan (harness/campaign/plan.py), which knows what each knob takes
    sweep: dict[str, Any] | None = _key(
        None,
        "one or two knobs (users, a kind's weight, a numeric option) = [values]; every combination is a "
        "point (see the hazard page)",
        minProperties=1,
        maxProperties=2,
    )


SECTIONS = {
    "campaign": Campaign,
    "workload": Workload,
    "crash": Crash,
    "config": Config,
    "fault": Fault,
    "workload.mix": Mix,
    "workload.options": Options,
}


def json_schema() -> dict:
    """The JSON Schema of a campaign file (TOML read as JSON), for editors (taplo, Even Better TOML)."""
    schema = _numbers(CampaignFile.model_json_schema())
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema, "title": "mmchaos campaign file"}


_JSON_BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}


def _numbers(node):
    """A Number (int or float, kept as written) is JSON Schema's "number", with its bounds in JSON Schema's
    words (pydantic leaves a union's bounds in its own)."""
    if isinstance(node, list):
        return [_numbers(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: _numbers(v) for k, v in node.items()}
    if node.get("anyOf") == [{"type": "integer"}, {"type": "number"}]:
        del node["anyOf"]
        node["type"] = "number"
        for ours, theirs in _JSON_BOUNDS.items():
            if ours in node:
                node[theirs] = node.pop(ours)
    return node


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2) + "\n"


# --- pydantic's errors as a campaign file's one-line errors -------------------------------------------------------


class FileProblem(MmchaosError, ValueError):
    """One problem of a campaign file: its message, and where (section, key, nth table) to find its line."""

    def __init__(self, message: str, section: str = "", key: str = "", nth: int = 0):
        super().__init__(message)
        self.section, self.key, self.nth = section, key, nth


# Locust's names (command line and locust.conf) for what a campaign file names otherwise: users reach for them
LOCUST_NAMES = {"run_time": "duration", "run-time": "duration", "spawn-rate": "spawn_rate", "num_users": "users"}


def did_you_mean(word: str, choices) -> str:
    ours = LOCUST_NAMES.get(word)
    if ours in set(choices):
        return f"'{word}' is Locust's name: here it is '{ours}'"
    return options.did_you_mean(word, choices)


def _unwrap(annotation):
    """The model class inside list[...], X | None, Annotated[...] (or None)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _unwrap(arg)
        if found is not None:
            return found
    return None


def _says(info: FieldInfo) -> str | None:
    return next((m.text for m in info.metadata if isinstance(m, Says)), None)


def _choices(annotation) -> tuple:
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    return next((c for a in get_args(annotation) if (c := _choices(a))), ())


_UNION_TAGS = {"int", "float", "str", "bool"}  # how pydantic names the member of a union that failed


def _locate(loc: tuple) -> tuple[str, str, int, FieldInfo | None, type[BaseModel], bool]:
    """(section, key, nth [[config]] table, the key's field, the section's model, whether the error is in an item
    of the key's list). Parts of ``loc`` past a key that are no field (a union's member, a table's own key) are
    passed over."""
    model: type[BaseModel] = CampaignFile
    path: list[str] = []
    nth = 0
    info = None
    item = False
    for part in loc:
        if isinstance(part, int):
            if path in (["config"], ["fault"]):
                nth = part
            else:
                item = True
            continue
        sub = _unwrap(info.annotation) if info is not None else model
        if sub is None or item:
            item = item or part not in _UNION_TAGS  # a table's own key (env's NAME): inside the value
            continue
        if part not in sub.model_fields:
            return ".".join(path), part, nth, None, sub, False
        model = sub
        path.append(part)
        info = model.model_fields[part]
    return ".".join(path[:-1]), (path[-1] if path else ""), nth, info, model, item


def problem(error: ValidationError) -> FileProblem:
    """The first of pydantic's errors as one campaign-file problem, in today's words."""
    errors = error.errors()
    # a misspelt section first: it is why its section is missing ("[campain]" -> "missing the [campaign] section")
    e = next((x for x in errors if x["type"] == "extra_forbidden" and len(x["loc"]) == 1), errors[0])
    section, key, nth, info, model, item = _locate(e["loc"])
    where = f"[{section}]" if section else ""
    value = e.get("input")
    kind = e["type"]
    if kind == "extra_forbidden":
        if not section:
            known = [*CampaignFile.model_fields]
            return FileProblem(f"unknown section [{key}]; {did_you_mean(key, known)}", key)
        noun = {"workload.mix": "kind", "workload.options": "option"}.get(section, "key")
        return FileProblem(
            f"unknown {noun} '{key}' in {where}; {did_you_mean(key, model.model_fields)}", section, key, nth
        )
    if kind == "missing":
        if not section and key == "campaign":
            return FileProblem('missing the [campaign] section (with at least name = "...")')
        if not section and key == "config":
            return FileProblem("no [[config]] tables: name at least one flag configuration")
        return FileProblem(f"{where} needs '{key}'", section, nth=nth)
    if not section and key == "config" and kind in ("too_short", "list_type"):
        return FileProblem("no [[config]] tables: name at least one flag configuration")
    if section in ("workload.mix", "workload.options"):  # the option's own words (mmchaos/options.py)
        name = f"weight_{key}" if section == "workload.mix" else key
        why = options.BY_NAME[name].problem(value) or e["msg"]
        return FileProblem(f"{where} {key} {why}", section, key)
    says = _says(info) if info else None
    if kind == "literal_error":
        choices = _choices(info.annotation) if info else ()
        return FileProblem(f"{key} '{value}' unknown; {did_you_mean(str(value), choices)}", section, key, nth)
    if kind == "string_pattern_mismatch":
        return FileProblem(f"{key} {value!r} {says or 'must match ' + e['ctx']['pattern']}", section, key, nth)
    if says and (item or kind in _BOUNDS):
        return FileProblem(f"{key} {says}, not {value!r}" if kind in _BOUNDS else f"{key} {says}", section, key, nth)
    if kind in _BOUNDS:
        return FileProblem(f"{key} {_bound_words(info, e)}, not {value!r}", section, key, nth)
    want = _type_words(info.annotation) if info else "something else"
    got = type(value).__name__
    return FileProblem(f"'{key}' must be {want}, not {got}", section, key, nth)


_BOUNDS = {"greater_than_equal", "greater_than", "less_than_equal", "less_than"}


def _bound_words(info: FieldInfo | None, e: ErrorDetails) -> str:
    """The key's bounds in words: both ends when it has both ("must be 0 to 1024"), else the one it broke."""
    bounds = {
        k: v for m in (info.metadata if info else []) for k in ("ge", "le") if (v := getattr(m, k, None)) is not None
    }
    if len(bounds) == 2:
        return f"must be {bounds['ge']} to {bounds['le']}"
    ctx = e["ctx"]
    if "ge" in ctx:
        return f"must be at least {ctx['ge']}"
    if "gt" in ctx:
        return f"must be more than {ctx['gt']}"
    if "le" in ctx:
        return f"must be at most {ctx['le']}"
    return f"must be less than {ctx['lt']}"


def _type_words(annotation) -> str:
    names = {int: "int", float: "float", str: "str", bool: "bool", list: "list", dict: "dict"}
    origin = get_origin(annotation) or annotation
    if origin is Annotated:
        return _type_words(get_args(annotation)[0])
    if origin in (Union, types.UnionType):  # Optional[X] and X | Y
        return " or ".join(_type_words(a) for a in get_args(annotation) if a is not type(None))
    if isinstance(origin, type) and issubclass(origin, BaseModel):
        return "a table"
    return names.get(origin, getattr(origin, "__name__", str(origin)))


def validate(data: dict) -> CampaignFile:
    """The file's data as the model; raises FileProblem (the first problem, in one line)."""
    try:
        return CampaignFile.model_validate(data)
    except ValidationError as e:
        raise problem(e) from None
