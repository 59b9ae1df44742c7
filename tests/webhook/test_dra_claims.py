"""DRA mode of the webhook: the ResourceClaimTemplate and pod patch built from what the mutation
decided (webhook/dra_claims.py). Templates and patched pods are checked against the strict
Kubernetes 1.34-1.37 schemas; the CEL selectors are evaluated against the devices the DRA plugin
publishes; and a small model of the allocator checks that the capacity requests land on one GPU
within its memory."""

from __future__ import annotations

import copy
import json
from typing import Any

import celpy
import chartkit
import jsonpatch
import pytest
import reviewkit

from gpuslice import config
from gpuslice.dra import slices
from gpuslice.node import labels as node_labels
from gpuslice.node import nodefile
from gpuslice.webhook import answerinputs, claim_templates, cluster, conversions, dra_claims, mutation, server, shares

SETTINGS = config.load(overrides={"dra.enabled": True}, environ={})
CONTRACT = SETTINGS.contract
KUBES = ("1.34.0", "1.35.0", "1.36.0", "1.37.0")


def pod(*containers: dict[str, Any], annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "trainer-", "namespace": "team-a"},
        "spec": {"containers": list(containers) or [ctr()], **spec},
    }
    if annotations is not None:
        body["metadata"]["annotations"] = annotations
    return body


def ctr(name: str = "main", **resources: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "image": "registry.example/train:1.0"}
    if resources:
        body["resources"] = resources
    return body


def apply(original: dict[str, Any], need: dra_claims.Need, settings: config.Config = SETTINGS):
    before = copy.deepcopy(original)
    claims = dra_claims.build(original, need, settings, namespace="team-a")
    assert original == before, "build must not change its input"
    patched = jsonpatch.apply_patch(original, claims.patch)
    for kube in KUBES:
        assert chartkit.schema_errors(claims.template, kube) == [], kube
        assert chartkit.schema_errors(patched, kube) == [], kube
    return claims, patched


def share(memory_mib: int) -> dra_claims.Need:
    return dra_claims.Need(
        kind="gpu-memory",
        containers=(dra_claims.ContainerNeed("containers", 0, memory_mib=memory_mib),),
        decision={"container": "main", "annotation": "gpu-memory", "resource": "gpuslice.io/gpu-memory", "units": 8},
    )


def test_a_memory_share_becomes_a_capacity_request_referenced_by_its_container():
    claims, patched = apply(pod(ctr(limits={"nvidia.com/gpu": "1", "cpu": "2"})), share(2048))
    (request,) = claims.template["spec"]["spec"]["devices"]["requests"]
    assert request == {
        "name": "gpu",
        "exactly": {
            "deviceClassName": "gpu-share.gpuslice.io",
            "allocationMode": "ExactCount",
            "count": 1,
            "capacity": {"requests": {"gpu.gpuslice.io/memory": "2048Mi"}},
        },
    }
    name = claims.template["metadata"]["name"]
    assert name.startswith("gpuslice-mem-2048mi-") and claims.template["metadata"]["namespace"] == "team-a"
    assert patched["spec"]["resourceClaims"] == [{"name": "gpuslice", "resourceClaimTemplateName": name}]
    assert patched["spec"]["containers"][0]["resources"] == {"limits": {"cpu": "2"}, "claims": [{"name": "gpuslice"}]}
    decision = dra_claims.orjson.loads(patched["metadata"]["annotations"]["gpuslice.io/decision"])
    assert decision["mode"] == "dra" and decision["claimTemplate"] == name and "resource" not in decision
    assert decision["units"] == 8  # what the webhook's promises count against the GPU class (cluster.py)


def test_the_same_need_gives_the_same_template_and_another_need_another():
    one = dra_claims.build(pod(), share(2048), SETTINGS).template
    again = dra_claims.build(pod(ctr("other")), share(2048), SETTINGS).template
    other = dra_claims.build(pod(), share(2304), SETTINGS).template
    assert one == again
    assert len({t["metadata"]["name"] for t in (one, other)}) == 2


def test_whole_gpus_ask_a_tag_and_no_memory_so_each_takes_its_whole_gpu():
    need = dra_claims.Need(
        kind="whole-gpus",
        containers=(
            dra_claims.ContainerNeed("containers", 0, gpus=2),
            dra_claims.ContainerNeed("initContainers", 0, gpus=1),
        ),
    )
    original = pod(
        ctr("a", limits={"nvidia.com/gpu": "2"}), initContainers=[ctr("setup", limits={"nvidia.com/gpu": "1"})]
    )
    claims, patched = apply(original, need)
    requests = claims.template["spec"]["spec"]["devices"]["requests"]
    # Of the share class (no selector), asking the tag every shared GPU has and no memory: the
    # memory's default, the whole GPU, is taken.
    assert [(r["name"], r["exactly"]["count"], r["exactly"]["capacity"]) for r in requests] == [
        ("c0", 2, {"requests": {"gpu.gpuslice.io/whole": "1"}}),
        ("i0", 1, {"requests": {"gpu.gpuslice.io/whole": "1"}}),
    ]
    assert {r["exactly"]["deviceClassName"] for r in requests} == {"gpu-share.gpuslice.io"}
    assert not any("selectors" in r["exactly"] for r in requests)
    assert patched["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpuslice", "request": "c0"}]}
    assert patched["spec"]["initContainers"][0]["resources"] == {"claims": [{"name": "gpuslice", "request": "i0"}]}


def test_mig_isolation_selects_the_profile_in_the_mig_class():
    need = dra_claims.Need(kind="mig", containers=(dra_claims.ContainerNeed("containers", 0, mig_profile="1g.10gb"),))
    claims, _ = apply(pod(), need)
    (request,) = claims.template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "mig.gpuslice.io"
    assert request["exactly"]["selectors"][0]["cel"]["expression"] == (
        'device.attributes["gpu.gpuslice.io"].migProfile == "1g.10gb"'
    )
    assert claims.template["metadata"]["name"].startswith("gpuslice-mig-1g.10gb-")


