#!/usr/bin/env python3
"""cp-grpc-health: ask a controller's gRPC health service whether it is SERVING (exit 0) or not (exit 1).

The controller image installs this as /usr/local/bin/cp-grpc-health; it backs the image's HEALTHCHECK and,
because kubelet's `grpc:` probes speak plaintext only, the Helm chart's probes when TLS is on.

    cp-grpc-health --address 127.0.0.1:50151
    cp-grpc-health --address 127.0.0.1:50151 --tls-ca /tls/ca.crt --tls-ca /tls/tls.crt \
        --tls-server-name controlplane.llm.svc [--tls-client-cert /tls/tls.crt --tls-client-key /tls/tls.key]

--tls-ca may be repeated: the first file that exists is the trust root (so a probe can prefer ca.crt and fall
back to a self-signed tls.crt). Exit codes: 0 SERVING, 1 any other status or no answer, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cp-grpc-health", description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:50151", help="host:port (default %(default)s)")
    parser.add_argument("--service", default="", help="health service name (default: the whole server)")
    parser.add_argument("--timeout-s", type=float, default=3.0, help="deadline of the call (default %(default)s)")
    parser.add_argument("--tls-ca", type=Path, action="append", default=[],
                        help="CA certificate (PEM); enables TLS; repeat for fallbacks, the first that exists wins")
    parser.add_argument("--tls-server-name", default="", help="name the server certificate must carry")
    parser.add_argument("--tls-client-cert", type=Path, help="client certificate (PEM) for mutual TLS")
    parser.add_argument("--tls-client-key", type=Path, help="client key (PEM) for mutual TLS")
    args = parser.parse_args(argv)
    if (args.tls_client_cert is None) != (args.tls_client_key is None):
        parser.error("--tls-client-cert and --tls-client-key go together")
    if args.tls_client_cert is not None and not args.tls_ca:
        parser.error("--tls-client-cert needs --tls-ca")
    if args.timeout_s <= 0:
        parser.error(f"--timeout-s must be positive, got {args.timeout_s}")
    return args


def _channel(args: argparse.Namespace) -> grpc.Channel:
    if not args.tls_ca:
        return grpc.insecure_channel(args.address)
    existing = [path for path in args.tls_ca if path.is_file()]
    if not existing:
        raise FileNotFoundError("none of the --tls-ca files exists: " + ", ".join(map(str, args.tls_ca)))
    client_cert = args.tls_client_cert.read_bytes() if args.tls_client_cert else None
    client_key = args.tls_client_key.read_bytes() if args.tls_client_key else None
    credentials = grpc.ssl_channel_credentials(root_certificates=existing[0].read_bytes(),
                                               private_key=client_key, certificate_chain=client_cert)
    options = [("grpc.ssl_target_name_override", args.tls_server_name)] if args.tls_server_name else []
    return grpc.secure_channel(args.address, credentials, options=options)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    try:
        with _channel(args) as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout_s)
    except FileNotFoundError as exc:
        print(f"cp-grpc-health: {exc}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:
        print(f"cp-grpc-health: {args.address}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    print(f"{args.address}: {status}")
    return 0 if response.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
