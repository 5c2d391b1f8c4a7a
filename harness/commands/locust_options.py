"""`mmchaos locust-options`: the options mmchaos adds to Locust, with their defaults. Locust prints its ``--help``
before it loads a locustfile, so ``locust -f locustfiles/embeddings.py --help`` cannot show them; this lists the
one table they come from (mmchaos/options.py), as flags for `locust` and keys for a campaign's
``[workload.options]``."""

from __future__ import annotations

from rich.table import Table

from mmchaos import options

from .common import console


def add_parser(sub) -> None:
    p = sub.add_parser(
        "locust-options",
        help="the options mmchaos adds to Locust (locust --help cannot show them: it prints before the locustfile "
        "loads)",
    )
    p.set_defaults(func=run)


def run(a) -> int:
    rows = [(o.flag, o.name, _shown(o.default), "yes" if o.ui else "no", o.help) for o in options.OPTIONS]
    if not console.is_terminal:  # piped: whole lines, tab-separated, under a header, nothing cut
        print("flag\tkey\tdefault\tweb_ui\thelp")
        for row in rows:
            print("\t".join(row))
        return 0
    t = Table("flag (locust)", "key (\\[workload.options])", "default", "in the web UI", "what it does")
    t.columns[0].no_wrap = t.columns[1].no_wrap = True  # names are what people copy
    for row in rows:
        t.add_row(*row)
    console.print(t)
    return 0


def _shown(value: object) -> str:
    return "(none)" if value in (None, "") else str(value)
