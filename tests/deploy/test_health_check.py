"""cp-grpc-health (deploy/docker/grpc_health_check.py) against a real controller serving mutual TLS.

The image's HEALTHCHECK and the chart's TLS probes run this script; here it talks to `controlplane serve`
started with a CA-signed certificate and a client CA, over loopback. (The plaintext path is exercised by
tests/deploy/test_prometheus_integration.py.)
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbench.net import free_port
from tests.deploy.processes import health_check, wait_for

SERVER_NAME = "controlplane.test"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for controlplane.test, a client certificate, and an unrelated CA."""
    directory = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
                 "-days", "2", "-subj", f"/CN={ca}", cwd=directory)
    (directory / "server.ext").write_text(f"subjectAltName=DNS:{SERVER_NAME}\n")
    (directory / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
                 f"/CN={name}", cwd=directory)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=directory)
    return directory


@pytest.fixture(scope="module")
def tls_controller(pki: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    data = tmp_path_factory.mktemp("controller")
    log = (data / "controller.log").open("wb")
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "controlplane"), "serve", "--port", str(port), "--data-dir", str(data),
         "--tls-cert", str(pki / "server.crt"), "--tls-key", str(pki / "server.key"),
         "--tls-client-ca", str(pki / "ca.crt"), "--log-level", "WARNING"],
        stdout=log, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    try:
        def serving() -> bool | None:
            if process.poll() is not None:
                raise AssertionError(f"controller exited: {(data / 'controller.log').read_text()[-3000:]}")
            return True if health_check(*_good(pki, address)).returncode == 0 else None

        wait_for(serving, timeout_s=60, what="the TLS controller serving", interval_s=0.5)
        yield address
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()


def _good(pki: Path, address: str) -> list[str]:
    return ["--address", address, "--tls-ca", str(pki / "ca.crt"), "--tls-server-name", SERVER_NAME,
            "--tls-client-cert", str(pki / "client.crt"), "--tls-client-key", str(pki / "client.key")]


def test_serving_over_mutual_tls(tls_controller: str, pki: Path) -> None:
    result = health_check(*_good(pki, tls_controller))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{tls_controller}: SERVING"


def test_first_existing_ca_file_wins(tls_controller: str, pki: Path) -> None:
    args = _good(pki, tls_controller)
    args[args.index("--tls-ca"):args.index("--tls-ca") + 2] = ["--tls-ca", str(pki / "absent.crt"),
                                                                 "--tls-ca", str(pki / "ca.crt")]
    assert health_check(*args).returncode == 0


@pytest.mark.parametrize("change", ["plaintext", "no client certificate", "unrelated CA", "wrong server name"])
def test_failures_exit_1(tls_controller: str, pki: Path, change: str) -> None:
    args = {
        "plaintext": ["--address", tls_controller, "--timeout-s", "2"],
        "no client certificate": ["--address", tls_controller, "--tls-ca", str(pki / "ca.crt"),
                                  "--tls-server-name", SERVER_NAME],
        "unrelated CA": [*_good(pki, tls_controller)[:2], "--tls-ca", str(pki / "other-ca.crt"),
                         *_good(pki, tls_controller)[4:]],
        "wrong server name": [*_good(pki, tls_controller)[:4], "--tls-server-name", "elsewhere.test",
                              *_good(pki, tls_controller)[6:]],
    }[change]
    result = health_check(*args, "--timeout-s", "2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"cp-grpc-health: {tls_controller}: " in result.stderr


def test_bad_arguments_exit_2(pki: Path) -> None:
    missing = health_check("--tls-ca", str(pki / "absent.crt"))
    assert missing.returncode == 2 and "none of the --tls-ca files exists" in missing.stderr
    unpaired = health_check("--tls-ca", str(pki / "ca.crt"), "--tls-client-cert", str(pki / "client.crt"))
    assert unpaired.returncode == 2 and "go together" in unpaired.stderr
