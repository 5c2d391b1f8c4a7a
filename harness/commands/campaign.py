"""`mmchaos campaign`: run a campaign file, check it, or print its JSON Schema."""

from __future__ import annotations

import sys
from pathlib import Path

from mmchaos import paths

from .. import arg_types
from .common import also_redact, console


def add_parser(sub) -> None:
    c = sub.add_parser("campaign", help="run a campaign file: versions × flag configurations × trials")
    csub = c.add_subparsers(dest="action", required=True)
    cr = csub.add_parser("run", help="run it (finished trials are skipped: a re-run resumes)")
    cr.add_argument("file")
    cr.add_argument("--force", action="store_true", help="re-run finished trials too")
    cr.add_argument(
        "--out", "--results", dest="results", help=f"results root (default: {paths.results_dir()}; --results: old name)"
    )
    cr.add_argument(
        "--web-port",
        type=arg_types.port,
        metavar="PORT",
        help="run each trial's Locust with its web UI on http://127.0.0.1:PORT (watch it, fire faults by hand from "
        "its mmchaos faults page) instead of headless",
    )
    cc = csub.add_parser("check", help="validate the file as run would, without running or writing anything")
    cc.add_argument("file")
    cc.add_argument(
        "--out",
        "--results",
        dest="results",
        help=f"results root to check (default: {paths.results_dir()}; --results: old name)",
    )
    csub.add_parser(
        "schema",
        help="print the JSON Schema of campaign files (for editors: the shipped files name "
        "campaigns/campaign.schema.json in their first line)",
    )
    c.set_defaults(func=run)


def run(a) -> int:
    from ..campaign import plan as campaign_plan
    from ..campaign import runner as campaign_runner
    from ..campaign.progress import CampaignProgress

    if a.action == "schema":
        from mmchaos import campaign_file

        sys.stdout.write(campaign_file.json_schema_text())
        return 0
    camp = campaign_plan.load(a.file)
    also_redact(s for cfg in camp.configs for s in campaign_runner.make_target(camp, cfg).secrets())
    results = Path(a.results) if a.results else None
    # the same checks for both, before anything starts or is written: attach URL, results folder
    campaign_runner.preflight(camp, results or paths.results_dir())
    if a.action == "check":
        points = f" × {len(camp.points)} sweep points" if camp.sweep else ""
        print(f"{camp.path}: ok — {len(camp.configs)} configurations{points} × {camp.trials} trials")
        return 0
    runner = campaign_runner.CampaignRunner(camp, results, force=a.force, web_port=a.web_port)
    if a.web_port:
        console.print(f"each trial's web UI: http://127.0.0.1:{a.web_port} (faults by hand: ./mmchaos/faults)")
    with CampaignProgress(camp, console) as progress:
        runner.progress = progress.update
        try:
            done = runner.run()
        except KeyboardInterrupt:
            console.print("interrupted: servers and Locust stopped; partial results kept (re-run to resume)")
            return 130
    progress.summary(done)
    out = (results or paths.results_dir()) / camp.name
    console.print(f"results: {out}  (next: mmchaos report {out})")
    return 1 if any(r.status == campaign_runner.FAILED for r in done) else 0
