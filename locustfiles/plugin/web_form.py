"""The web UI's start form, as Locust hands it over: field names it mangles, fields it drops.

No Locust import here: tested in the test process, which must not monkey-patch.
"""

from __future__ import annotations

import logging

log = logging.getLogger("mmchaos")


def _norm(name: str) -> str:
    return name.replace("_", "").lower()


def apply_mangled_form_fields(parsed_options, form) -> list[str]:
    """The web UI's form renames fields snake -> camel -> snake on the way, which is not a round trip for names
    with digits (``base64_fraction`` comes back as ``base_64_fraction``), and Locust's /swarm drops fields it
    does not know. Apply those to the option they came from, converted as /swarm converts. Returns the names."""
    known = vars(parsed_options)
    by_norm = {_norm(k): k for k in known}
    applied = []
    for key, value in form.items():
        name = by_norm.get(_norm(key))
        if key in known or name is None:
            continue
        current = known[name]
        try:
            if isinstance(current, bool):
                known[name] = value == "true"
            elif current is None or isinstance(current, list):
                known[name] = value
            else:
                known[name] = type(current)(value)
        except ValueError:
            log.error("mmchaos: form field %s: %r is not a valid %s", name, value, type(current).__name__)
            continue
        applied.append(name)
    return applied
