"""The scale-out commands of `mmchaos`: a Locust worker for a campaign's master on another machine, and the
Kubernetes manifests of a campaign configuration."""

from __future__ import annotations

import argparse
import sys

from . import arg_types

COMMANDS = ("worker", "k8s")


class CommandError(Exception):
    """One line: what is wrong, what to do."""


def add_parsers(sub) -> None:
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

    k = sub.add_parser(
        "k8s",
        help="Kubernetes manifests for one configuration of a campaign: the campaign's master, "
        "N Locust workers and an example vLLM server (printed; docs/kubernetes.md)",
    )
    k.add_argument("campaign", help="the campaign file")
    k.add_argument("--config", required=True, help="the configuration to run")
    k.add_argument("--workers", type=arg_types.positive_int, required=True, help="Locust worker pods (one core each)")
    k.add_argument("--image", required=True, help="the mmchaos image (deploy/Dockerfile), as the cluster pulls it")
    k.add_argument("--namespace", default="mmchaos", help="default: mmchaos")
    k.add_argument("--results-size", default="10Gi", help="the results volume (default 10Gi)")
    k.add_argument(
        "--vllm-image",
        help="the example server's image (default: vllm/vllm-openai at the "
        "configuration's engine version, else v0.30.0)",
    )
    k.add_argument(
        "--model",
        help="the model the server loads (default: the campaign's); a path is read from the "
        "PersistentVolumeClaim mmchaos-models",
    )


def run(a, say) -> int:
    if a.cmd == "worker":
        return _worker(a, say)
    return _k8s(a)


def _worker(a, say) -> int:
    from .worker import WorkerError, serve

    try:
        return serve(a.master_host, a.master_port, a.locustfile, a.processes, once=a.once, say=say)
    except WorkerError as e:
        raise CommandError(str(e)) from e


def _k8s(a) -> int:
    from . import campaign_plan, k8s

    plan = campaign_plan.load(a.campaign, check_flags=False)  # the cluster's vLLM, not an engine here, judges them
    try:
        text = k8s.render(
            plan,
            a.config,
            workers=a.workers,
            image=a.image,
            namespace=a.namespace,
            results_size=a.results_size,
            vllm_image=a.vllm_image,
            model_path=a.model,
        )
    except ValueError as e:
        raise CommandError(str(e)) from e
    sys.stdout.write(text)
    return 0


def _count(text: str) -> int:
    if text != "-1" and not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes (-1: one per core)")
    return int(text)
