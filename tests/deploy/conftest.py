"""Fixtures of the deployment tests."""

from __future__ import annotations

import subprocess

import pytest

from tests.deploy.chart import FULLNAME, NAMESPACE


@pytest.fixture(scope="session")
def pem(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA and a server certificate for the chart's Service name (cp-vllm-controlplane.llm.svc), made by openssl;
    PEM text by file name (ca.crt, tls.crt, tls.key). The certificate has no key usages, so it also serves as
    a client certificate (the chart's health checks present it under mutual TLS)."""
    directory = tmp_path_factory.mktemp("pem")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=test-ca")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr", "-subj",
            f"/CN={FULLNAME}.{NAMESPACE}.svc")
    (directory / "san.ext").write_text(f"subjectAltName=DNS:{FULLNAME}.{NAMESPACE}.svc\n")
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out",
            "tls.crt", "-days", "2", "-extfile", "san.ext")
    return {name: (directory / name).read_text() for name in ("ca.crt", "tls.crt", "tls.key")}
