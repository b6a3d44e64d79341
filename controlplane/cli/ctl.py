"""`controlplane ctl`: operator commands against a running controller over gRPC.

Scopes: `fleet`, `pool:MODEL|ACCELERATOR`, `engine:ENGINE_ID`. The operator token comes from --token or
CP_OPERATOR_TOKEN; TLS from --tls-ca (server CA) and optionally --tls-cert/--tls-key (mutual TLS).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

import grpc
from google.protobuf import json_format

from controlplane.api.v1 import common_pb2, operator_pb2, operator_pb2_grpc
from controlplane.core.calibration import CalibrationError, CalibrationProfile, parse_calibration
from controlplane.service.convert import cost_model_to_calibration

_PINS = {"mb": operator_pb2.PINNED_MODE_MB, "eb": operator_pb2.PINNED_MODE_EB,
         "passthrough": operator_pb2.PINNED_MODE_PASSTHROUGH, "advisory": operator_pb2.PINNED_MODE_ADVISORY}
_KINDS = {"delta": operator_pb2.OVERRIDE_KIND_DELTA, "pin": operator_pb2.OVERRIDE_KIND_PIN}


def parse_pool(text: str) -> common_pb2.Pool:
    model, sep, accelerator = text.partition("|")
    if not sep or not model or not accelerator:
        raise argparse.ArgumentTypeError(f"a pool is MODEL|ACCELERATOR, got {text!r}")
    return common_pb2.Pool(model=model, accelerator=accelerator)


def parse_scope(text: str) -> operator_pb2.Scope:
    if text == "fleet":
        return operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET)
    kind, sep, rest = text.partition(":")
    if sep and kind == "pool":
        return operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=parse_pool(rest))
    if sep and kind == "engine" and rest:
        return operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id=rest)
    raise argparse.ArgumentTypeError(f"scope must be fleet, pool:MODEL|ACCELERATOR or engine:ID, got {text!r}")


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("ctl", help="operator commands (delta, pins, explain, list, watch)",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default=os.environ.get("CP_ADDRESS", "127.0.0.1:50151"))
    parser.add_argument("--token", default=os.environ.get("CP_OPERATOR_TOKEN", ""))
    parser.add_argument("--tls-ca", type=Path)
    parser.add_argument("--tls-cert", type=Path)
    parser.add_argument("--tls-key", type=Path)
    parser.add_argument("--timeout-s", type=float, default=10.0)
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser("set-delta", help="set the margin δ (s/token) for a scope")
    p.add_argument("delta", type=float)
    p.add_argument("--scope", type=parse_scope, default=parse_scope("fleet"))
    p.add_argument("--expires-in-s", type=float, default=0.0)
    p.add_argument("--reason", default="")
    p = sub.add_parser("pin", help="pin the mode (mb, eb, passthrough, advisory) for a scope")
    p.add_argument("mode", choices=sorted(_PINS))
    p.add_argument("--scope", type=parse_scope, default=parse_scope("fleet"))
    p.add_argument("--k", type=int, default=0)
    p.add_argument("--n", type=int, default=0)
    p.add_argument("--expires-in-s", type=float, default=0.0)
    p.add_argument("--reason", default="")
    p = sub.add_parser("clear", help="remove a delta override or a pin")
    p.add_argument("kind", choices=sorted(_KINDS))
    p.add_argument("--scope", type=parse_scope, default=parse_scope("fleet"))
    p.add_argument("--reason", default="")
    p = sub.add_parser("get", help="an engine's decision with its diagnostics (explain)")
    p.add_argument("engine_id")
    p = sub.add_parser("list", help="engines and the age of their telemetry")
    p.add_argument("--pool", type=parse_pool)
    p = sub.add_parser("watch", help="stream decisions as they are pushed")
    p.add_argument("--pool", type=parse_pool)
    p.add_argument("--engine-id", default="")
    p = sub.add_parser("calibration", help="put or get a pool's cost profile")
    p.add_argument("verb", choices=("put", "get"))
    p.add_argument("--pool", type=parse_pool, required=True)
    p.add_argument("--file", type=Path, action="append", default=[], help="eb-vllm calibration JSON (put)")
    parser.set_defaults(run=run)


def _channel(args: argparse.Namespace) -> grpc.aio.Channel:
    if args.tls_ca is None:
        return grpc.aio.insecure_channel(args.address)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=args.tls_ca.read_bytes(),
        private_key=args.tls_key.read_bytes() if args.tls_key else None,
        certificate_chain=args.tls_cert.read_bytes() if args.tls_cert else None,
    )
    return grpc.aio.secure_channel(args.address, credentials)


def _print(message: object) -> None:
    print(json_format.MessageToJson(message, preserving_proto_field_name=True))


async def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    metadata = (("authorization", f"Bearer {args.token}"),) if args.token else ()
    async with _channel(args) as channel:
        stub = operator_pb2_grpc.OperatorServiceStub(channel)
        kw = {"metadata": metadata, "timeout": args.timeout_s}
        if args.action == "set-delta":
            _print(await stub.SetDelta(operator_pb2.SetDeltaRequest(
                scope=args.scope, delta_s_per_token=args.delta, expires_in_s=args.expires_in_s,
                reason=args.reason), **kw))
        elif args.action == "pin":
            _print(await stub.PinMode(operator_pb2.PinModeRequest(
                scope=args.scope, mode=_PINS[args.mode], k=args.k, n=args.n, expires_in_s=args.expires_in_s,
                reason=args.reason), **kw))
        elif args.action == "clear":
            _print(await stub.ClearOverride(operator_pb2.ClearOverrideRequest(
                scope=args.scope, kind=_KINDS[args.kind], reason=args.reason), **kw))
        elif args.action == "get":
            _print(await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id=args.engine_id), **kw))
        elif args.action == "list":
            request = operator_pb2.ListEnginesRequest()
            if args.pool:
                request.pool.CopyFrom(args.pool)
            _print(await stub.ListEngines(request, **kw))
        elif args.action == "watch":
            request = operator_pb2.WatchDecisionsRequest(engine_id=args.engine_id)
            if args.pool:
                request.pool.CopyFrom(args.pool)
            async for view in stub.WatchDecisions(request, metadata=metadata):
                d = view.decision
                print(json.dumps({"engine_id": view.engine_id, "version": d.version,
                                  "mode": common_pb2.Mode.Name(d.mode), "k": d.k, "n": d.n, "reason": d.reason,
                                  "delta": d.delta_s_per_token}), flush=True)
        elif args.action == "calibration" and args.verb == "get":
            _print(await stub.GetCalibration(operator_pb2.GetCalibrationRequest(pool=args.pool), **kw))
        else:
            profile = CalibrationProfile()
            for path in args.file:
                try:
                    profile = profile.merged(parse_calibration(json.loads(path.read_text())))
                except (OSError, ValueError, CalibrationError) as exc:
                    parser.error(f"--file {path}: {exc}")
            costs = profile.to_cost_model()
            if costs is None:
                parser.error("calibration put needs --file with alpha_p, beta_p, alpha_d, beta_d")
            calibration = cost_model_to_calibration(costs, args.pool, source=",".join(p.name for p in args.file))
            _print(await stub.PutCalibration(operator_pb2.PutCalibrationRequest(calibration=calibration), **kw))
    return 0


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        return asyncio.run(_run(args, parser))
    except grpc.aio.AioRpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}")
        return 1
