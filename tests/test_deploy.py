"""The Kubernetes examples under deploy/ keep their promises, read offline: every manifest
is valid against the Kubernetes API's own OpenAPI schemas (kubernetes-validate, strict: an
unknown field fails), and the hardening it promises is there. No cluster or helm is
available to CI; see deploy/kubernetes/README.md."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import kubernetes_validate
import pytest
import yaml

from dataref.kernels.bwrap import MALLOC_TUNABLES

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.33.0"  # an API version the manifests promise to work with
SPEC = DEPLOY / "kernelspec" / "dataref_kubernetes"


def kernel_pod(**values: str) -> dict:
    """The pod template rendered as launch_kubernetes.py renders it, with a hostile request:
    KERNEL_* values that the stock template would put into the pod."""
    template = jinja2.Template((SPEC / "scripts" / "kernel-pod.yaml.j2").read_text())
    hostile = {
        "kernel_pod_name": "k-1",
        "kernel_namespace": "dataref-eg",
        "kernel_id": "1",
        "kernel_image": "registry.example.org/dataref/kernel:0.1.0",
        "kernel_username": "alice@example.org",
        "kernel_service_account_name": "cluster-admin",
        "kernel_uid": "0",
        "kernel_volumes": ["{hostPath: {path: /}}"],
        "kernel_working_dir": "/etc",
        **values,
    }
    return yaml.safe_load(template.render(**hostile))


def test_the_kernel_pod_has_no_token_a_read_only_root_and_limits():
    pod = kernel_pod()
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in spec  # never the requested one
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 61000
    [container] = spec["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert set(container["resources"]["limits"]) == {"cpu", "memory", "ephemeral-storage"}
    assert container["workingDir"] == "/sandbox"
    assert all("hostPath" not in v for v in spec["volumes"])
    assert pod["metadata"]["labels"]["component"] == "kernel"


def test_the_kernel_pod_keeps_freed_memory_as_a_local_kernel_does():
    [container] = kernel_pod()["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["GLIBC_TUNABLES"] == MALLOC_TUNABLES
    assert env["ARROW_DEFAULT_MEMORY_POOL"] == "system"
    assert env["MALLOC_ARENA_MAX"] == "2"


def test_kernel_pods_may_reach_only_the_gateways_response_port():
    policies = list(yaml.safe_load_all((DEPLOY / "networkpolicy.yaml").read_text()))
    kernels = next(p for p in policies if p["metadata"]["name"] == "dataref-kernels")
    assert kernels["spec"]["podSelector"]["matchLabels"] == {"component": "kernel"}
    assert set(kernels["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    [egress] = kernels["spec"]["egress"]
    assert egress["ports"] == [{"protocol": "TCP", "port": 8877}]
    assert all("podSelector" in peer for peer in egress["to"])  # no ipBlock, no namespaces
    [ingress] = kernels["spec"]["ingress"]
    assert ingress["ports"] == [{"protocol": "TCP", "port": 40000, "endPort": 40999}]


def test_the_gateway_limits_kernels_per_user_and_opens_the_same_port_range():
    patch = yaml.safe_load((DEPLOY / "eg-deployment-patch.yaml").read_text())
    env = {e["name"]: e for e in patch["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert int(env["EG_MAX_KERNELS_PER_USER"]["value"]) >= 1
    assert env["EG_PORT_RANGE"]["value"] == "40000..40999"
    assert "secretKeyRef" in env["EG_AUTH_TOKEN"]["valueFrom"]
    values = yaml.safe_load((DEPLOY / "enterprise-gateway-values.yaml").read_text())
    assert values["kernel"]["allowedKernels"] == ["dataref_kubernetes"]
    assert values["kernel"]["shareGatewayNamespace"] is True  # where the policy applies
    assert values["kip"]["enabled"] is False


def test_the_kubernetes_kernelspec_interrupts_by_message_and_launches_the_image():
    spec = json.loads((SPEC / "kernel.json").read_text())
    assert spec["interrupt_mode"] == "message"
    proxy = spec["metadata"]["process_proxy"]
    assert proxy["class_name"].endswith("KubernetesProcessProxy")
    assert proxy["config"]["image_name"].endswith("/dataref/kernel:0.1.0")


def manifests() -> list[tuple[str, dict]]:
    """Every complete manifest the project ships (the Helm values and the patch are partial)."""
    found = []
    for path in [ROOT / "deploy" / "kubernetes.yaml", DEPLOY / "networkpolicy.yaml"]:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    found.append(("kernel-pod.yaml.j2", kernel_pod()))
    return found


@pytest.mark.parametrize("name,manifest", manifests(), ids=[n for n, _ in manifests()])
def test_every_manifest_is_valid_against_the_kubernetes_schemas(name, manifest):
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_the_schema_check_refuses_a_misspelt_field():
    _, deployment = next(m for m in manifests() if m[1]["kind"] == "Deployment")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
