"""Make tests/schemas/chaos-mesh-workflow.json from Chaos Mesh's Workflow CRD (Apache-2.0), for validating the
Workflow `mmchaos k8s --faults` prints without a cluster:

    git -C CHAOS_MESH show v2.8.3:config/crd/bases/chaos-mesh.org_workflows.yaml > /tmp/wf.yaml
    python tests/schemas/trim_crd.py /tmp/wf.yaml v2.8.3 > tests/schemas/chaos-mesh-workflow.json

Its openAPIV3Schema, mechanically trimmed: descriptions dropped, and of a template's fields only those mmchaos
renders kept (the other chaos kinds are most of its 640 kB). Strict as `kubeconform -strict` is: every object that
lists its properties gets additionalProperties false unless the CRD lets it hold anything, so a misspelt field
fails here instead of being pruned silently by the API server.
"""

from __future__ import annotations

import json
import sys

import yaml

TEMPLATE_FIELDS = ("name", "templateType", "deadline", "children", "podChaos", "networkChaos", "httpChaos", "task")


def trim(x):
    if isinstance(x, list):
        return [trim(v) for v in x]
    if not isinstance(x, dict):
        return x
    out = {k: trim(v) for k, v in x.items() if k != "description"}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def main(path: str, tag: str) -> None:
    crd = yaml.safe_load(open(path))
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    template = schema["properties"]["spec"]["properties"]["templates"]["items"]
    template["properties"] = {k: v for k, v in template["properties"].items() if k in TEMPLATE_FIELDS}
    schema = trim(schema)
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: checked by the API server, not the CRD
    schema["$comment"] = (
        f"Chaos Mesh {tag}, config/crd/bases/chaos-mesh.org_workflows.yaml ({crd['spec']['group']}/"
        f"{version['name']} {crd['spec']['names']['kind']}), Apache-2.0, trimmed by tests/schemas/trim_crd.py"
    )
    json.dump(schema, sys.stdout, indent=None, separators=(",", ":"), sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
