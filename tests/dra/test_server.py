"""The DRA plugin's gRPC side (dra/server.py) over real unix sockets with grpc.aio: kubelet's
plugin registration (GetInfo, NotifyRegistrationStatus as the plugin watcher calls them),
NodePrepareResources and NodeUnprepareResources through both service versions. The whole
`gpuslice-dra-plugin` run loop: tests/dra/test_main.py."""

from __future__ import annotations

import dra_kit
import grpc
import pytest
from dra_kit import claim, dirs_fixture, ref, result, uid  # noqa: F401 - fixture

from gpuslice import config
from gpuslice.dra import checkpoint, preparer, server
from gpuslice.proto.dra.v1 import api_pb2 as v1
from gpuslice.proto.dra.v1beta1 import api_pb2 as v1beta1
from gpuslice.proto.pluginregistration.v1 import api_pb2 as registration

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

SHARE_ID = "eeeeeeee-2222-4333-8444-555555555555"


def test_the_stubs_carry_kubelets_wire_contract():
    assert v1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    assert v1beta1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1beta1"
    assert registration.DESCRIPTOR.package == "pluginregistration"
    assert v1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    fields = {f.name: f.number for f in v1.Device.DESCRIPTOR.fields}
    assert fields == {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4, "share_id": 5}
    assert {f.name: f.number for f in v1beta1.Device.DESCRIPTOR.fields} == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
    }
    assert {f.name: f.number for f in v1.Claim.DESCRIPTOR.fields} == {"namespace": 1, "uid": 2, "name": 3}
    assert {f.name: f.number for f in v1.NodePrepareResourceResponse.DESCRIPTOR.fields} == {"devices": 1, "error": 2}
    assert {f.name: f.number for f in registration.PluginInfo.DESCRIPTOR.fields} == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert {f.name: f.number for f in registration.RegistrationStatus.DESCRIPTOR.fields} == {
        "plugin_registered": 1,
        "error": 2,
    }
    assert v1.NodePrepareResourcesResponse.DESCRIPTOR.fields_by_name["claims"].message_type.GetOptions().map_entry


def make_server(demo_node, dirs, api) -> server.DraServer:
    plugin = preparer.Preparer(
        node=demo_node,
        settings=config.Config(),
        pool="node-a",
        api=api,
        state=checkpoint.Checkpoint(dirs["state"] / "checkpoint.json", "gpu.gpuslice.io"),
        cdi_dir=dirs["cdi"],
    )
    plugin.recover()
    return server.DraServer(
        plugin, driver="gpu.gpuslice.io", plugin_dir=dirs["plugins"] / "gpu.gpuslice.io", registry_dir=dirs["registry"]
    )


async def test_kubelet_registers_the_driver_through_the_registration_socket(demo_node, dirs):
    grpc_server = make_server(demo_node, dirs, dra_kit.FakeApi())
    await grpc_server.start()
    try:
        assert grpc_server.registration_socket.name == "gpu.gpuslice.io-reg.sock"
        info = await dra_kit.register_like_kubelet(dirs["registry"])
        assert info.type == "DRAPlugin" and info.name == "gpu.gpuslice.io"
        assert info.endpoint == str(dirs["plugins"] / "gpu.gpuslice.io" / "dra.sock")
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        assert grpc_server.registered is True and grpc_server.registration_error == ""
    finally:
        await grpc_server.stop()


async def test_a_refused_registration_is_recorded_with_kubelets_reason(demo_node, dirs):
    grpc_server = make_server(demo_node, dirs, dra_kit.FakeApi())
    await grpc_server.start()
    try:
        await dra_kit.register_like_kubelet(dirs["registry"], accept=False)
        assert grpc_server.registered is False and grpc_server.registration_error == "refused by test"
    finally:
        await grpc_server.stop()


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_prepare_and_unprepare_over_each_service_version(demo_node, dirs, version):
    api = dra_kit.FakeApi()
    share = claim(uid(1), [result("gpu", "gpu-0", "4Gi", share_id=SHARE_ID)])
    api.add_claim(share)
    grpc_server = make_server(demo_node, dirs, api)
    await grpc_server.start()
    try:
        answer = await dra_kit.prepare(grpc_server.dra_socket, [share], version)
        entry = answer.claims[uid(1)]
        assert entry.error == ""
        (device,) = entry.devices
        assert list(device.request_names) == ["gpu"] and device.pool_name == "node-a" and device.device_name == "gpu-0"
        assert list(device.cdi_device_ids) == [f"k8s.gpu.gpuslice.io/claim={uid(1)}-gpu"]
        if version == "v1":
            assert device.HasField("share_id") and device.share_id == SHARE_ID
        again = await dra_kit.prepare(grpc_server.dra_socket, [share], version)
        assert again == answer and api.count("get_claim") == 1
        gone = await dra_kit.unprepare(grpc_server.dra_socket, [share], version)
        assert dict(gone.claims) == {uid(1): type(gone.claims[uid(1)])(error="")}
        gone_again = await dra_kit.unprepare(grpc_server.dra_socket, [share], version)
        assert gone_again.claims[uid(1)].error == ""
        assert list(dirs["cdi"].iterdir()) == []
    finally:
        await grpc_server.stop()


async def test_one_bad_claim_does_not_fail_the_others_in_the_same_call(demo_node, dirs):
    api = dra_kit.FakeApi()
    good = claim(uid(2), [result("gpu", "gpu-1", "1Gi")])
    bad = claim(uid(3), [result("gpu", "gpu-7", "1Gi")])
    api.add_claim(good)
    api.add_claim(bad)
    grpc_server = make_server(demo_node, dirs, api)
    await grpc_server.start()
    try:
        answer = await dra_kit.prepare(grpc_server.dra_socket, [good, bad])
        assert answer.claims[uid(2)].error == "" and len(answer.claims[uid(2)].devices) == 1
        assert "gpu-7" in answer.claims[uid(3)].error and not answer.claims[uid(3)].devices
    finally:
        await grpc_server.stop()


async def test_stop_removes_both_sockets_and_the_plugin_can_serve_again(demo_node, dirs):
    grpc_server = make_server(demo_node, dirs, dra_kit.FakeApi())
    await grpc_server.start()
    await grpc_server.stop()
    assert not grpc_server.dra_socket.exists() and not grpc_server.registration_socket.exists()
    await grpc_server.start()  # a stale socket from a crash is replaced, too
    try:
        await dra_kit.register_like_kubelet(dirs["registry"])
    finally:
        await grpc_server.stop()


async def test_a_call_on_a_stopped_plugin_fails_as_unavailable(demo_node, dirs):
    grpc_server = make_server(demo_node, dirs, dra_kit.FakeApi())
    await grpc_server.start()
    socket = grpc_server.dra_socket
    await grpc_server.stop()
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await dra_kit.prepare(socket, [claim(uid(4), None)])
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