def test_mig_or_share_is_one_request_listing_the_mig_device_then_a_share_of_its_memory():
    mig = dra_claims.ContainerNeed("containers", 0, mig_profile="1g.10gb")
    plain, _ = apply(pod(), dra_claims.Need(kind="mig", containers=(mig,)))
    either = dra_claims.ContainerNeed("containers", 0, mig_profile="1g.10gb", or_memory_mib=9728)
    claims, patched = apply(pod(), dra_claims.Need(kind="mig", containers=(either,)))
    (request,) = claims.template["spec"]["spec"]["devices"]["requests"]
    (mig_request,) = plain.template["spec"]["spec"]["devices"]["requests"]
    assert request == {
        "name": "gpu",
        "firstAvailable": [
            {"name": "mig", **mig_request["exactly"]},  # exactly today's MIG request, tried first
            {
                "name": "share",
                "deviceClassName": "gpu-share.gpuslice.io",
                "allocationMode": "ExactCount",
                "count": 1,
                "capacity": {"requests": {"gpu.gpuslice.io/memory": "9728Mi"}},
            },
        ],
    }
    assert "constraints" not in claims.template["spec"]["spec"]["devices"]
    assert claims.template["metadata"]["name"].startswith("gpuslice-mig-1g.10gb-or-mem-9728mi-")
    # The container references the request, not an alternative: the same whichever is allocated.
    assert patched["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpuslice"}]}


def test_claims_of_the_pod_and_annotations_already_there_are_kept():
    original = pod(
        ctr(claims=[{"name": "nic"}]),
        annotations={"team": "vision"},
        resourceClaims=[{"name": "nic", "resourceClaimName": "fast-nic"}],
    )
    claims, patched = apply(original, share(1024))
    assert [c["name"] for c in patched["spec"]["resourceClaims"]] == ["nic", "gpuslice"]
    assert patched["spec"]["containers"][0]["resources"]["claims"] == [{"name": "nic"}, {"name": "gpuslice"}]
    assert patched["metadata"]["annotations"]["team"] == "vision"
    assert dra_claims.already_converted(patched) and not dra_claims.already_converted(original)


def test_kai_scheduler_is_rewritten_as_in_device_plugin_mode():
    claims, patched = apply(pod(schedulerName="kai-scheduler"), share(1024))
    assert patched["spec"]["schedulerName"] == "default-scheduler"
    assert claims.warnings == ("gpuslice: schedulerName kai-scheduler rewritten to default-scheduler",)


# --- the claims meet the published devices ---------------------------------------------------------------


def _cel(expression: str, device: dict[str, Any]) -> bool:
    environment = celpy.Environment()
    attributes = {k: next(iter(v.values())) for k, v in device["attributes"].items()}
    activation = {
        "device": celpy.json_to_cel({"driver": "gpu.gpuslice.io", "attributes": {"gpu.gpuslice.io": attributes}})
    }
    return bool(environment.program(environment.compile(expression)).evaluate(activation))


def _mi(text: str) -> int:
    assert text.endswith("Mi"), text
    return int(text[:-2])


def _amount(text: str) -> int:
    """Memory in Mi, a tag as a plain number: as the slices write them."""
    return _mi(text) if text.endswith("Mi") else int(text)


def allocate(
    devices: list[dict[str, Any]], requests: list[dict[str, Any]], used: dict[str, int]
) -> dict[str, list[str]]:
    """A model of the DRA allocator's capacity rules (KEP-5075): a request's memory is rounded up
    to min + n * step; it fits a device whose shares so far leave room; no capacity means the
    policy default; a device without a capacity asked of it is skipped (which is all that keeps a
    share of the selector-less share class off MIG devices). Devices are tried in order (first
    fit), as the allocator does. A prioritized list (KEP-4816) takes its first subrequest that
    fits, named "<request>/<subrequest>" as in the allocation's results."""
    chosen: dict[str, list[str]] = {}
    for request in requests:
        if "exactly" in request:
            chosen[request["name"]] = _pick(devices, request["exactly"], used)
            continue
        for alternative in request["firstAvailable"]:
            picks = _pick(devices, alternative, used)
            if picks:
                chosen[f"{request['name']}/{alternative['name']}"] = picks
                break
        else:
            chosen[request["name"]] = []
    return chosen


