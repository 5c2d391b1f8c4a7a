"""A campaign's faults as one Chaos Mesh Workflow for the cluster `mmchaos k8s` renders (``--faults``).

Each fault is a branch of a Parallel template: a Suspend until its ``at`` (seconds after the Workflow is applied:
apply it when the load starts), then the fault. Chaos Mesh acts on pods and links, not on one process of a
container, so the kinds map to what it has (docs/kubernetes.md says how each differs from the local fault):

- ``kill`` (a TP worker, the engine core, an API server): PodChaos ``container-kill`` of the vLLM container. Locally
  each of those kills takes the whole server down (docs/faults.md), which is what a container kill does.
- ``latency``, ``bandwidth``: NetworkChaos ``delay`` / ``bandwidth`` on the link between the Locust workers and vLLM;
  ``silence``: NetworkChaos ``partition`` (nothing answered); ``slow_read``: ``bandwidth`` on vLLM's side of the link.
- ``reset``: HTTPChaos ``abort`` of vLLM's responses (connections cut; not after N bytes).
- operator actions: Chaos Mesh has none, so a Task posts to the vLLM Service's route with curl, waits ``duration``
  and posts the undo (``/resume``, ``/wake_up``), the API key from the Secret when the server has one.

A ``stop`` (SIGSTOP of one process) has no Chaos Mesh form and a fault due ``after_requests`` has no clock: both are
refused in one line.
"""

from __future__ import annotations

from mmchaos import faults
from mmchaos.faults import Fault

from ..campaign.plan import CampaignPlan
from .manifests import SECRET, VLLM_PORT, VLLM_URL, config_of, dump, has_api_key, labels

API_VERSION = "chaos-mesh.org/v1alpha1"
WORKFLOW = "mmchaos-faults"
CURL_IMAGE = "curlimages/curl:8.11.1"
KILL_DEADLINE_S = 5  # a container kill is at once; Chaos Mesh keeps its object this long


def workflow(fs: list[Fault], namespace: str, api_key: bool) -> dict:
    """The Workflow of ``fs`` (ValueError, one line, for a fault it cannot hold)."""
    serials: list[dict] = []
    templates: list[dict] = []
    for i, f in enumerate(fs, 1):
        if f.after_requests is not None:
            raise ValueError(
                f"fault {i} ({f.name}) is due after {f.after_requests} requests: a Chaos Mesh Workflow runs on the "
                "clock; give it at = seconds after the load starts"
            )
        if f.kind == faults.STOP:
            raise ValueError(
                f"fault {i} ({f.name}): Chaos Mesh cannot stall one process of a container (SIGSTOP); leave it to "
                "local campaigns"
            )
        name = f"fault-{i}"
        steps = [{"name": f"{name}-wait", "templateType": "Suspend", "deadline": f"{f.at:g}s"}]
        steps += _steps(f, name, namespace, api_key)
        templates += steps
        serials.append({"name": name, "templateType": "Serial", "children": [s["name"] for s in steps]})
    parallel = {"name": "faults", "templateType": "Parallel", "children": [s["name"] for s in serials]}
    templates = [parallel, *serials, *templates]
    return {
        "apiVersion": API_VERSION,
        "kind": "Workflow",
        "metadata": {"name": WORKFLOW, "namespace": namespace, "labels": labels("faults")},
        "spec": {"entry": "faults", "templates": templates},
    }


def _steps(f: Fault, name: str, namespace: str, api_key: bool) -> list[dict]:
    lasts = f"{f.duration:g}s"
    vllm: dict = {"namespaces": [namespace], "labelSelectors": labels("vllm")}
    workers: dict = {"namespaces": [namespace], "labelSelectors": labels("worker")}
    if f.is_process:  # a kill: the container (see the module's docstring)
        chaos = {"action": "container-kill", "mode": "one", "selector": vllm, "containerNames": ["vllm"]}
        return [
            {"name": f"{name}-do", "templateType": "PodChaos", "deadline": f"{KILL_DEADLINE_S}s", "podChaos": chaos}
        ]
    if f.is_operator:
        path, undo = f.request()
        steps = [_curl(f"{name}-do", path, api_key)]
        if undo:
            steps += [{"name": f"{name}-hold", "templateType": "Suspend", "deadline": lasts}]
            steps.append(_curl(f"{name}-undo", undo, api_key))
        return steps
    if f.kind == faults.RESET:
        cut = {"mode": "all", "selector": vllm, "target": "Response", "port": VLLM_PORT, "abort": True}
        return [{"name": f"{name}-do", "templateType": "HTTPChaos", "deadline": lasts, "httpChaos": cut}]
    link = {"mode": "all", "selector": workers, "direction": "both", "target": {"mode": "all", "selector": vllm}}
    p = f.params
    if f.kind == faults.LATENCY:
        link |= {"action": "delay", "delay": {"latency": f"{p['latency_ms']:g}ms", "jitter": f"{p['jitter_ms']:g}ms"}}
    elif f.kind == faults.SILENCE:
        link |= {"action": "partition"}
    else:  # bandwidth both ways, or a slow reader: vLLM's answers to the workers held back
        if f.kind == faults.SLOW_READ:
            link |= {"selector": vllm, "direction": "to", "target": {"mode": "all", "selector": workers}}
        kbit = max(1, round(float(p["kbps"]) * 8))
        link |= {"action": "bandwidth", "bandwidth": {"rate": f"{kbit}kbps", "limit": 20971520, "buffer": 10000}}
    return [{"name": f"{name}-do", "templateType": "NetworkChaos", "deadline": lasts, "networkChaos": link}]


def _curl(name: str, path: str, api_key: bool) -> dict:
    url = f"{VLLM_URL}{path}"
    container: dict = {"name": "operator", "image": CURL_IMAGE}
    if api_key:
        container["command"] = ["sh", "-c", f'curl -fsS -X POST --oauth2-bearer "$VLLM_API_KEY" "{url}"']
        container["env"] = [{"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "api-key"}}}]
    else:
        container["command"] = ["curl", "-fsS", "-X", "POST", url]
    return {"name": name, "templateType": "Task", "task": {"container": container}}


def render(plan: CampaignPlan, config_name: str, namespace: str = "mmchaos") -> str:
    """What `mmchaos k8s --faults` prints: the Workflow of the campaign's faults for configuration ``config_name``."""
    cfg = config_of(plan, config_name)
    if not plan.faults:
        raise ValueError(f"{plan.path.name} has no [[fault]] table: there is nothing to print as Chaos Mesh objects")
    doc = workflow(plan.faults, namespace, has_api_key(plan, cfg))
    head = [
        f"Rendered by: mmchaos k8s {plan.path.name} --config {cfg.name} --faults",
        f"The campaign's faults as a Chaos Mesh Workflow (chaos-mesh.org/v1alpha1) against the {namespace} objects",
        "`mmchaos k8s` prints. Its clock starts when it is applied: apply it when the load starts, e.g.",
        f"  kubectl -n {namespace} wait --for=condition=ready pod -l app.kubernetes.io/component=master && "
        "kubectl apply -f faults.yaml",
        "Needs Chaos Mesh 2.x in the cluster (see docs/kubernetes.md).",
    ]
    return "".join(f"# {ln}\n" for ln in head) + dump([doc])
