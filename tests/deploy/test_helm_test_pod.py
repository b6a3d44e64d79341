"""The chart's `helm test` pod: rendered by real Helm as a test hook that runs the image's cp-grpc-health against
the controller Service, and its command run against a real `controlplane serve` process.

No cluster runs here: the Service's DNS name is mapped to the loopback port of the process, and the TLS Secret
the chart renders is written out where the pod would mount it.
"""

from __future__ import annotations

import base64
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from controlplane.store.embedded import stop_process
from testbench.net import free_port
from tests.deploy.chart import FULLNAME, NAMESPACE, by_kind, lint, notes, one, render, selects
from tests.deploy.processes import health_check, wait_for

TEST_POD = f"{FULLNAME}-test-grpc-health"
TLS_DIR = "/etc/controlplane/tls"


def _tls_values(pem: dict[str, str]) -> dict[str, Any]:
    return {"tls": {"enabled": True, "cert": pem["tls.crt"], "key": pem["tls.key"], "ca": pem["ca.crt"],
                    "mutual": True}, "allowPlaintext": False}


def _command(objects: list[dict[str, Any]]) -> list[str]:
    [container] = one(objects, "Pod", TEST_POD)["spec"]["containers"]
    return container["command"]


def _address(command: list[str]) -> str:
    [address] = [arg.removeprefix("--address=") for arg in command if arg.startswith("--address=")]
    return address


@contextmanager
def _serve(tmp_path: Path, *args: str) -> Iterator[int]:
    """`controlplane serve` on a free loopback port (embedded Redis under tmp_path); yields the port."""
    port = free_port()
    log = tmp_path / "controller.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "controlplane"), "serve", "--port", str(port), "--data-dir",
             str(tmp_path / "data"), "--log-level", "WARNING", *args], stdout=out, stderr=subprocess.STDOUT)
        try:
            def listening() -> bool | None:
                if process.poll() is not None:
                    raise AssertionError(f"controller exited: {log.read_text()[-3000:]}")
                return True if _port_open(port) else None

            wait_for(listening, timeout_s=60, what="controlplane serve listening", interval_s=0.3)
            yield port
        finally:
            stop_process(process, timeout_s=10.0)


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _run_in_place_of_the_pod(command: list[str], port: int, tls_dir: Path | None = None) -> list[str]:
    """The pod's arguments with the Service address mapped to 127.0.0.1:`port` and the mounted Secret to
    `tls_dir`."""
    service = _address(command)
    args = [arg.replace(f"--address={service}", f"--address=127.0.0.1:{port}") for arg in command[1:]]
    if tls_dir is not None:
        args = [arg.replace(TLS_DIR, str(tls_dir)) for arg in args]
    return args


def _serving(args: list[str]) -> subprocess.CompletedProcess[str]:
    """cp-grpc-health with `args`, repeated until it exits 0 (the controller turns SERVING once its store is up)."""
    def probe() -> subprocess.CompletedProcess[str] | None:
        result = health_check(*args)
        return result if result.returncode == 0 else None

    return wait_for(probe, timeout_s=30, what=f"cp-grpc-health {' '.join(args)} SERVING", interval_s=0.5)


def test_the_test_pod_is_a_helm_test_hook_against_the_controller_service() -> None:
    objects = render()
    pod = one(objects, "Pod", TEST_POD)
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert "before-hook-creation" in pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    assert pod["spec"]["restartPolicy"] == "Never"
    for version in ("1.27.0", kubernetes_validate.latest_version()):
        kubernetes_validate.validate(pod, version, strict=True)
    command = _command(objects)
    assert command[0] == "cp-grpc-health"
    service = one(objects, "Service", FULLNAME)
    [grpc] = [port for port in service["spec"]["ports"] if port["name"] == "grpc"]
    assert _address(command) == f"{FULLNAME}.{NAMESPACE}.svc:{grpc['port']}"
    assert not any(arg.startswith("--tls") for arg in command)
    deployment = one(objects, "Deployment", FULLNAME)
    assert pod["spec"]["containers"][0]["image"] == deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    # Not a controller pod: no Service or PodDisruptionBudget of the release selects it.
    for selector in [s["spec"]["selector"] for s in by_kind(objects, "Service")] + [
            p["spec"]["selector"]["matchLabels"] for p in by_kind(objects, "PodDisruptionBudget")]:
        assert not selects(selector, pod["metadata"]["labels"])


