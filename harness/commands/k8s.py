"""`mmchaos k8s`: the Kubernetes manifests of one configuration of a campaign (docs/kubernetes.md)."""

from __future__ import annotations

import sys

from .. import arg_types
from .common import CommandError


def add_parser(sub) -> None:
    k = sub.add_parser(
        "k8s",
        help="Kubernetes manifests for one configuration of a campaign: the campaign's master, "
        "N Locust workers and an example vLLM server (printed; docs/kubernetes.md)",
    )
    k.add_argument("campaign", help="the campaign file")
    k.add_argument("--config", required=True, help="the configuration to run")
    k.add_argument("--workers", type=arg_types.positive_int, help="Locust worker pods (one core each); required")
    k.add_argument(
        "--image", help="the mmchaos image (deploy/Dockerfile), as the cluster pulls it; required (but with --faults)"
    )
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
    k.add_argument(
        "--faults",
        action="store_true",
        help="print instead the campaign's [[fault]] tables as a Chaos Mesh Workflow (apply it when the load starts)",
    )
    k.set_defaults(func=run)


def run(a) -> int:
    from ..campaign import plan as campaign_plan
    from ..k8s import chaos_mesh
    from ..k8s import manifests as k8s

    plan = campaign_plan.load(a.campaign, check_flags=False)  # the cluster's vLLM, not an engine here, judges them
    try:
        if a.faults:
            sys.stdout.write(chaos_mesh.render(plan, a.config, a.namespace))
            return 0
        missing = [f"--{n}" for n in ("workers", "image") if getattr(a, n) is None]
        if missing:
            raise CommandError(f"the manifests need {' and '.join(missing)} (--faults prints the faults alone)")
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
