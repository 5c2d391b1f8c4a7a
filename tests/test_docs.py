"""The front page and the docs site: the README stays a page a newcomer reads in five minutes, its command table
names every command, and the site builds strict (a broken link, anchor or page fails) with the generated pages."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

import pytest

from mmchaos.harness.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_CHARS = 8000


def _hooks():
    spec = importlib.util.spec_from_file_location("mmchaos_docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _commands(parser: argparse.ArgumentParser, prefix: str = "mmchaos") -> list[tuple[str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += [(f"{prefix} {name}", sub), *_commands(sub, f"{prefix} {name}")]
    return out


def test_readme_is_short():
    size = len(README.read_text(encoding="utf-8"))
    assert size <= README_MAX_CHARS, f"README.md is {size} characters; move detail to docs/ (bound {README_MAX_CHARS})"


def test_readme_command_table_names_every_command():
    text = README.read_text(encoding="utf-8")
    table = text[text.index("## Which command do I want?") :]
    top = [name.split()[1] for name, _ in _commands(build_parser()) if name.count(" ") == 1]
    missing = [cmd for cmd in top if not re.search(rf"`(mmchaos )?{cmd}\b", table)]
    assert not missing, f"the README's command table does not name: {', '.join(missing)}"


def test_cli_reference_has_every_command_and_option():
    page = _hooks().cli_reference()
    for name, parser in _commands(build_parser()):
        assert f"## `{name}`" in page, name
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in page, f"{name} {flag}"


def test_cli_reference_names_no_machine_path():
    page = _hooks().cli_reference()
    assert str(ROOT) not in page and "/work/" not in page


def test_site_builds_strict(tmp_path):
    mkdocs_config = pytest.importorskip("mkdocs.config")
    from mkdocs.commands import build

    cfg = mkdocs_config.load_config(str(ROOT / "mkdocs.yml"), strict=True, site_dir=str(tmp_path / "site"))
    build.build(cfg)  # raises on any warning (strict): a broken link, anchor, or a page left out of the nav
    index = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "Which command do I want?" in index  # the home page is the README
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "mmchaos campaign run" in cli


def test_strict_build_fails_on_a_broken_link(tmp_path):
    """The site's own strictness (its `strict` and `validation`) turns a link to a missing page into a failure."""
    import yaml
    from mkdocs.commands import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort

    ours = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# x\n\n[gone](nowhere.md)\n")
    yml = tmp_path / "mkdocs.yml"
    yml.write_text(
        yaml.safe_dump(
            {
                "site_name": "x",
                "strict": ours["strict"],
                "validation": ours["validation"],
                "nav": [{"Home": "index.md"}],
            }
        )
    )
    with pytest.raises(Abort):
        build.build(load_config(str(yml), site_dir=str(tmp_path / "site")))


def test_campaign_reference_has_every_key_of_every_section():
    from mmchaos import campaign_file

    page = _hooks().campaign_reference()
    for model in campaign_file.SECTIONS.values():
        for key in model.model_fields:
            assert f"| `{key}` |" in page, key
