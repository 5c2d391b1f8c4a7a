"""Flag sets drawn from a vLLM version's own ``vllm serve --help=all`` (``--flags-axis auto``).

The requests of a hunt come from the server's own API; its flag sets, with ``auto``, come from the version's own
help: each option of the groups that shape how a multimodal pooling request is processed, cached and scheduled
(``AUTO_GROUPS``), with its choices, its boolean pair or its numeric default. A drawn value is never the default
(a set the default already covers teaches nothing): another choice, the other side of a boolean, a number at 0, 1,
half or twice its default. Options that name a place, a file, a model or a secret are left out: they say where
things are, not how the engine behaves. A drawn set vLLM refuses at start-up is one line of the axis summary,
as any flag set's."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

# the help's groups whose options change how a request is processed, cached, scheduled or spread over processes
AUTO_GROUPS = ("ModelConfig", "CacheConfig", "MultiModalConfig", "SchedulerConfig", "ParallelConfig")
# options that say where things are or who may call, or that would replace the served model or its runner
LEFT_OUT = re.compile(
    r"^--(model|tokenizer|runner|convert|served-model-name|revision|code-revision|hf-|download-dir|load-format|"
    r"seed|config|port|host|api-key|ssl|allowed-|chat-template|override-|logits-processors|io-processor|"
    r"data-parallel-(address|rpc-port|start-rank|hybrid-lb|external-lb|backend)|distributed-executor-backend|"
    r"worker-cls|worker-extension-cls|ray-|pooler-config|generation-config|media-io-kwargs|mm-processor-kwargs|"
    r"limit-mm-per-prompt|kv-transfer|kv-events|speculative|structured-outputs)"
)
PLACE = re.compile(r"PATH|DIR|FILE|URL|JSON|CONFIG|NAME|KWARGS", re.I)
COUNT = re.compile(r"(^|_)(NUM|MAX|SIZE|LEN|TOKENS|SEQS|COUNT)(_|$)")  # a metavar that names a count
UNSIZED = (1, 2, 16, 256)  # a count whose default the engine decides (no number in the help)
SET_SIZE = (1, 2)  # options in a drawn set
AUTO = "auto"  # --flags-axis auto (3 sets) or auto:N


@dataclass(frozen=True)
class Option:
    names: tuple[str, ...]  # "--enable-prefix-caching", "--no-enable-prefix-caching"
    group: str
    choices: tuple[str, ...] = ()
    metavar: str = ""
    default: str | None = None

    def values(self) -> list[list[str]]:
        """The flag words this option may be set to, none of them its default."""
        flag = self.names[0]
        if len(self.names) == 2 and self.names[1] == "--no-" + flag[2:]:  # a boolean pair
            return [[self.names[1]]] if self.default == "True" else [[flag]]
        if self.choices:
            return [[flag, c] for c in self.choices if c != self.default]
        number = _number(self.default)
        if number is None and self.default in (None, "None") and COUNT.search(self.metavar):
            # a count the engine sizes itself when not given (--max-num-seqs): small and large ones
            return [[flag, str(v)] for v in UNSIZED]
        if number is None:
            return []
        is_int = re.fullmatch(r"-?\d+", self.default or "") is not None
        raw = {0, 1, number / 2, number * 2}
        got = sorted({int(v) if is_int else v for v in raw} - {number})
        return [[flag, str(v)] for v in got]


def parse(help_text: str) -> list[Option]:
    """The options of ``help_text`` (argparse's layout: group titles flush left and ending in ':', options indented
    two spaces, their help below them), in the groups the hunt draws from."""
    options: list[Option] = []
    group, block = "", None
    lines = help_text.splitlines()

    def close() -> None:
        if block is not None and group in AUTO_GROUPS:
            options.append(_option(block[0], " ".join(block[1:]), group))

    for line in lines:
        if re.match(r"^\S.*:\s*$", line):
            close()
            block, group = None, line.strip().rstrip(":")
        elif re.match(r"^ {2}-", line):
            close()
            head, _, rest = line.strip().partition("  ")
            block = [head, rest.strip()]
        elif block is not None and line.strip():
            block.append(line.strip())
    close()
    return [o for o in options if not LEFT_OUT.match(o.names[0]) and o.values()]


def _option(head: str, text: str, group: str) -> Option:
    names = tuple(re.findall(r"(?<![\w-])(--[A-Za-z][\w.-]*)", head))
    choices = re.search(r"\{([^}]*)\}", head)
    metavar = re.search(r"--[\w.-]+ ([A-Z][A-Z0-9_]*)", head)
    default = re.search(r"\(default: ([^)]*)\)", text)
    if metavar and PLACE.search(metavar.group(1)):
        names = ()
    return Option(
        names or ("--",),
        group,
        tuple(c for c in choices.group(1).split(",") if c) if choices else (),
        metavar.group(1) if metavar else "",
        default.group(1).strip() if default else None,
    )


def _number(text: str | None) -> float | None:
    if text is None or not re.fullmatch(r"-?\d+(\.\d+)?", text):
        return None
    return float(text) if "." in text else int(text)


def draw(options: list[Option], n: int, seed: int) -> list[list[str]]:
    """``n`` flag sets of one or two options each, drawn from ``options`` with ``seed``, no two the same."""
    rng, out = random.Random(seed), list[list[str]]()
    for _ in range(n * 20):
        if len(out) == n or not options:
            break
        picked = rng.sample(options, min(len(options), rng.choice(SET_SIZE)))
        flags = [w for o in sorted(picked, key=lambda o: o.names[0]) for w in rng.choice(o.values())]
        if flags not in out:
            out.append(flags)
    return out


def options(flags: list[str]) -> list[list[str]]:
    """``flags`` as options, each its flag and the values after it: ["--a", "1", "--b"] -> [["--a", "1"], ["--b"]]."""
    out: list[list[str]] = []
    for w in flags:
        if w.startswith("--") or not out:
            out.append([w])
        else:
            out[-1].append(w)
    return out


def count(spec: str) -> int | None:
    """How many sets ``spec`` asks for (``auto``: 3, ``auto:N``: N); None when it is no auto spec."""
    m = re.fullmatch(rf"{AUTO}(?::(\d+))?", spec.strip())
    if not m:
        return None
    return int(m.group(1)) if m.group(1) else 3