def _pick(devices: list[dict[str, Any]], exactly: dict[str, Any], used: dict[str, int]) -> list[str]:
    """The devices one (sub)request gets, taken from `used`; none (and nothing taken) when they are too few."""
    taken = dict(used)
    picks = []
    for device in devices:
        if len(picks) == exactly["count"]:
            break
        type_wanted = {CONTRACT.dra_mig_device_class: "mig", CONTRACT.dra_device_class: "gpu"}.get(
            exactly["deviceClassName"]
        )  # the classes' selectors; the share class has none
        if type_wanted and device["attributes"]["type"]["string"] != type_wanted:
            continue
        if not all(_cel(s["cel"]["expression"], device) for s in exactly.get("selectors", ())):
            continue
        asked_capacity = exactly.get("capacity", {}).get("requests", {})
        if any(name not in device["capacity"] for name in asked_capacity):
            continue
        if not device.get("allowMultipleAllocations"):
            if device["name"] in taken:
                continue
            taken[device["name"]] = _mi(device["capacity"]["memory"]["value"])
            picks.append(device["name"])
            continue
        # Every capacity is consumed, the asked amount or the policy's default, each in its own
        # account: the memory under the device's name, a tag under "<device> <tag>" (a share takes 0).
        consumption = {}
        for name, capacity in device["capacity"].items():
            policy = capacity["requestPolicy"]
            low, step = _amount(policy["validRange"]["min"]), _amount(policy["validRange"].get("step", "1"))
            asked = _amount(asked_capacity.get(name, policy["default"]))
            consumption[device["name"] if name == CONTRACT.dra_capacity_memory else f"{device['name']} {name}"] = (
                low + -(-max(0, asked - low) // step) * step,
                _amount(policy["validRange"]["max"]),
                _amount(capacity["value"]),
            )
        if any(c > high or taken.get(key, 0) + c > value for key, (c, high, value) in consumption.items()):
            continue
        for key, (consumed, _, _) in consumption.items():
            if consumed:
                taken[key] = taken.get(key, 0) + consumed
        picks.append(device["name"])
    if len(picks) != exactly["count"]:
        return []
    used.update(taken)
    return picks


def test_shares_from_the_webhook_fill_one_gpu_exactly_and_never_exceed_it(demo_node):
    devices = slices.devices(demo_node, CONTRACT)
    used: dict[str, int] = {}
    template = dra_claims.build(pod(), share(2000 // 256 * 256 + 256), SETTINGS).template  # 2048 MiB
    placements = [allocate(devices, template["spec"]["spec"]["devices"]["requests"], used)["gpu"] for _ in range(90)]
    # 81408 MiB of whole units per H100: 39 shares of 2048 MiB each, on two GPUs, then none.
    assert sum(1 for p in placements if p) == 2 * 39
    assert all(len(p) <= 1 for p in placements) and not placements[-1]
    assert max(used.values()) <= 81559 and used == {"gpu-0": 39 * 2048, "gpu-1": 39 * 2048}


def test_whole_gpus_and_mig_requests_find_their_devices(demo_node):
    devices = slices.devices(demo_node, CONTRACT)
    whole = dra_claims.Need(kind="whole-gpus", containers=(dra_claims.ContainerNeed("containers", 0, gpus=2),))
    mig = dra_claims.Need(kind="mig", containers=(dra_claims.ContainerNeed("containers", 0, mig_profile="1g.10gb"),))
    used: dict[str, int] = {}
    whole_requests = dra_claims.build(pod(), whole, SETTINGS).template["spec"]["spec"]["devices"]["requests"]
    assert allocate(devices, whole_requests, used) == {"gpu": ["gpu-0", "gpu-1"]}
    assert allocate(
        devices, dra_claims.build(pod(), share(256), SETTINGS).template["spec"]["spec"]["devices"]["requests"], used
    ) == {"gpu": []}
    mig_requests = dra_claims.build(pod(), mig, SETTINGS).template["spec"]["spec"]["devices"]["requests"]
    assert [allocate(devices, mig_requests, used)["gpu"] for _ in range(3)] == [["gpu-2-mig-2"], ["gpu-2-mig-3"], []]


def test_mig_or_share_takes_the_free_mig_devices_then_shares_until_the_gpus_are_full(demo_node):
    devices = slices.devices(demo_node, CONTRACT)
    either = dra_claims.ContainerNeed("containers", 0, mig_profile="1g.10gb", or_memory_mib=9728)
    requests = dra_claims.build(pod(), dra_claims.Need(kind="mig", containers=(either,)), SETTINGS).template["spec"][
        "spec"
    ]["devices"]["requests"]
    used: dict[str, int] = {}
    placed = [allocate(devices, requests, used) for _ in range(19)]
    # The demo node's two 1g.10gb slices first, then 8 shares of 9728 MiB on each H100 (81408 // 9728), then none.
    assert placed[:3] == [{"gpu/mig": ["gpu-2-mig-2"]}, {"gpu/mig": ["gpu-2-mig-3"]}, {"gpu/share": ["gpu-0"]}]
    assert sum(1 for p in placed if "gpu/share" in p) == 16 and placed[-1] == {"gpu": []}
    assert used["gpu-0"] == used["gpu-1"] == 8 * 9728


@pytest.mark.parametrize("memory_mib", [256, 2048, 40704, 81408])
def test_every_share_the_webhook_asks_is_a_valid_value_of_the_request_policy(demo_node, memory_mib):
    policy = slices.devices(demo_node, CONTRACT)[0]["capacity"][CONTRACT.dra_capacity_memory]["requestPolicy"][
        "validRange"
    ]
    assert _mi(policy["min"]) <= memory_mib <= _mi(policy["max"])
    assert (memory_mib - _mi(policy["min"])) % _mi(policy["step"]) == 0


# --- the API the templates are created through (test_claim_templates.py uses it too) -----------------


class FakeTemplateApi:
    def __init__(self, fail: str = "") -> None:
        self.created: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls = 0
        self.fail = fail

    async def create(self, namespace: str, template: dict[str, Any]) -> bool:
        self.calls += 1
        if self.fail:
            raise claim_templates.TemplateError(self.fail)
        key = (namespace, template["metadata"]["name"])
        if key in self.created:
            return False
        self.created[key] = template
        return True


# --- through the mutation: same parsing, same denials, a claim instead of extended resources ---------------

DEVICE_PLUGIN_MODE = config.Config()


def cluster_view(settings: config.Config) -> cluster.ClusterView:
    """The demo node and the 8 x H200 node, labelled as the device plugin labels them."""
    view = cluster.ClusterView(settings.contract, default_gpu_memory_mib=settings.default_gpu_memory_mib)
    for name, node_file in (("demo", "demo-node.yaml"), ("h200", "h200x8-node.yaml")):
        node = nodefile.load(chartkit.REPO / "gpuslice" / "examples" / node_file)
        view.update_node(name, node_labels.node_labels(node, settings.contract))
    return view


def mutate(original: dict[str, Any], settings: config.Config = SETTINGS) -> tuple[Any, dict[str, Any]]:
    outcome = mutation.mutate(original, settings=settings, cluster=cluster_view(settings))
    if not outcome.allowed:
        return outcome, original
    patched = jsonpatch.apply_patch(original, outcome.patch)
    assert chartkit.schema_errors(patched, "1.37.0") == []
    for obj in outcome.objects:
        assert chartkit.schema_errors(obj, "1.37.0") == []
    return outcome, patched


def test_gpu_memory_becomes_a_claim_of_whole_units_and_the_placeholder_goes():
    outcome, patched = mutate(pod(ctr(limits={"nvidia.com/gpu": "1"}), annotations={"gpu-memory": "2000"}))
    (template,) = outcome.objects
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["capacity"] == {"requests": {"gpu.gpuslice.io/memory": "2048Mi"}}
    assert template["metadata"]["namespace"] == "team-a"
    assert patched["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpuslice"}]}
    assert outcome.kind == "gpu-memory" and outcome.decision["claimTemplate"] == template["metadata"]["name"]


def owned(body: dict[str, Any]) -> dict[str, Any]:
    """The pod as a ReplicaSet's: its pods keep one GPU class."""
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u-1", "controller": True}
    body["metadata"]["ownerReferences"] = [owner]
    return body


def test_gpu_fraction_of_a_controller_takes_the_class_chosen_as_in_device_plugin_mode_as_a_required_class_label():
    # On the node's class label, not as a device selector: the allocator never looks at the devices
    # of the other classes' nodes, and no device selector is evaluated on the devices it does.
    annotations = {"gpu-fraction": "0.5"}
    plugin_mode, _ = mutate(owned(pod(annotations=annotations)), DEVICE_PLUGIN_MODE)
    outcome, patched = mutate(owned(pod(annotations=annotations)))
    (request,) = outcome.objects[0]["spec"]["spec"]["devices"]["requests"]
    assert "selectors" not in request["exactly"]
    assert (
        request["exactly"]["capacity"]["requests"]["gpu.gpuslice.io/memory"] == f"{plugin_mode.decision['memoryMiB']}Mi"
    )
    required = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    memory = str(plugin_mode.decision["classMemoryMiB"])
    pin = {"key": "gpuslice.io/gpu.memory-mib", "operator": "In", "values": [memory]}
    assert pin in required["nodeSelectorTerms"][0]["matchExpressions"]


@pytest.mark.parametrize("any_class", [{}, {"gpuslice.io/gpu-class": "any"}])
def test_a_bare_pods_fraction_lists_its_class_then_the_same_fraction_of_each_other_class(any_class):
    # A bare pod, or a controller's pod that lets its pods take any class: the class chosen first
    # (the pin of device-plugin mode), then the other class, each alternative on its class by
    # the class's tag at 0 (it consumes nothing), no CEL selector.
    annotations = {"gpu-fraction": "0.5", **any_class}
    plugin_mode, _ = mutate(pod(annotations=annotations), DEVICE_PLUGIN_MODE)
    original = owned(pod(annotations=annotations)) if any_class else pod(annotations=annotations)
    outcome, patched = mutate(original)
    (template,) = outcome.objects
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    chosen = plugin_mode.decision["classMemoryMiB"]
    other = ({81559, 143771} - {chosen}).pop()  # the demo node's H100s, the 8 x H200 node's
    assert outcome.decision["classMemoryMiB"] == chosen and outcome.decision["otherClassesMiB"] == [other]
    half = {81559: 40704, 143771: 71680}  # whole 256 MiB units, rounded down
    assert request == {
        "name": "gpu",
        "firstAvailable": [
            {
                "name": f"m{memory}",
                "deviceClassName": "gpu-share.gpuslice.io",
                "allocationMode": "ExactCount",
                "count": 1,
                "capacity": {
                    "requests": {"gpu.gpuslice.io/memory": f"{half[memory]}Mi", f"gpu.gpuslice.io/m{memory}": "0"}
                },
            }
            for memory in (chosen, other)
        ],
    }
    assert template["metadata"]["name"].startswith(f"gpuslice-mem-{half[chosen]}mi-or-1-")
    assert patched["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpuslice"}]}
    # Required: one term per class, each with room for its share there (the pod asks no CPU, so no
    # CPU term on the fallback's); preferred as its class's.
    affinity = patched["spec"]["affinity"]["nodeAffinity"]
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "gpuslice.io/gpu.memory-mib", "operator": "In", "values": [str(memory)]},
                {"key": "gpuslice.io/gpu.free-block-units", "operator": "Gt", "values": [str(half[memory] // 256 - 1)]},
            ]
        }
        for memory in (chosen, other)
    ]
    _, plugin_patched = mutate(pod(annotations=annotations), DEVICE_PLUGIN_MODE)
    preferred = "preferredDuringSchedulingIgnoredDuringExecution"
    assert affinity[preferred] == plugin_patched["spec"]["affinity"]["nodeAffinity"][preferred]


