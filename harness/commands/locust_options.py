"""`mmchaos locust-options`: the options mmchaos adds to Locust, with their defaults. Locust prints its ``--help``
before it loads a locustfile, so ``locust -f locustfiles/embeddings.py --help`` cannot show them; this lists the
one table they come from (mmchaos/options.py), as flags for `locust` and keys for a campaign's
``[workload.options]``."""

from __future__ import annotations

from mmchaos import options

from .common import listing


def add_parser(sub) -> None:
    p = sub.add_parser(
        "locust-options",
        help="the options mmchaos adds to Locust (locust --help cannot show them: it prints before the locustfile "
        "loads)",
    )
    p.set_defaults(func=run)


def run(a) -> int:
    columns = [
        ("flag", "flag (locust)"),
        ("key", "key ([workload.options])"),
        ("default", "default"),
        ("web_ui", "in the web UI"),
        ("help", "what it does"),
    ]
    rows = [(o.flag, o.name, _shown(o.default), "yes" if o.ui else "no", o.help) for o in options.OPTIONS]
    listing(columns, rows)
    return 0


def _shown(value: object) -> str:
    return "(none)" if value in (None, "") else str(value)
