"""One command-line vocabulary: every default said in --help, each option name meaning one idea in every command,
the old names still taken (and said to be old)."""

from __future__ import annotations

import argparse

import pytest

from mmchaos.harness.cli import build_parser

# an option name -> words its help says in every command that has it: one idea per name
IDEAS = {
    "--out": ("folder", "root", "where to write"),
    "--startup-timeout": ("/health",),
    "--server-log": ("log",),
    "--config": ("configuration",),
    "--engine": ("vllm version", "engine", "version"),
    "--url": ("url",),
    "--model": ("model",),
    "--seed": ("seed",),
    "--settle": ("seconds",),
    "--repeats": ("fresh server",),
    "--max-starts": ("start",),
}
OLD = {"--results": "--out", "--timeout": "--startup-timeout", "--log": "--server-log"}


def _options() -> list[tuple[str, argparse.Action]]:
    out = []

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    walk(sp, f"{path} {name}".strip())
            elif a.option_strings and a.dest != "help" and a.default is not argparse.SUPPRESS:
                out.append((path, a))

    walk(build_parser(), "")
    return out


def test_every_default_is_said_in_help():
    quiet = (None, False, [], True)
    missing = [
        f"{cmd} {a.option_strings[0]} (default {a.default!r})"
        for cmd, a in _options()
        if a.default not in quiet and "default" not in (a.help or "").lower()
    ]
    assert not missing, missing


def test_no_help_prints_an_escaped_percent():
    """argparse formats an option's help with %, not a parser's description: "95 %%" showed in predict's."""

    def helps(p: argparse.ArgumentParser, path: str):
        yield path, p.format_help()
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    yield from helps(sp, f"{path} {name}".strip())

    assert [path for path, text in helps(build_parser(), "mmchaos") if "%%" in text] == []


def test_each_name_means_one_idea_in_every_command():
    wrong = [
        f"{cmd} {name}: {a.help}"
        for cmd, a in _options()
        for name in a.option_strings[:1]
        if name in IDEAS and not any(w in (a.help or "").lower() for w in IDEAS[name])
    ]
    assert not wrong, wrong


def test_old_names_are_aliases_of_the_new_and_said_to_be_old():
    for cmd, a in _options():
        for old in set(a.option_strings) & set(OLD):
            assert a.option_strings[0] == OLD[old] and f"{old}: old name" in (a.help or ""), (cmd, a.option_strings)
    # a versions flag set is no campaign configuration: its canonical name is another
    [flag_set] = [a for cmd, a in _options() if cmd == "versions" and "--config" in a.option_strings]
    assert flag_set.option_strings[0] == "--flag-set"


@pytest.mark.parametrize(
    "argv, dest, value",
    [
        (["campaign", "run", "c.toml", "--results", "r"], "results", "r"),
        (["campaign", "run", "c.toml", "--out", "r"], "results", "r"),
        (["serve", "--engine", "0.32.0", "--timeout", "9"], "timeout", 9.0),
        (["serve", "--engine", "0.32.0", "--startup-timeout", "9"], "timeout", 9.0),
        (["repro", "--url", "http://127.0.0.1:1", "--log", "x.log"], "log", "x.log"),
        (["versions", "--config", "a=--x", "--results", "v"], "config", ["a=--x"]),
    ],
)
def test_old_and_new_names_land_in_the_same_place(argv, dest, value):
    assert getattr(build_parser().parse_args(argv), dest) == value


def test_the_options_mmchaos_adds_to_locust_are_listed_where_a_user_can_find_them(capsys):
    """Locust prints its --help before it loads a locustfile, so `mmchaos locust-options` is where they are."""
    from mmchaos import options
    from mmchaos.harness import cli

    assert cli.main(["locust-options"]) == 0
    out = capsys.readouterr().out
    assert all(o.flag in out for o in options.OPTIONS), [o.flag for o in options.OPTIONS if o.flag not in out]


class _ReaderGoneAfterOneLine:
    """A stdout whose reader closes the pipe after the first line (`| head -1`)."""

    def __init__(self, fd: int):
        self.lines: list[str] = []
        self.fd = fd

    def write(self, text: str) -> int:
        if "\n" in "".join(self.lines):
            raise BrokenPipeError(32, "Broken pipe")
        self.lines.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.fd


@pytest.mark.parametrize("argv", [["locust-options"], ["model", "list"]])
def test_a_listing_whose_reader_goes_away_ends_quietly(argv, monkeypatch, tmp_path, capsys):
    """`mmchaos locust-options | head -1`: a header of tab-separated names, then exit 0 without a traceback when the
    reader closes the pipe."""
    from mmchaos.harness import cli

    with open(tmp_path / "out", "w") as f:
        gone = _ReaderGoneAfterOneLine(f.fileno())
        monkeypatch.setattr("sys.stdout", gone)
        assert cli.main(argv) == 0
    [header] = "".join(gone.lines).splitlines()
    assert header.split("\t")[0] in ("flag", "model")
    assert "Traceback" not in capsys.readouterr().err
