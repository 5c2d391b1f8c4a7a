"""`mmchaos worker`: a Locust worker for a campaign's master on another machine."""

from __future__ import annotations

import argparse

from .. import arg_types
from .common import say


def add_parser(sub) -> None:
    w = sub.add_parser(
        "worker",
        help="a Locust worker for a campaign's master on another machine; it joins the "
        "master's runs one after the other until Ctrl-C",
        description="Runs `locust --worker` for the master at --master-host:--master-port, again "
        "after each run (a campaign runs a master per trial). Its rows go to the master.",
    )
    w.add_argument("--master-host", required=True, help="the campaign machine's address")
    w.add_argument(
        "--master-port",
        type=arg_types.port,
        default=5557,
        help="the campaign's [workload] master_bind_port (default 5557)",
    )
    w.add_argument("--locustfile", help="the campaign's locustfile, when it is not mmchaos's realistic mix")
    w.add_argument(
        "--processes",
        type=_count,
        default=0,
        help="Locust worker processes on this machine (Locust's --processes; default 1, -1: one per core)",
    )
    w.add_argument("--once", action="store_true", help="one run, then exit with its code")
    w.set_defaults(func=run)


def run(a) -> int:
    from ..campaign.worker import serve

    return serve(a.master_host, a.master_port, a.locustfile, a.processes, once=a.once, say=say)


def _count(text: str) -> int:
    if text != "-1" and not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes (-1: one per core)")
    return int(text)