def test_a_bare_pods_fraction_takes_another_class_when_its_own_is_full(demo_node, h200_node):
    """The allocator model over both nodes' devices: the H100s' halves first (the class the list
    names first), then the H200s' halves (71680 MiB, half of the larger GPU), then none."""
    devices = slices.devices(demo_node, CONTRACT) + [
        {**d, "name": f"h200-{d['name']}"} for d in slices.devices(h200_node, CONTRACT)
    ]
    need = dra_claims.Need(
        kind="gpu-fraction",
        containers=(
            dra_claims.ContainerNeed("containers", 0, memory_mib=40704, classes=((81559, 40704), (143771, 71680))),
        ),
    )
    requests = dra_claims.build(pod(), need, SETTINGS).template["spec"]["spec"]["devices"]["requests"]
    used: dict[str, int] = {}
    placed = [allocate(devices, requests, used) for _ in range(21)]
    assert [p.get("gpu/m81559") for p in placed[:4]] == [["gpu-0"], ["gpu-0"], ["gpu-1"], ["gpu-1"]]
    assert all(list(p) == ["gpu/m143771"] for p in placed[4:20]) and placed[20] == {"gpu": []}
    assert {used[f"h200-gpu-{i}"] for i in range(8)} == {2 * 71680}


def test_a_prioritized_list_never_exceeds_the_apis_eight_alternatives():
    many = [answerinputs.GpuClass(16384 + 1024 * i, frozenset(), 8, 8 * 64, 1, 8) for i in range(10)]
    others = shares._other_classes(0.5, many[3].memory_mib, [c.memory_mib for c in many], CONTRACT)
    assert len(others) == 7 and many[3].memory_mib not in dict(others)
    assert [m for m, _ in others] == sorted(m for m, _ in others)  # smallest first
    whole = conversions.Conversion(
        conversions.KIND_WHOLE_GPUS,
        CONTRACT.gpu_memory_resource,
        {("containers", 0): 64},
        {"containers": {"main": 1}},
        [{"key": CONTRACT.label_gpu_memory_mib, "operator": "In", "values": ["19456"]}],
    )
    need = dra_claims.need_from_conversion(whole, CONTRACT, pod(), [c.memory_mib for c in many])
    (request,) = dra_claims.build(pod(), need, SETTINGS).template["spec"]["spec"]["devices"]["requests"]
    names = [a["name"] for a in request["firstAvailable"]]
    assert len(names) == dra_claims.MAX_ALTERNATIVES and names[0] == "m19456" and names[-1] == "any"
    # whole GPUs: the other classes largest first (the smallest, CPU-rich GPUs last: docs/dra.md)
    assert names[1:-1] == [f"m{m}" for m in range(25600, 20479, -1024)]


