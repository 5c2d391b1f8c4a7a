"""mkdocs hooks: the pages made from the code at every build, so they cannot drift from it.

- ``index.md``: the repository's README.md, its ``docs/...`` links made relative to this site;
- ``reference/cli.md``: every `mmchaos` command and option, from the argparse parser the command itself runs.

Nothing generated is committed: ``mkdocs build --strict`` makes them from the installed package each time.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import os
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def readme_as_index() -> str:
    # the README links into docs/ from the repository's root; the site's root is docs/ itself
    return re.sub(r"\]\(docs/", "](", README.read_text(encoding="utf-8"))


# --- the CLI reference ------------------------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand, in the parser's order."""
    out = []
    for action in parser._actions:  # argparse keeps no public list of its subparsers
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            out += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return out


def _expand(action: argparse.Action, prog: str) -> str:
    """An option's help as --help prints it: %(default)s and friends filled in."""
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = prog
    for k in ("choices",):
        if params.get(k) is not None:
            params[k] = ", ".join(map(str, params[k]))
    try:
        return action.help % params
    except (KeyError, TypeError, ValueError):
        return action.help


def _text(text: str) -> str:
    """Help text as Markdown shows it literally: "results/<campaign>" is not an HTML tag."""
    return html.escape(text, quote=False)


def _cell(text: str) -> str:
    return text.replace("|", r"\|").replace("\n", " ")


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        # as --help names it: "-q, --quiet", "--flavor {cpu,cuda}", "versions"
        name = ", ".join(f"`{part}`" for part in formatter._format_action_invocation(a).split(", "))
        info = _text(_expand(a, parser.prog))
        if (
            a.option_strings
            and a.nargs != 0
            and a.default not in (None, [], argparse.SUPPRESS)
            and "default" not in info
        ):
            info += f" (default: `{a.default}`)"
        if a.required and a.option_strings:
            info = "required. " + info
        rows.append(f"| {_cell(name)} | {_cell(info)} |")
    return rows


def _command_section(name: str, help_: str, parser: argparse.ArgumentParser, depth: int) -> list[str]:
    lines = [f"{'#' * depth} `{parser.prog}`", ""]
    text = parser.description or help_
    if text:
        lines += [_text(text.replace("%%", "%")), ""]
    subs = _subcommands(parser)
    usage = parser.format_usage().removeprefix("usage: ").strip()
    lines += ["```", usage, "```", ""]
    rows = _option_rows(parser)
    if rows:
        lines += ["| argument | what it does |", "|---|---|", *rows, ""]
    if subs:
        lines += [f"- [`{s.prog}`](#{_anchor(s.prog)}): {_text(h)}" for _, h, s in subs] + [""]
    for sub_name, sub_help, sub in subs:
        lines += _command_section(sub_name, sub_help, sub, min(depth + 1, 4))
    return lines


def _anchor(prog: str) -> str:
    # Python-Markdown's toc slug of a heading "`mmchaos engine install`"
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", prog).strip().lower())


@contextlib.contextmanager
def _as_in_a_checkout():
    """Help texts that name folders name them at their defaults in a checkout, not on the machine that builds the
    site; usage lines are wrapped as on a terminal 100 columns wide."""
    saved = {k: os.environ.pop(k, None) for k in ("MMCHAOS_HOME", "MMCHAOS_RESULTS", "COLUMNS")}
    os.environ["COLUMNS"] = "100"
    try:
        yield
    finally:
        os.environ.pop("COLUMNS")
        os.environ.update({k: v for k, v in saved.items() if v is not None})


def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    with _as_in_a_checkout():
        if parser is None:
            from mmchaos.harness.cli import build_parser

            parser = build_parser()
        lines = [
            "# Command-line reference",
            "",
            "Generated at every build from the parser `mmchaos` itself runs; `mmchaos COMMAND --help` prints the same.",
            "",
            "| command | what it is for |",
            "|---|---|",
        ]
        lines += [f"| [`{s.prog}`](#{_anchor(s.prog)}) | {_cell(_text(h))} |" for _, h, s in _subcommands(parser)]
        lines.append("")
        for name, help_, sub in _subcommands(parser):
            lines += _command_section(name, help_, sub, 2)
    return "\n".join(lines).replace(f"{ROOT}/", "") + "\n"


# --- the campaign file reference -------------------------------------------------------------------------------


def _type_name(annotation) -> str:
    """A key's type as a campaign file's author reads it."""
    import typing

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f'`"{a}"`' for a in args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        names = [_type_name(a) for a in args if a is not type(None)]
        return "number" if names == ["integer", "float"] else " or ".join(names)
    if origin is list:
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return "table"
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return "table"
    return {int: "integer", float: "float", str: "string", bool: "boolean"}.get(annotation, str(annotation))


def _bounds(info) -> str:
    words = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    out = [f"{words[k]} {getattr(m, k)}" for m in info.metadata for k in words if getattr(m, k, None) is not None]
    pattern = next((m.pattern for m in info.metadata if getattr(m, "pattern", None)), None)
    return ", ".join(out + ([f"matches `{pattern}`"] if pattern else []))


def _default(info) -> str:
    import json

    from pydantic import BaseModel

    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):  # a table of its own, described where it is
        return "—"
    return f"`{json.dumps(value)}`"


def campaign_reference() -> str:
    from mmchaos import campaign_file

    lines = [
        "# Campaign file reference",
        "",
        "Generated at every build from the models `mmchaos campaign check` validates with "
        "(`mmchaos/campaign_file.py`); `mmchaos campaign schema` prints the same as a JSON Schema, and the "
        "shipped campaign files name it in their first line (`#:schema ./campaign.schema.json`) so editors "
        "with a TOML language server (taplo, Even Better TOML) complete and check them.",
        "",
    ]
    titles = {
        "campaign": "[campaign]",
        "workload": "[workload]",
        "workload.mix": "[workload.mix]",
        "workload.options": "[workload.options]",
        "crash": "[crash]",
        "config": "[[config]]",
        "fault": "[[fault]]",
    }
    for name, model in campaign_file.SECTIONS.items():
        lines += [
            f"## `{titles.get(name, name)}`",
            "",
            _text((model.__doc__ or "").strip()),
            "",
            "| key | type | default | bounds | what it does |",
            "|---|---|---|---|---|",
        ]
        for key, info in model.model_fields.items():
            lines.append(
                f"| `{key}` | {_type_name(info.annotation)} | {_cell(_default(info))} | "
                f"{_cell(_bounds(info))} | {_cell(_text(info.description or ''))} |"
            )
        lines.append("")
    lines += ["## `[sweep]`", "", _text(campaign_file.CampaignFile.model_fields["sweep"].description or ""), ""]
    return "\n".join(lines) + "\n"


GENERATED = {"reference/cli.md": cli_reference, "reference/campaign.md": campaign_reference}


# --- mkdocs hooks -----------------------------------------------------------------------------------------------


def on_files(files: Files, config) -> Files:
    files.append(File.generated(config, "index.md", content=readme_as_index()))
    for uri, make in GENERATED.items():
        files.append(File.generated(config, uri, content=make()))
    return files


def on_serve(server, config, builder):
    server.watch(str(README))  # `mkdocs serve` rebuilds when the README changes
    return server
