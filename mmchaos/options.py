"""Every knob of the traffic, as data: registered as Locust custom arguments (so they appear, with their help,
in the web UI's start form and work headless), and mapped from a campaign file's [workload] tables."""

from __future__ import annotations

import argparse
import builtins
import difflib
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mmchaos import arrivals
from mmchaos.errors import MmchaosError

# Qwen3-VL-Embedding's default instruction, sent as the system message of image conversations.
DEFAULT_INSTRUCTION = "Represent the user's input."
SHAPES = ("steady", "ramp", "spike", "soak")  # load shapes (locustfiles/plugin/shapes.py draws them)
IMAGE_PRESETS: dict[str, tuple[int, int]] = {  # generated pools: range of the long side in px
    "realistic": (256, 2048),  # phone photos and screenshots after the usual client-side downscale
    "small": (64, 256),  # fast tests
}


RETRY_POLICIES = ("none", "openai")  # mmchaos.retry_policy defines them


OPTION_TYPES = (int, float, str, bool)


class Option(BaseModel):
    """One knob, checked as it is defined: a python name, one of the four types a flag and a TOML key both take,
    a default that is a value of its own (``problem(default)`` is None; a ``positive`` knob's 0 means "not
    given"), choices only for text, bounds in order. Made positionally as before: Option(name, type, default,
    help, ...)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")]  # python name; the flag is --name-with-dashes
    type: builtins.type
    default: Any
    help: Annotated[str, Field(min_length=1)]
    ui: bool = True  # shown in the web UI form
    choices: tuple | None = None
    minimum: int | float | None = None  # the smallest value allowed (kept as written: 0 stays 0 in the schema)
    maximum: int | float | None = None
    positive: bool = False  # a value given must be more than 0 (the default 0 means "not given")

    def __init__(self, name: str, type: builtins.type, default: Any, help: str, **rest: Any):
        super().__init__(name=name, type=type, default=default, help=help, **rest)

    @field_validator("type")
    @classmethod
    def _one_of_ours(cls, kind: builtins.type) -> builtins.type:
        if kind not in OPTION_TYPES:
            raise ValueError(f"must be one of {', '.join(t.__name__ for t in OPTION_TYPES)}, not {kind.__name__}")
        return kind

    @model_validator(mode="after")
    def _takes_its_default(self) -> Option:
        if self.choices is not None and self.type is not str:
            raise ValueError(f"option {self.name}: choices are for text options, not {self.type.__name__}")
        if (self.minimum is not None or self.maximum is not None or self.positive) and self.type not in (int, float):
            raise ValueError(f"option {self.name}: bounds are for numbers, not {self.type.__name__}")
        if self.minimum is not None and self.maximum is not None and self.minimum > self.maximum:
            raise ValueError(f"option {self.name}: minimum {self.minimum:g} is above maximum {self.maximum:g}")
        why = None if self.positive and self.default == 0 else self.problem(self.default)
        if why:
            raise ValueError(f"option {self.name}: its default {why}")
        return self

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def problem(self, value) -> str | None:
        """Why ``value`` cannot be this option's value (one phrase), or None."""
        want = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[self.type]
        types = (int, float) if self.type is float else (self.type,)
        if isinstance(value, bool) != (self.type is bool) or not isinstance(value, types):
            return f"must be {want}, not {value!r}"
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(map(str, self.choices))}, not {value!r}"
        if not isinstance(value, (int, float)):  # bounds are for numbers (_takes_its_default)
            return None
        if self.positive and not value > 0:
            return f"must be more than 0, not {value!r}"
        if self.minimum is not None and value < self.minimum:
            return f"must be at least {self.minimum:g}, not {value!r}"
        if self.maximum is not None and value > self.maximum:
            return f"must be at most {self.maximum:g}, not {value!r}"
        return None


