"""The `mmchaos` command's one error path: every command is dispatched by its parser (harness/commands/, one module
each), and whatever a command raises as an MmchaosError ends as one line on stderr and the error's exit code."""

from __future__ import annotations

import argparse

import pytest
from cli_inprocess import mmchaos

from mmchaos.errors import MmchaosError, one_line
from mmchaos.harness import cli
from mmchaos.harness.commands import common, engine, report, serve

MODULES = {m.__name__.rsplit(".", 1)[1].replace("_", "-"): m for m in cli.COMMANDS}  # locust_options: locust-options


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_command_has_a_module_whose_run_its_parser_calls():
    commands = _subparsers(cli.build_parser())
    assert list(commands) == list(MODULES)  # one module each, named as the command
    for name, module in MODULES.items():
        assert commands[name].get_default("func") is module.run, name


@pytest.mark.parametrize(
    "argv",
    [
        ["engine", "list"],
        ["engine", "install", "0.30.0"],
        ["model", "list"],
        ["model", "build"],
        ["campaign", "schema"],
        ["campaign", "check", "f.toml"],
        ["trace", "export", "folder", "log.jsonl"],
        ["trace", "import", "log.jsonl", "folder"],
        ["serve", "--engine", "0.30.0"],
        ["predict", "dir", "--rps", "1"],
        ["worker", "--master-host", "h"],
        ["k8s", "c.toml", "--config", "x", "--workers", "1", "--image", "i"],
        ["hunt", "--url", "http://127.0.0.1:1"],
    ],
)
def test_a_subcommand_of_a_command_reaches_the_commands_run(argv):
    a = cli.build_parser().parse_args(argv)
    assert a.func is MODULES[argv[0]].run


class _Unready(MmchaosError):
    exit_code = 3


def _raising(error: BaseException):
    def run(a) -> int:
        raise error

    return run


def test_an_mmchaos_error_is_one_line_and_its_exit_code(monkeypatch):
    # markup and a newline in the message are shown as written, on one line
    monkeypatch.setattr(engine, "run", _raising(_Unready("not ready [bold]yet[/bold]\nsecond line")))
    r = mmchaos("engine", "list")
    assert r.returncode == 3 and r.stdout == ""
    assert r.stderr.strip().splitlines() == ["mmchaos: not ready [bold]yet[/bold]\\nsecond line"]
    assert "Traceback" not in r.stderr


def test_an_error_may_carry_its_own_exit_code(monkeypatch):
    monkeypatch.setattr(engine, "run", _raising(common.CommandError("cannot", exit_code=4)))
    r = mmchaos("engine", "list")
    assert r.returncode == 4 and r.stderr.strip() == "mmchaos: cannot"
    assert common.CommandError("x").exit_code == 2 and MmchaosError.exit_code == 2  # the class keeps its own


def test_the_report_says_its_errors_as_it_always_has(monkeypatch):
    from mmchaos.analysis.report import ReportError

    monkeypatch.setattr(report, "run", _raising(ReportError("baseline 'x' is not a configuration")))
    r = mmchaos("report", "somewhere")
    assert r.returncode == 2 and r.stderr.strip() == "mmchaos report: baseline 'x' is not a configuration"


def test_the_error_line_masks_secrets(monkeypatch):
    key = "sekret-key-7f3a9c"
    monkeypatch.setattr(engine, "run", _raising(common.CommandError(f"server refused key {key}")))
    r = mmchaos("engine", "list", env={"MMCHAOS_API_KEY": key})
    assert r.returncode == 2 and key not in r.stderr and r.stderr.startswith("mmchaos: server refused key ")


def test_a_bug_is_not_dressed_as_a_user_error(monkeypatch):
    monkeypatch.setattr(engine, "run", _raising(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        mmchaos("engine", "list")


def test_interrupted_is_130(monkeypatch):
    monkeypatch.setattr(engine, "run", _raising(KeyboardInterrupt()))
    r = mmchaos("engine", "list")
    assert r.returncode == 130 and r.stderr.strip() == "interrupted"


def test_flags_after_the_dash_dash_go_to_the_commands_that_take_them(monkeypatch):
    seen = {}

    def run(a) -> int:
        seen["flags"] = a.passthrough
        return 0

    monkeypatch.setattr(serve, "run", run)
    assert mmchaos("serve", "--engine", "0.30.0", "--", "--max-model-len", "512").returncode == 0
    assert seen["flags"] == ["--max-model-len", "512"]
    r = mmchaos("engine", "list", "--", "--max-model-len", "512")
    assert r.returncode == 2 and r.stderr.strip() == "mmchaos: flags after -- are only for serve, repro and hunt"
    assert {name for name, p in _subparsers(cli.build_parser()).items() if p.get_default("passthrough") == []} == {
        "serve",
        "repro",
        "hunt",
    }


def test_the_projects_user_errors_are_mmchaos_errors():
    from mmchaos.analysis.report import ReportError
    from mmchaos.auth import ApiKeyError
    from mmchaos.campaign_file import FileProblem
    from mmchaos.harness.campaign.plan import CampaignError
    from mmchaos.harness.campaign.worker import WorkerError
    from mmchaos.harness.injection.proxy import ProxyError
    from mmchaos.harness.minimize.minimizer import MinimizeError
    from mmchaos.harness.servers.engines import EngineError
    from mmchaos.harness.servers.model import ModelError
    from mmchaos.harness.servers.server import ServerError
    from mmchaos.options import OptionError
    from mmchaos.payloads.catalogue import CaseFileError
    from mmchaos.payloads.request_log import LogError
    from mmchaos.payloads.traces import TraceError
    from mmchaos.signatures import SignatureError

    for cls in (
        ApiKeyError,
        SignatureError,
        FileProblem,
        OptionError,
        TraceError,
        LogError,
        CaseFileError,
        ReportError,
        CampaignError,
        EngineError,
        ProxyError,
        MinimizeError,
        ModelError,
        ServerError,
        WorkerError,
        common.CommandError,
    ):
        assert issubclass(cls, MmchaosError), cls
    for cls in (FileProblem, OptionError, TraceError, CaseFileError, ReportError):
        assert issubclass(cls, ValueError), cls  # still caught where a ValueError is
    assert str(FileProblem("bad key", "workload", "users")) == "bad key"


def test_one_line_escapes_control_characters():
    assert one_line("a\nb\tc\x1b[31m") == "a\\nb\\tc\\x1b[31m"
    assert MmchaosError("x\ny").line() == "mmchaos: x\\ny"