def test_the_test_pod_follows_the_port_and_can_be_turned_off() -> None:
    assert _address(_command(render({"controller": {"grpcPort": 6000}}))).endswith(".svc:6000")
    assert by_kind(render({"helmTest": {"enabled": False}}), "Pod") == []
    assert "helm test cp -n llm" in notes() and "helm test" not in notes({"helmTest": {"enabled": False}})
    assert lint({"helmTest": {"enabled": True}})["errors"] == []


def test_a_restricting_network_policy_lets_the_test_pod_in() -> None:
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "llm-engines"}}}]
    objects = render({"networkPolicy": {"grpcFrom": peers}})
    labels = one(objects, "Pod", TEST_POD)["metadata"]["labels"]
    policy = one(objects, "NetworkPolicy", FULLNAME)
    [grpc_rule] = [rule for rule in policy["spec"]["ingress"] if rule["ports"][0]["port"] == "grpc"]
    assert grpc_rule["from"][:1] == peers
    assert any("podSelector" in peer and "namespaceSelector" not in peer
               and selects(peer["podSelector"]["matchLabels"], labels) for peer in grpc_rule["from"])
    without = render({"networkPolicy": {"grpcFrom": peers}, "helmTest": {"enabled": False}})
    assert one(without, "NetworkPolicy", FULLNAME)["spec"]["ingress"][0]["from"] == peers


def test_the_command_passes_against_a_serving_controller_and_fails_without_one(tmp_path: Path) -> None:
    command = _command(render())
    with _serve(tmp_path) as port:
        args = _run_in_place_of_the_pod(command, port)
        result = _serving(args)
        assert result.stdout.strip() == f"127.0.0.1:{port}: SERVING"
    result = health_check(*_run_in_place_of_the_pod(command, port), "--timeout-s", "2")
    assert result.returncode == 1, result.stdout + result.stderr


def test_the_command_passes_over_the_charts_mutual_tls(tmp_path: Path, pem: dict[str, str]) -> None:
    objects = render(_tls_values(pem))
    pod = one(objects, "Pod", TEST_POD)
    [mount] = pod["spec"]["containers"][0]["volumeMounts"]
    [volume] = pod["spec"]["volumes"]
    assert mount == {"name": "tls", "mountPath": TLS_DIR, "readOnly": True} and volume["name"] == "tls"
    # The Secret the chart renders, written where the pod mounts it.
    secret = one(objects, "Secret", volume["secret"]["secretName"])
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    for key, value in secret["data"].items():
        (tls_dir / key).write_bytes(base64.b64decode(value))
    command = _command(objects)
    assert f"--tls-server-name={FULLNAME}.{NAMESPACE}.svc" in command
    assert f"--tls-client-cert={TLS_DIR}/tls.crt" in command
    with _serve(tmp_path, "--tls-cert", str(tls_dir / "tls.crt"), "--tls-key", str(tls_dir / "tls.key"),
                "--tls-client-ca", str(tls_dir / "ca.crt")) as port:
        args = _run_in_place_of_the_pod(command, port, tls_dir)
        result = _serving(args)
        assert result.stdout.strip() == f"127.0.0.1:{port}: SERVING"
        plaintext = health_check(*[arg for arg in args if not arg.startswith("--tls")], "--timeout-s", "2")
        assert plaintext.returncode == 1


@pytest.mark.parametrize("values", [{"helmTest": {"enabled": "yes"}}, {"helmTest": {"image": "x"}}])
def test_schema_rejects_bad_test_values(values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError, match="helmTest"):
        render(values)
