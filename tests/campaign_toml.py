"""The tests' one campaign writer: a campaign file from its sections given as dicts, written as TOML (what a user
writes by hand). By default a campaign of one trial of the mix against the stand-in server, stopped at its first
crash. Each section given is laid over its default; a key given ``None`` is left out (an engine campaign has no
command, a trace replay no locustfile)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomli_w
from conftest import TESTS

STANDIN = f"{sys.executable} {TESTS / 'standin_server.py'} --port {{port}}"
LOCUSTFILE = str(TESTS.parent / "locustfiles" / "embeddings.py")

DEFAULTS: dict[str, dict] = {
    "campaign": {"name": "standin", "trials": 1, "target": "command", "command": STANDIN},
    "workload": {"locustfile": LOCUSTFILE, "users": 3, "spawn_rate": 3, "duration": 4},
    "options": {"image_preset": "small", "pool_size": 16},
    "mix": {},
    "crash": {"policy": "stop", "startup_timeout": 30},
}


def _laid_over(default: dict, given: dict | None) -> dict:
    return {k: v for k, v in {**default, **(given or {})}.items() if v is not None}


def write_campaign(
    path: Path,
    *,
    configs: list[dict] | None = None,
    faults: list[dict] | None = None,
    campaign: dict | None = None,
    workload: dict | None = None,
    options: dict | None = None,
    mix: dict | None = None,
    crash: dict | None = None,
) -> Path:
    """Write the campaign to ``path`` (a folder: its ``campaign.toml``) and return the file. ``configs``: the
    ``[[config]]`` tables (default one, ``a``); ``faults``: the ``[[fault]]`` tables."""
    f = path / "campaign.toml" if path.is_dir() else path
    load = _laid_over(DEFAULTS["workload"], workload)
    for name, given in (("options", options), ("mix", mix)):
        section = _laid_over(DEFAULTS[name], given)
        if section:
            load[name] = section
    doc = {"campaign": _laid_over(DEFAULTS["campaign"], campaign), "workload": load}
    doc["crash"] = _laid_over(DEFAULTS["crash"], crash)
    tables = _tables("config", configs if configs is not None else [{"name": "a"}]) + _tables("fault", faults or [])
    f.write_text(tomli_w.dumps(doc) + tables)
    return f


def _tables(key: str, items: list[dict]) -> str:
    """``[[key]]`` tables as a user writes them (tomli-w writes short ones inline, ``key = [{...}]``); a table
    inside one (a configuration's ``env``) as ``[key.env]``."""
    return "".join(
        f"\n[[{key}]]\n" + re.sub(r"^\[(.+)\]$", rf"[{key}.\1]", tomli_w.dumps(item), flags=re.M) for item in items
    )