# Weights of each request kind (relative; 0 turns a kind off). Defaults: mostly valid image embeddings, some
# text, and enough post-render failures and aborts on a hot image set to provoke drift within seconds.
WEIGHTS = {
    "valid_image": (50, "one image + text, chat form"),
    "text": (12, "text only (input)"),
    "multi_image": (8, "several images in one message"),
    "batch": (5, "several inputs in one request"),
    "tokenize": (3, "/tokenize of an image conversation (renders, never runs)"),
    "video": (3, "one small synthetic video (mp4 or webm) + text, chat form"),
    "embed_v2": (3, "one image + text on Cohere's /v2/embed, where the server lists it"),
    "pooling": (2, "one image + text on /pooling, where the server lists it"),
    "score": (3, "a text query scored against two image documents on /score or /v1/score, where listed"),
    "rerank": (3, "a text query and two image documents on /rerank, /v1/rerank or /v2/rerank, where listed"),
    "document": (2, "a document's pages (2 to 40 page images, one input each) in one request"),
    "malformed_pre": (5, "malformed request rejected before rendering (does not poison)"),
    "malformed_post": (10, "malformed request rejected after rendering a pooled image (poisons P0)"),
    "abort": (7, "valid image request abandoned by the client after --abort-after-ms"),
}

OPTIONS = [
    *(Option(f"weight_{k}", int, w, f"weight of {h}", minimum=0) for k, (w, h) in WEIGHTS.items()),
    Option("model", str, "", "model name for requests (empty: the first of /v1/models)"),
    Option(
        "routes",
        str,
        "",
        "paths the route kinds (embed_v2, pooling, score, rerank) may use, comma-separated (empty: those the "
        "server's /openapi.json lists)",
    ),
    Option("instruction", str, DEFAULT_INSTRUCTION, "Qwen3-VL-Embedding instruction (system message); empty for none"),
    Option("pool_size", int, 48, "distinct images in the pool", minimum=1),
    Option("zipf", float, 1.1, "Zipf exponent of image popularity (0 = uniform; higher = hotter hot set)", minimum=0),
    Option(
        "fresh_fraction", float, 0.1, "share of image draws that are never-repeated fresh images", minimum=0, maximum=1
    ),
    Option(
        "image_preset",
        str,
        "realistic",
        "generated pool preset: realistic (256-2048 px) or small",
        choices=tuple(IMAGE_PRESETS),
    ),
    Option("max_side", int, 0, "cap on the long side of generated images in px (0 = the preset's)", minimum=0),
    Option("image_dir", str, "", "use your own images from this folder instead of generated ones"),
    Option("image_seed", int, 0, "seed of the generated image pool", minimum=0),
    Option("multi_images", int, 3, "images per multi_image request", minimum=2),
    Option(
        "images_alone",
        bool,
        False,
        "an image is an input of its own, no text or instruction beside it, one per input (CLIP and SigLIP take an "
        "image or a text, not both; multi_image and video are not sent)",
    ),
    Option("doc_pool_size", int, 12, "distinct documents in the document pool", minimum=1),
    Option("doc_pages", int, 8, "median pages of a document (log-normal, 2 to 40)", minimum=1),
    Option(
        "page_side",
        int,
        1024,
        "long side of a document page in px (A4 portrait; at most --max-side when that is set)",
        minimum=64,
    ),
    Option("batch_size", int, 4, "inputs per batch request", minimum=1),
    Option(
        "base64_fraction", float, 0.1, "share of embedding requests asking encoding_format=base64", minimum=0, maximum=1
    ),
    Option(
        "video_share",
        float,
        0.2,
        "share of malformed and abort requests that carry a video instead of an image "
        "(a broken video, the post-render 400, an abandoned video request)",
        minimum=0,
        maximum=1,
    ),
    Option("abort_after_ms", int, 40, "the abort kind gives up (disconnects) after this many ms", minimum=1),
    Option("malformed_cases", str, "", "comma-separated malformed case names to use (empty: all)"),
    Option("cases_file", str, "", "TOML file with extra malformed cases"),
    Option("max_model_len", int, 4096, "the server's --max-model-len (for the over-length cases)", minimum=1),
    Option("request_timeout", float, 60.0, "seconds before a request counts as timed out", minimum=0.001),
    Option(
        "retry_policy",
        str,
        "openai",
        "how the client retries: openai (the OpenAI SDK's defaults: 2 retries "
        "of connection errors, 408, 409, 429 and 5xx, with backoff) or none; every attempt is a row",
        choices=RETRY_POLICIES,
    ),
    Option(
        "refused_backoff_ms", int, 250, "a user waits this long after a request got no answer (server down)", minimum=0
    ),
    Option("wait_ms", int, 0, "think time per user between requests, uniform in [0, wait_ms] ms", minimum=0),
    Option("seed", int, 1, "seed of each user's choices (kinds, images): runs are reproducible"),
    Option("shape", str, "steady", "load shape: steady, ramp, spike or soak", choices=SHAPES),
    # open loop (mmchaos.arrivals): requests sent at the times of an arrival process, by Locust users sized for it
    Option(
        "rate",
        float,
        0.0,
        "open loop: requests per second, sent when due whatever the answers take (users are "
        "sized for it; -u is not used); 0: closed loop, -u users sending back to back",
        positive=True,
    ),
    Option(
        "arrival",
        str,
        "poisson",
        "open loop: the arrival process of --rate: poisson, constant or gamma",
        choices=arrivals.ARRIVALS,
    ),
    Option(
        "burstiness",
        float,
        1.0,
        "open loop, --arrival gamma: the shape of the gaps (1 = Poisson, below 1 burstier, above 1 smoother)",
        positive=True,
    ),
    Option(
        "max_concurrency",
        int,
        0,
        "open loop: the most requests in flight at once (0: sized for the rate, at "
        f"most {arrivals.AUTO_MAX_CONCURRENCY})",
        minimum=0,
    ),
    Option("arrival_lanes", str, "", "Locust's workers in lane order (set by the master)", ui=False),
    Option(
        "max_requests",
        int,
        0,
        "stop after this many requests per Locust process, once answered (0: run time only)",
        minimum=0,
    ),
    Option("results_dir", str, "", "where rows go (empty: results/adhoc/<time>)"),
    Option("run_id", str, "", "id stamped on every row (empty: generated)", ui=False),
    Option("config_name", str, "adhoc", "configuration name stamped on every row", ui=False),
    Option("trial", int, 0, "trial number stamped on every row", ui=False),
    Option("health_interval", float, 0.25, "seconds between /health polls", minimum=0.01),
    Option("metrics_interval", float, 1.0, "seconds between /metrics scrapes", minimum=0.01),
    Option("no_watch", bool, False, "do not poll /health and /metrics"),
    Option(
        "watch_url",
        str,
        "",
        "poll /health and /metrics at this base URL instead of --host (the server itself, "
        "when the users load it through a fault proxy)",
        ui=False,
    ),
    Option(
        "fault_control",
        str,
        "",
        "the fault control of a server mmchaos started (the URL `mmchaos serve` prints): the web UI's fault form "
        "fires faults through it and the panel lists every fault",
        ui=False,
    ),
    Option("no_trace", bool, False, "do not keep the trace (what each request sent, to replay or minimize it)"),
    Option(
        "consistency_sample",
        float,
        0.25,
        "wrong-answer oracle: share of inputs (by input) whose repeated "
        "answers are compared with their first answer (0: off)",
        minimum=0,
        maximum=1,
    ),
    Option(
        "server_log",
        str,
        "",
        "the server's log file: the web UI's mmchaos panel tails it and names crashes "
        "and drift by the log signatures (empty: none)",
    ),
    # gates: the run's exit code (0 all hold, 1 one failed, 2 it could not run); a campaign asks its report instead
    Option("max_crashes", int, 0, "gate: most server crashes (seen on /health) the run may see", minimum=0),
    Option(
        "max_server_error_ratio",
        float,
        0.01,
        "gate: largest share of valid requests that may fail because of the "
        "server after the client's retries (1: no gate)",
        minimum=0,
        maximum=1,
    ),
    Option(
        "max_wrong_answers",
        int,
        0,
        "gate: most answers to a repeated input that may differ from its first answer (the wrong-answer oracle)",
        minimum=0,
    ),
    Option("max_p95_ms", float, 0.0, "gate: largest p95 latency of valid requests in ms (0: no gate)", minimum=0),
    Option(
        "min_rate_ratio",
        float,
        arrivals.DEFAULT_MIN_RATE_RATIO,
        "gate, open loop: smallest share of the requests due that were sent (achieved / asked rate; 0: no gate)",
        minimum=0,
        maximum=1,
    ),
]
BY_NAME = {o.name: o for o in OPTIONS}
GATES = ("max_crashes", "max_server_error_ratio", "max_wrong_answers", "max_p95_ms", "min_rate_ratio")
OPEN_LOOP = ("rate", "arrival", "burstiness", "max_concurrency")  # [workload] keys of a campaign, not options
HARNESS_OWNED = {
    "model",
    "seed",
    "shape",
    "max_requests",
    "results_dir",
    "run_id",
    "config_name",
    "trial",
    "arrival_lanes",
    "watch_url",
    "fault_control",
    *OPEN_LOOP,
    *GATES,
}