def test_shares_and_whole_gpus_get_the_node_affinity_of_device_plugin_mode():
    # Required as there, for the scheduler's sake: the NodeAffinity filter keeps the pod off the
    # nodes whose labels say it cannot fit before the DRA allocator evaluates their devices.
    whole_gpus = config.load(overrides={"dra.enabled": True, "convertWholeGpus": True}, environ={})
    whole_gpus_plugin = config.load(overrides={"convertWholeGpus": True}, environ={})
    for original, dra_settings, plugin_settings in (
        (owned(pod(annotations={"gpu-fraction": "0.25"})), SETTINGS, DEVICE_PLUGIN_MODE),
        (pod(annotations={"gpu-memory": "2000"}), SETTINGS, DEVICE_PLUGIN_MODE),
        (pod(ctr(limits={"nvidia.com/gpu": "2"})), whole_gpus, whole_gpus_plugin),
    ):
        _, plugin_mode = mutate(original, plugin_settings)
        outcome, patched = mutate(original, dra_settings)
        plugin_affinity = plugin_mode["spec"]["affinity"]["nodeAffinity"]
        affinity = patched["spec"]["affinity"]["nodeAffinity"]
        preferred = "preferredDuringSchedulingIgnoredDuringExecution"
        assert affinity[preferred] == plugin_affinity[preferred], outcome.kind
        ((plugin_term,),) = [plugin_affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]]
        ((term,),) = [affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]]
        keys = {e["key"] for e in term["matchExpressions"]}
        assert keys & {"gpuslice.io/gpu.free-block-units", "gpuslice.io/gpu.free-gpus"}, keys
        if outcome.kind == "whole-gpus":  # the class is the claim's first alternative, never required
            assert "gpuslice.io/gpu.memory-mib" not in keys
            assert all(e in plugin_term["matchExpressions"] for e in term["matchExpressions"])
        else:
            assert sorted(map(str, term["matchExpressions"])) == sorted(map(str, plugin_term["matchExpressions"]))


def test_mig_isolation_and_whole_gpus_convert_to_their_requests():
    mig, _ = mutate(pod(annotations={"gpu-memory": "9000", "gpuslice.io/isolation": "mig"}))
    (request,) = mig.objects[0]["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "mig.gpuslice.io"
    assert request["exactly"]["selectors"][0]["cel"]["expression"].endswith('migProfile == "1g.10gb"')
    whole_settings = config.load(overrides={"dra.enabled": True, "convertWholeGpus": True}, environ={})
    whole, patched = mutate(pod(ctr(limits={"nvidia.com/gpu": "2"})), whole_settings)
    devices = whole.objects[0]["spec"]["spec"]["devices"]
    (request,) = devices["requests"]
    # Any GPU class that has the GPUs, the one device-plugin mode would pin first: no pod waits on a
    # class whose labels lag while another has GPUs free; the two GPUs alike in memory.
    alternatives = request["firstAvailable"]
    assert [a["name"] for a in alternatives][-1] == "any" and len(alternatives) >= 2
    assert all(a["count"] == 2 and a["deviceClassName"] == "gpu-share.gpuslice.io" for a in alternatives)
    assert not any("selectors" in a for a in alternatives)
    pinned = json.loads(patched["metadata"]["annotations"]["gpuslice.io/decision"])["classMemoryMiB"]
    assert alternatives[0]["capacity"] == {"requests": {f"gpu.gpuslice.io/m{pinned}": "1"}}
    assert alternatives[-1]["capacity"] == {"requests": {"gpu.gpuslice.io/whole": "1"}}
    assert devices["constraints"] == [{"requests": ["gpu"], "matchAttribute": "gpu.gpuslice.io/memoryMiB"}]
    assert patched["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpuslice"}]}


MIG_OR_SHARE = {"gpuslice.io/isolation": "mig", "gpuslice.io/mig-or-share": "true"}


