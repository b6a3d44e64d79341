"""Two controller replicas on one Redis agree on overrides; TLS and mutual TLS; Prometheus metrics."""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.service.config import SecurityConfig
from tests.integration.controller_harness import AgentStream, make_config, operator_stub, running_controller

POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="NVIDIA H200")


async def test_override_on_one_replica_reaches_engines_of_the_other(redis_url: str) -> None:
    async with running_controller(make_config(redis_url, controller_id="replica-a")) as a, \
            running_controller(make_config(redis_url, controller_id="replica-b")) as b, \
            grpc.aio.insecure_channel(a.address) as channel_a, grpc.aio.insecure_channel(b.address) as channel_b:
        agent = await AgentStream(channel_b, "engine-on-b", POOL).open()
        first = await agent.next_decision()
        assert first.delta_s_per_token == 0.0 and first.delta_source == "default"
        await operator_stub(channel_a).SetDelta(operator_pb2.SetDeltaRequest(
            scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id="engine-on-b"),
            delta_s_per_token=3e-5, reason="set on replica a"))
        changed = await agent.next_decision(where=lambda d: d.delta_source == "engine")
        assert changed.delta_s_per_token == pytest.approx(3e-5)
        await operator_stub(channel_a).PinMode(operator_pb2.PinModeRequest(
            scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET), mode=operator_pb2.PINNED_MODE_PASSTHROUGH))
        pinned = await agent.next_decision(where=lambda d: d.mode == common_pb2.MODE_PASSTHROUGH)
        assert pinned.reason == "operator_pin"
        await operator_stub(channel_a).ClearOverride(operator_pb2.ClearOverrideRequest(
            scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET), kind=operator_pb2.OVERRIDE_KIND_PIN))
        released = await agent.next_decision(where=lambda d: d.mode == common_pb2.MODE_MB)
        assert released.reason == "insufficient_data"
        await agent.close()
        # Both replicas counted what they did.
        registry = b.app.metrics.registry
        assert registry.get_sample_value("cp_decisions_total", {"mode": "passthrough", "reason": "operator_pin"}) == 1
        assert registry.get_sample_value("cp_decision_acks_total", {"result": "applied"}) >= 3
        assert a.app.metrics.registry.get_sample_value("cp_connected_engines") == 0


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def certificates(tmp_path: Path) -> Path:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, made by openssl."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=test-ca", cwd=tmp_path)
    (tmp_path / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=tmp_path)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", "san.ext", cwd=tmp_path)
    return tmp_path


async def test_mutual_tls_with_tokens(redis_url: str, certificates: Path) -> None:
    security = SecurityConfig(tls_cert=certificates / "server.pem", tls_key=certificates / "server.key",
                              tls_client_ca=certificates / "ca.pem",
                              operator_tokens={"operator-token-0123456789": "carol"})
    async with running_controller(make_config(redis_url, security=security)) as ctl:
        ca = (certificates / "ca.pem").read_bytes()
        good = grpc.ssl_channel_credentials(root_certificates=ca,
                                            private_key=(certificates / "client.key").read_bytes(),
                                            certificate_chain=(certificates / "client.pem").read_bytes())
        metadata = (("authorization", "Bearer operator-token-0123456789"),)
        async with grpc.aio.secure_channel(ctl.address, good) as channel:
            response = await operator_stub(channel).ListEngines(operator_pb2.ListEnginesRequest(), metadata=metadata,
                                                                timeout=10)
            assert list(response.engines) == []
        # Without a client certificate the handshake fails; in plaintext nothing gets through either.
        no_client_cert = grpc.ssl_channel_credentials(root_certificates=ca)
        for channel in (grpc.aio.secure_channel(ctl.address, no_client_cert), grpc.aio.insecure_channel(ctl.address)):
            async with channel:
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await operator_stub(channel).ListEngines(operator_pb2.ListEnginesRequest(), metadata=metadata,
                                                             timeout=5)
                assert error.value.code() == grpc.StatusCode.UNAVAILABLE
