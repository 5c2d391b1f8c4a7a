"""The front door under fuzz (issue 12): generated campaign files (random sections, keys, types and values, broken
TOML) and generated command lines. Every case ends with exit 0 or 2, at most a few lines on stderr, never a
traceback, and nothing written anywhere but the results folder it was given.

Inputs are chosen so that nothing can start a server or reach the network: engines and the model live in an empty
MMCHAOS_HOME for the command lines; URLs are loopback ports nobody listens on; commands name no program that
exists; `campaign run` is only given files that do not exist.
"""

from __future__ import annotations

import contextlib
import io
import socket
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmchaos.harness import cli
from mmchaos.options import BY_NAME, WEIGHTS

FILE_CASES = 400
ARGV_CASES = 400
MAX_STDERR_LINES = 3


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CLOSED = _closed_port()
URLS = [f"http://127.0.0.1:{CLOSED}", "http://127.0.0.1:99999", "ftp://127.0.0.1/", "not a url", "", "http://:80"]
WORDS = [
    "",
    "a",
    "x y",
    "0.30.0",
    "0.32.0",
    "9.9.9",
    "latest",
    "../x",
    "{port}",
    "{host}",
    '{"image": 4}',
    "é",
    "steady",
    "sawtooth",
    "realistic",
    "huge",
    "stop",
    "restart",
    "engine",
    "command",
    "attach",
    "\x00",
    "-1",
]
COMMANDS = ["no-such-binary-mmchaos {port}", "", "x '{unbalanced", "no-such-binary-mmchaos --port {port} '{\"a\": 1}'"]
scalars = st.one_of(
    st.integers(-5, 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.sampled_from(WORDS),
    st.text(max_size=12),
)
values = st.one_of(scalars, st.lists(scalars, max_size=4), st.dictionaries(st.sampled_from(WORDS), scalars, max_size=3))
KEYS = {
    "campaign": ["name", "description", "engines", "trials", "target", "command", "url", "model", "seed", "nmae"],
    "workload": ["locustfile", "users", "spawn_rate", "duration", "max_requests", "shape", "userz"],
    "crash": ["policy", "hang_after", "startup_timeout", "max_restarts", "polcy"],
    "config": ["name", "description", "engine", "engines", "flags", "env", "flgs"],
    "workload.options": [*BY_NAME, "nope"],
    "workload.mix": [*WEIGHTS, "valid_imag"],
}


def _value_for(key: str):
    if key == "url":
        return st.sampled_from(URLS)
    if key == "command":
        return st.sampled_from(COMMANDS)
    if key in ("image_dir", "cases_file", "locustfile", "server_log", "results_dir"):
        return st.sampled_from(["", "no-such-thing", "/dev/null", "."])
    return values


@st.composite
def tables(draw, section: str) -> dict:
    keys = draw(st.lists(st.sampled_from(KEYS[section]), max_size=6, unique=True))
    return {k: draw(_value_for(k)) for k in keys}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if v == v and abs(v) != float("inf") else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\x00", "\\u0000") + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{_toml_value(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


@st.composite
def campaign_files(draw) -> str:
    if draw(st.integers(0, 9)) == 0:  # text that is not TOML at all
        return draw(st.text(max_size=200))
    out = []
    for section in ("campaign", "workload", "workload.options", "workload.mix", "crash"):
        if draw(st.booleans()) or section == "campaign":
            body = draw(tables(section))
            if section == "campaign" and draw(st.booleans()):
                body.setdefault("name", draw(st.sampled_from(["fz", "x y", ""])))
            out.append(f"[{section}]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in body.items()))
    for _ in range(draw(st.integers(0, 3))):
        out.append("[[config]]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in draw(tables("config")).items()))
    if draw(st.integers(0, 7)) == 0:
        out.append(f"[{draw(st.sampled_from(['crashes', 'campain', 'x']))}]\na = 1\n")
    return "\n".join(out)


def _files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def _call(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.main(argv)
        except SystemExit as e:  # argparse's own exit (usage errors, --help)
            code = e.code if isinstance(e.code, int) else 2
    return code, err.getvalue()


def _assert_front_door(code: int, stderr: str, argv) -> None:
    assert code in (0, 2), (argv, code, stderr)
    assert "Traceback" not in stderr, (argv, stderr)
    assert len(stderr.strip().splitlines()) <= MAX_STDERR_LINES, (argv, stderr)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@settings(max_examples=FILE_CASES, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=campaign_files())
def test_campaign_files(sandbox, text):
    f = sandbox / "campaign.toml"
    f.write_text(text, errors="replace") if isinstance(text, str) else None
    results = sandbox / "results"
    before = _files_under(sandbox)
    code, stderr = _call(["campaign", "check", str(f), "--results", str(results)])
    _assert_front_door(code, stderr, text)
    assert _files_under(sandbox) == before, text  # check writes nothing, not even the results folder
    if code == 0:
        tomllib.loads(text)  # only a valid file is accepted


SUBCOMMANDS = st.sampled_from(
    [
        ["campaign", "check"],
        ["campaign", "run"],
        ["campaign"],
        ["report"],
        ["serve"],
        ["repro"],
        ["engine", "list"],
        ["engine", "install"],
        ["model", "build"],
        ["predict"],
        ["nope"],
        [],
    ]
)
FLAGS = st.sampled_from(
    [
        "--engine",
        "--port",
        "--url",
        "--command",
        "--timeout",
        "--results",
        "--baseline",
        "--expect",
        "--out",
        "--window",
        "--force",
        "-q",
        "--help",
        "--",
        "--settle",
        "--log",
    ]
)
ARG_VALUES = st.one_of(
    st.sampled_from(
        [
            "0.30.0",
            "0.32.0",
            "9.9.9",
            "latest",
            "99999",
            "-1",
            "0",
            "8000",
            "nan",
            "a=b",
            "v0.30-default=fails",
            "x=maybe",
            "no-such-dir",
            "",
            "--",
            *URLS,
            *COMMANDS,
        ]
    ),
    st.text(max_size=8),
)


@settings(max_examples=ARGV_CASES, deadline=None, suppress_health_check=list(HealthCheck))
@given(sub=SUBCOMMANDS, rest=st.lists(st.one_of(FLAGS, ARG_VALUES), max_size=6))
@pytest.mark.integration  # a --command it draws is tried: exec fails, as a user's would
def test_command_lines(sandbox, monkeypatch, sub, rest):
    home = sandbox / "home"  # no engine, no model: nothing can start
    monkeypatch.setenv("MMCHAOS_HOME", str(home))
    monkeypatch.setenv("MMCHAOS_RESULTS", str(sandbox / "results"))
    if sub == ["engine", "install"]:  # only what fails before pip would be asked
        rest = [a for a in rest if not a[:1].isdigit()]
    if sub[:1] == ["campaign"] and sub[1:] == ["run"]:
        rest = [str(sandbox / "no-such.toml"), *[a for a in rest if a.startswith("-")]]
    before = _files_under(sandbox)
    code, stderr = _call([*sub, *rest])
    _assert_front_door(code, stderr, [*sub, *rest])
    made = {p for p in _files_under(sandbox) - before if home not in p.parents and p != home}
    assert not made, made