@pytest.mark.parametrize("share", [{"gpu-memory": "9000"}, {"gpu-fraction": "0.1"}], ids=["memory", "fraction"])
def test_mig_or_share_converts_to_the_mig_request_else_a_share_of_the_profiles_memory(share):
    plain, _ = mutate(pod(annotations={**share, "gpuslice.io/isolation": "mig"}))
    outcome, patched = mutate(pod(ctr(limits={"nvidia.com/gpu": "1"}), annotations={**share, **MIG_OR_SHARE}))
    (request,) = outcome.objects[0]["spec"]["spec"]["devices"]["requests"]
    (mig_request,) = plain.objects[0]["spec"]["spec"]["devices"]["requests"]
    mig, share_request = request["firstAvailable"]
    assert mig == {"name": "mig", **mig_request["exactly"]}
    assert share_request["deviceClassName"] == "gpu-share.gpuslice.io" and share_request["count"] == 1
    # The profile's memory (1g.10gb: 9728 MiB; 2g.20gb: 19968 MiB), already whole units of 256 MiB.
    profile_mib = plain.decision["memoryMiB"]
    assert (
        share_request["capacity"] == {"requests": {"gpu.gpuslice.io/memory": f"{profile_mib}Mi"}}
        and profile_mib % 256 == 0
    )
    assert "selectors" not in share_request  # any GPU that holds it: the allocator keeps it off smaller ones
    assert patched["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpuslice"}]}
    # A node with no slice free still takes the pod (through the share): no required free-slices term,
    # where the plain MIG request has one.
    _, plain_patched = mutate(pod(annotations={**share, "gpuslice.io/isolation": "mig"}))
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    assert required in plain_patched["spec"]["affinity"]["nodeAffinity"]
    assert required not in patched["spec"]["affinity"]["nodeAffinity"]
    # The decision is the MIG one (the first choice; a MIG slice promises nothing), plus the share it may become.
    assert outcome.kind == "mig"
    template = outcome.decision["claimTemplate"]
    assert outcome.decision == {**plain.decision, "orShareMiB": profile_mib, "claimTemplate": template}
    view = cluster_view(SETTINGS)
    view.ledger.promise_conversion(outcome.decision, 1000)
    assert all(view.ledger.promised_units(c.memory_mib) == 0 for c in view.classes())


def test_mig_or_share_rounds_the_share_up_to_whole_units():
    settings = config.load(overrides={"dra.enabled": True, "memoryUnitMiB": 1024}, environ={})
    outcome, _ = mutate(pod(annotations={"gpu-memory": "9000", **MIG_OR_SHARE}), settings)
    (request,) = outcome.objects[0]["spec"]["spec"]["devices"]["requests"]
    assert request["firstAvailable"][1]["capacity"] == {
        "requests": {"gpu.gpuslice.io/memory": "10240Mi"}
    }  # 9728 MiB: 9.5 units
    assert outcome.decision["memoryMiB"] == 9728 and outcome.decision["orShareMiB"] == 10240


def test_mig_or_share_false_is_the_plain_mig_request_in_both_modes():
    for settings in (SETTINGS, DEVICE_PLUGIN_MODE):
        plain, _ = mutate(pod(annotations={"gpu-memory": "9000", "gpuslice.io/isolation": "mig"}), settings)
        off, _ = mutate(
            pod(
                annotations={"gpu-memory": "9000", "gpuslice.io/isolation": "mig", "gpuslice.io/mig-or-share": "false"}
            ),
            settings,
        )
        assert off.allowed and off.objects == plain.objects and off.decision == plain.decision


def test_a_fraction_of_n_gpus_becomes_one_request_of_n_devices_kept_on_distinct_gpus():
    annotations = {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}
    one_gpu, _ = mutate(owned(pod(annotations={"gpu-fraction": "0.5"})))  # a controller's: one class, no list
    outcome, patched = mutate(pod(ctr(limits={"nvidia.com/gpu": "1"}), annotations=annotations))
    (template,) = outcome.objects
    devices = template["spec"]["spec"]["devices"]
    (request,) = devices["requests"]
    (single,) = one_gpu.objects[0]["spec"]["spec"]["devices"]["requests"]
    # The share of one GPU, as without the annotation, asked of each of two devices: one request, so that its
    # one CDI device lists both GPUs (two requests' CDI devices would each set NVIDIA_VISIBLE_DEVICES).
    assert request == {**single, "exactly": {**single["exactly"], "count": 2}}
    assert devices["constraints"] == [{"requests": ["gpu"], "distinctAttribute": "gpu.gpuslice.io/uuid"}]
    assert template["metadata"]["name"].startswith(f"gpuslice-mem-{one_gpu.decision['memoryMiB']}mi-x2-")
    assert patched["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpuslice"}]}
    # The promises count both shares.
    assert outcome.decision["numDevices"] == 2 and outcome.decision["units"] == 2 * one_gpu.decision["units"]
    assert outcome.decision["memoryMiB"] == 2 * one_gpu.decision["memoryMiB"]
    assert outcome.decision["fraction"] == 0.5 and outcome.kind == "gpu-fraction"


def test_gpu_memory_on_n_gpus_asks_that_memory_of_each():
    outcome, _ = mutate(pod(annotations={"gpu-memory": "20Gi", "gpu-fraction-num-devices": "3"}))
    devices = outcome.objects[0]["spec"]["spec"]["devices"]
    (request,) = devices["requests"]
    assert request["exactly"]["count"] == 3 and request["exactly"]["capacity"] == {
        "requests": {"gpu.gpuslice.io/memory": "20480Mi"}
    }
    assert devices["constraints"] == [{"requests": ["gpu"], "distinctAttribute": "gpu.gpuslice.io/uuid"}]
    assert outcome.decision["units"] == 3 * 80 and outcome.decision["requestedMiB"] == 20480


