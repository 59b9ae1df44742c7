"""The stubs proto/generate.py generates (`make proto`) carry kubelet's exact wire contract
(package, services, field numbers)."""

import pytest

from gpuslice.proto.deviceplugin.v1beta1 import api_pb2 as dp
from gpuslice.proto.podresources.v1 import api_pb2 as pr


def fields(message):
    return {f.name: (f.number, f.type) for f in message.DESCRIPTOR.fields}


T = pytest.importorskip("google.protobuf.descriptor").FieldDescriptor


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (dp.DevicePluginOptions, {"pre_start_required": 1, "get_preferred_allocation_available": 2}),
        (dp.RegisterRequest, {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}),
        (dp.Device, {"ID": 1, "health": 2, "topology": 3}),
        (dp.NUMANode, {"ID": 1}),
        (
            dp.ContainerPreferredAllocationRequest,
            {"available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3},
        ),
        (dp.ContainerPreferredAllocationResponse, {"deviceIDs": 1}),
        (dp.ContainerAllocateRequest, {"devices_ids": 1}),
        (dp.PreStartContainerRequest, {"devices_ids": 1}),
        (dp.ContainerAllocateResponse, {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}),
        (dp.Mount, {"container_path": 1, "host_path": 2, "read_only": 3}),
        (dp.DeviceSpec, {"container_path": 1, "host_path": 2, "permissions": 3}),
        (dp.CDIDevice, {"name": 1}),
        (pr.PodResources, {"name": 1, "namespace": 2, "containers": 3, "cpu_ids": 4, "memory": 5}),
        (pr.ContainerResources, {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4, "dynamic_resources": 5}),
        (pr.ContainerDevices, {"resource_name": 1, "device_ids": 2, "topology": 3}),
        (pr.ContainerMemory, {"memory_type": 1, "size": 2, "topology": 3}),
        (pr.DynamicResource, {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4}),
        (pr.ClaimResource, {"cdi_devices": 1, "driver_name": 2, "pool_name": 3, "device_name": 4, "share_id": 5}),
        (pr.GetPodResourcesRequest, {"pod_name": 1, "pod_namespace": 2}),
        (pr.AllocatableResourcesResponse, {"devices": 1, "cpu_ids": 2, "memory": 3}),
    ],
)
def test_field_names_and_numbers_match_kubelet(message, expected):
    assert {name: number for name, (number, _) in fields(message).items()} == expected


def test_scalar_types_match_kubelet():
    assert fields(dp.ContainerPreferredAllocationRequest)["allocation_size"][1] == T.TYPE_INT32
    assert fields(dp.NUMANode)["ID"][1] == T.TYPE_INT64
    assert fields(pr.ContainerMemory)["size"][1] == T.TYPE_UINT64
    assert dp.ContainerAllocateResponse.DESCRIPTOR.fields_by_name["envs"].message_type.GetOptions().map_entry
    assert dp.ListAndWatchResponse.DESCRIPTOR.fields_by_name["devices"].is_repeated


def test_grpc_paths_use_kubelets_proto_packages():
    assert dp.DESCRIPTOR.package == "v1beta1" and pr.DESCRIPTOR.package == "v1"
    plugin = dp.DESCRIPTOR.services_by_name["DevicePlugin"]
    assert [m.name for m in plugin.methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    assert plugin.methods_by_name["ListAndWatch"].server_streaming
    assert plugin.full_name == "v1beta1.DevicePlugin"
    assert dp.DESCRIPTOR.services_by_name["Registration"].full_name == "v1beta1.Registration"
    assert [m.name for m in pr.DESCRIPTOR.services_by_name["PodResourcesLister"].methods] == [
        "List",
        "GetAllocatableResources",
        "Get",
    ]


def test_a_kubelet_encoded_register_request_decodes():
    # Bytes as kubelet's Go protobuf encodes RegisterRequest{Version:"v1beta1", Endpoint:"x.sock",
    # ResourceName:"a.io/b", Options:{GetPreferredAllocationAvailable:true}}.
    wire = b'\n\x07v1beta1\x12\x06x.sock\x1a\x06a.io/b"\x02\x10\x01'
    req = dp.RegisterRequest.FromString(wire)
    assert (req.version, req.endpoint, req.resource_name) == ("v1beta1", "x.sock", "a.io/b")
    assert req.options.get_preferred_allocation_available and not req.options.pre_start_required
    assert req.SerializeToString() == wire