class OptionTable(BaseModel):
    """The table as a whole: each name once (one flag each), a weight option per request kind, and every name the
    harness owns, gates or sets for an open loop one of the table's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    options: list[Option]
    named: frozenset[str]  # names the rest of mmchaos relies on

    @model_validator(mode="after")
    def _whole(self) -> OptionTable:
        names = [o.name for o in self.options]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"options defined twice: {', '.join(twice)}")
        missing = sorted(self.named - set(names))
        if missing:
            raise ValueError(f"options named but not defined: {', '.join(missing)}")
        return self


OptionTable(options=OPTIONS, named=frozenset({*HARNESS_OWNED, *(f"weight_{k}" for k in WEIGHTS)}))


def register(parser) -> None:
    for o in OPTIONS:
        if o.type is bool:
            parser.add_argument(o.flag, action="store_true", default=o.default, help=o.help, include_in_web_ui=o.ui)
        else:
            parser.add_argument(
                o.flag,
                type=_positive(o) if o.positive else o.type,
                default=o.default,
                help=o.help,
                include_in_web_ui=o.ui,
                choices=o.choices,
            )


def _positive(o: Option):
    def parse(text: str):
        try:
            value = o.type(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        why = o.problem(value)
        if why:
            raise argparse.ArgumentTypeError(why)
        return value

    parse.__name__ = o.type.__name__  # what argparse names in its own messages
    return parse


class OptionError(MmchaosError, ValueError):
    def __init__(self, message: str, section: str = "", key: str = ""):
        super().__init__(message)
        self.section, self.key = section, key  # where in a campaign file: [workload.mix] or [workload.options]


def to_argv(mix: dict, options: dict) -> list[str]:
    """Campaign [workload.mix] (kind = weight) and [workload.options] (name = value) as Locust arguments."""
    argv = []
    for kind, weight in mix.items():
        if kind not in WEIGHTS:
            raise OptionError(
                f"unknown kind '{kind}' in [workload.mix]; {did_you_mean(kind, WEIGHTS)}", "workload.mix", kind
            )
        why = BY_NAME[f"weight_{kind}"].problem(weight)
        if why:
            raise OptionError(f"[workload.mix] {kind} {why}", "workload.mix", kind)
        argv += [BY_NAME[f"weight_{kind}"].flag, str(weight)]
    for name, value in options.items():
        o = BY_NAME.get(name)
        if o is None or name in HARNESS_OWNED or name.startswith("weight_"):
            settable = [n for n in BY_NAME if n not in HARNESS_OWNED and not n.startswith("weight_")]
            raise OptionError(
                f"unknown option '{name}' in [workload.options]; {did_you_mean(name, settable)}",
                "workload.options",
                name,
            )
        why = o.problem(value)
        if why:
            raise OptionError(f"[workload.options] {name} {why}", "workload.options", name)
        if o.type is bool:
            if value:
                argv.append(o.flag)
        else:
            argv += [o.flag, str(value)]
    return argv


LIST_AT_MOST = 40  # a hint lists every known name up to this many (a sweep's ~30 knobs), not ~400 vllm serve flags


def did_you_mean(word: str, choices) -> str:
    """The hint of a one-line error about an unknown name: the closest name, else every name when they are few,
    else the closest few (difflib, looser)."""
    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=1)
    if close:
        return f"did you mean '{close[0]}'?"
    if len(choices) <= LIST_AT_MOST:
        return f"known: {', '.join(choices)}"
    near = difflib.get_close_matches(word, choices, n=3, cutoff=0.4)
    if near:
        return f"closest of {len(choices)} known: {', '.join(near)}"
    return f"none of the {len(choices)} known is close"


def effective_mix(mix: dict) -> dict:
    """The weights a run uses: the defaults with a campaign's [workload.mix] over them (for manifests)."""
    return {k: mix.get(k, w) for k, (w, _) in WEIGHTS.items()}