def test_one_device_is_a_plain_share():
    plain, _ = mutate(pod(annotations={"gpu-fraction": "0.25"}))
    one, _ = mutate(pod(annotations={"gpu-fraction": "0.25", "gpu-fraction-num-devices": "1"}))
    assert one.objects == plain.objects and "numDevices" not in one.decision
    assert "constraints" not in one.objects[0]["spec"]["spec"]["devices"]


def test_a_fraction_of_n_gpus_is_taken_of_a_class_with_a_node_of_n_gpus():
    # The demo node has two H100s, the other node eight H200s: four GPUs in one pod only fit the H200s.
    outcome, patched = mutate(pod(annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "4"}))
    (request,) = outcome.objects[0]["spec"]["spec"]["devices"]["requests"]
    assert "selectors" not in request["exactly"] and outcome.decision["classMemoryMiB"] == 143771
    required = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["143771"]
    # More GPUs than any node has is still admitted: the pod waits, as it would for GPUs in use.
    nine, _ = mutate(pod(annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "9"}))
    assert nine.allowed and nine.objects[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 9


def test_two_pairs_of_halves_fill_two_gpus_and_a_third_pair_finds_no_room(demo_node):
    halves = dra_claims.Need(
        kind="gpu-fraction", containers=(dra_claims.ContainerNeed("containers", 0, memory_mib=40704, devices=2),)
    )
    requests = dra_claims.build(pod(), halves, SETTINGS).template["spec"]["spec"]["devices"]["requests"]
    used: dict[str, int] = {}
    placed = [allocate(slices.devices(demo_node, CONTRACT), requests, used)["gpu"] for _ in range(3)]
    assert placed == [["gpu-0", "gpu-1"], ["gpu-0", "gpu-1"], []]
    assert used == {"gpu-0": 81408, "gpu-1": 81408}


@pytest.mark.parametrize(
    ("annotations", "words"),
    [
        ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "33"}, ["'33'", "more GPUs than one ResourceClaim", "32"]),
        (
            {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2", "gpuslice.io/isolation": "mig"},
            ["'2'", "isolation='mig'", "not supported", "one MIG device", "nvidia.com/mig-<profile>: N"],
        ),
    ],
    ids=["more-than-a-claim-holds", "mig"],
)
def test_num_devices_that_dra_mode_cannot_honour_are_denied(annotations, words):
    outcome, _ = mutate(pod(annotations=annotations))
    assert not outcome.allowed and outcome.objects == ()
    for word in words:
        assert word in outcome.message, outcome.message


def test_mig_or_share_on_n_gpus_is_denied_naming_what_to_remove():
    annotations = {"gpu-fraction": "0.1", "gpu-fraction-num-devices": "2", **MIG_OR_SHARE}
    outcome, _ = mutate(pod(annotations=annotations))
    assert not outcome.allowed and outcome.objects == ()
    for word in ("gpu-fraction-num-devices='2'", "gpuslice.io/mig-or-share='true'", "one MIG device", "remove"):
        assert word in outcome.message, outcome.message


def test_device_plugin_mode_refuses_mig_or_share_and_names_dra_mode():
    outcome, _ = mutate(pod(annotations={"gpu-memory": "9000", **MIG_OR_SHARE}), DEVICE_PLUGIN_MODE)
    assert not outcome.allowed and outcome.patch == []
    assert "gpuslice.io/mig-or-share='true' is not supported in device-plugin mode" in outcome.message
    assert "DRA mode, which supports it" in outcome.message


def test_device_plugin_mode_still_refuses_num_devices_and_names_dra_mode():
    outcome, _ = mutate(pod(annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}), DEVICE_PLUGIN_MODE)
    assert not outcome.allowed and "not supported in device-plugin mode" in outcome.message
    assert "DRA mode, which supports it" in outcome.message


@pytest.mark.parametrize(
    "annotations",
    [
        {"gpu-fraction": "1.5"},
        {"gpu-memory": "lots"},
        {"gpu-fraction": "0.5", "gpu-memory": "100"},
        {"gpu-memory": "999999"},
        {"gpu-fraction": "0.5", "gpu-fraction-container-name": "nope"},
        {"gpu-memory": "100", "gpuslice.io/isolation": "vgpu"},
        {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "0"},
        {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2.0"},
        {"gpu-fraction-num-devices": "2"},
        {"gpu-memory": "9000", "gpuslice.io/isolation": "mig", "gpuslice.io/mig-or-share": "yes"},
        {"gpu-memory": "9000", "gpuslice.io/isolation": "mig", "gpuslice.io/mig-or-share": "True"},
        {"gpu-memory": "9000", "gpuslice.io/mig-or-share": "true"},
        {"gpuslice.io/mig-or-share": "false"},
    ],
    ids=[
        "fraction-above-1",
        "memory-not-a-number",
        "both-set",
        "larger-than-any-gpu",
        "unknown-container",
        "isolation",
        "num-devices-zero",
        "num-devices-not-a-count",
        "num-devices-without-share",
        "mig-or-share-not-a-boolean",
        "mig-or-share-capitalised",
        "mig-or-share-without-mig",
        "mig-or-share-alone",
    ],
)
def test_bad_input_is_denied_with_the_same_message_as_in_device_plugin_mode(annotations):
    plugin_mode, _ = mutate(pod(annotations=annotations), DEVICE_PLUGIN_MODE)
    dra_mode, _ = mutate(pod(annotations=annotations))
    assert not plugin_mode.allowed and not dra_mode.allowed
    assert dra_mode.message == plugin_mode.message and dra_mode.patch == [] and dra_mode.objects == ()


def test_a_reinvoked_webhook_leaves_a_converted_pod_alone():
    _, patched = mutate(pod(annotations={"gpu-memory": "2000"}))
    again = mutation.mutate(patched, settings=SETTINGS, cluster=cluster_view(SETTINGS))
    assert again.allowed and again.patch == [] and again.objects == ()


# --- through the HTTP server: the template exists before the pod is admitted ----------------------------


def admission_review(dry_run: bool = False, **annotations: str) -> dict[str, Any]:
    obj = pod(annotations=annotations)
    obj["metadata"].pop("namespace")  # the request names it
    return reviewkit.pod_create(obj, uid="0a0b0c0d-1111-2222-3333-444455556666", namespace="team-b", dry_run=dry_run)


async def test_the_webhook_creates_the_template_before_it_admits_the_pod(aiohttp_client):
    api = FakeTemplateApi()
    app = server.make_app(SETTINGS, cluster_view(SETTINGS), templates=claim_templates.ClaimTemplates(api))
    client = await aiohttp_client(app)
    answer = await (await client.post("/mutate", json=admission_review(**{"gpu-memory": "4Gi"}))).json()
    assert answer["response"]["allowed"] is True
    ((namespace, name),) = api.created
    assert namespace == "team-b" and name.startswith("gpuslice-mem-4096mi-")
    await client.post("/mutate", json=admission_review(dry_run=True, **{"gpu-memory": "8Gi"}))
    assert len(api.created) == 1, "a dry run creates nothing"


async def test_the_webhook_denies_the_pod_when_its_template_cannot_be_created(aiohttp_client):
    api = FakeTemplateApi(fail="creating ResourceClaimTemplate team-b/x: HTTP 403 forbidden")
    app = server.make_app(SETTINGS, cluster_view(SETTINGS), templates=claim_templates.ClaimTemplates(api))
    client = await aiohttp_client(app)
    response = await client.post("/mutate", json=admission_review(**{"gpu-memory": "4Gi"}))
    assert response.status == 200
    answer = (await response.json())["response"]
    assert answer["allowed"] is False and "HTTP 403 forbidden" in answer["status"]["message"]
    assert answer["uid"] == "0a0b0c0d-1111-2222-3333-444455556666" and "patch" not in answer


def test_a_whole_gpu_request_takes_only_a_shared_gpu_that_holds_nothing(demo_node):
    # The tag keeps it off MIG devices (gpu-2's), the memory's default off a GPU holding a share.
    devices = slices.devices(demo_node, CONTRACT)
    whole = dra_claims.Need(kind="whole-gpus", containers=(dra_claims.ContainerNeed("containers", 0, gpus=1),))
    whole_requests = dra_claims.build(pod(), whole, SETTINGS).template["spec"]["spec"]["devices"]["requests"]
    used: dict[str, int] = {}
    share_requests = dra_claims.build(pod(), share(256), SETTINGS).template["spec"]["spec"]["devices"]["requests"]
    assert allocate(devices, share_requests, used) == {"gpu": ["gpu-0"]}
    assert [allocate(devices, whole_requests, used)["gpu"] for _ in range(2)] == [["gpu-1"], []]
    assert used == {"gpu-0": 256, "gpu-1": 81408, "gpu-1 gpu.gpuslice.io/whole": 1}


def test_a_bare_pods_fraction_lists_another_class_only_where_its_free_gpus_have_the_cpu_it_asks_per_gpu():
    # Both nodes free; the H200s (more GPUs) are chosen. The demo node's H100s have 8 cores of free
    # CPU per free GPU: a half asking 8 cores (16 per GPU) there would leave the other H100 without
    # CPU, so they are not its fallback; a half asking 2 cores may fall back to them.
    view = cluster.ClusterView(CONTRACT, default_gpu_memory_mib=SETTINGS.default_gpu_memory_mib)
    for name, node_file, free_cpu in (("demo", "demo-node.yaml", 16000), ("h200", "h200x8-node.yaml", 256000)):
        labels = node_labels.node_labels(nodefile.load(chartkit.REPO / "gpuslice" / "examples" / node_file), CONTRACT)
        view.update_node(name, {**labels, CONTRACT.label_free_cpu_milli: str(free_cpu)})
    assert view.cpu_per_free_gpu() == {81559: 8000.0, 143771: 32000.0}
    listed = {}
    for cpu in ("8", "2"):
        original = pod(ctr(requests={"cpu": cpu}), annotations={"gpu-fraction": "0.5"})
        outcome = mutation.mutate(original, settings=SETTINGS, cluster=view)
        assert outcome.allowed and outcome.decision["classMemoryMiB"] == 143771
        (request,) = outcome.objects[0]["spec"]["spec"]["devices"]["requests"]
        listed[cpu] = (
            [a["name"] for a in request["firstAvailable"]] if "firstAvailable" in request else [],
            outcome.decision.get("otherClassesMiB"),
        )
        affinity = jsonpatch.apply_patch(original, outcome.patch)["spec"]["affinity"]["nodeAffinity"]
        terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        pins = [
            [e["values"] for e in t["matchExpressions"] if e["key"] == CONTRACT.label_gpu_memory_mib] for t in terms
        ]
        assert pins == ([[["143771"]]] if cpu == "8" else [[["143771"]], [["81559"]]])
        if cpu == "2":  # on the H100s' nodes only where their free GPUs have 4 cores each
            cpu_terms = [e for e in terms[1]["matchExpressions"] if e["key"] == CONTRACT.label_cpu_per_free_gpu_milli]
            assert cpu_terms == [{"key": CONTRACT.label_cpu_per_free_gpu_milli, "operator": "Gt", "values": ["3999"]}]
            assert all(e["key"] != CONTRACT.label_cpu_per_free_gpu_milli for e in terms[0]["matchExpressions"])
    assert listed == {"8": ([], None), "2": (["m143771", "m81559"], [81559])}
