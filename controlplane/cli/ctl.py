"""`controlplane ctl`: operator commands against a running controller over gRPC.

Scopes: `fleet`, `pool:MODEL|ACCELERATOR` (`|ROLE` appended for the pool of a disaggregated prefill/decode
role: producer, consumer, both), `engine:ENGINE_ID`; commands that change an override require one (there is no
default scope). A pool or engine scope that no engine has reported is changed with a
warning naming the known pools, or refused with `--strict`. Output: a table (default), or `-o json` /
`-o yaml` with stable snake_case field names, units in the names, integers for versions and counts, every
field present, and timestamps both as ISO-8601 UTC (`*_at`) and as Unix seconds (`*_at_s`). Errors go to
stderr as one line naming the gRPC status, with exit code 1 (2 for a usage error, 130 when interrupted).

Connection (each flag wins over its environment variable):
  --address       CP_ADDRESS         controller host:port (default 127.0.0.1:50151, the port `serve` and
                                     `demo` listen on by default)
  --token         CP_OPERATOR_TOKEN  operator bearer token (one of the controller's CP_OPERATOR_TOKENS)
  --tls-ca        CP_TLS_CA          CA certificate (PEM) of the controller; enables TLS
  --tls-cert      CP_TLS_CERT        client certificate (PEM) for mutual TLS
  --tls-key       CP_TLS_KEY         client private key (PEM) for mutual TLS
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from controlplane.api.v1 import common_pb2, operator_pb2, operator_pb2_grpc
from controlplane.cli import output
from controlplane.cli.args import MAX_REQUESTS, bounded_int, finite_float, nonnegative_float, parse_pool
from controlplane.cli.explain import explain, explain_rows
from controlplane.cli.interrupt import INTERRUPTED_EXIT, until_interrupted
from controlplane.cli.report import render_report
from controlplane.cli.report_command import add_report_arguments
from controlplane.cli.report_latency import pool_samples, recorded_latencies, sample_latencies
from controlplane.cli.rows import WatchPrinter, engine_info_dict, engine_row, get_fields, list_cells
from controlplane.core.calibration import CalibrationError, CalibrationProfile, parse_calibration
from controlplane.loop.codec import cost_model_to_calibration
from controlplane.service.scopes import unknown_scope

DEFAULT_ADDRESS = "127.0.0.1:50151"
ENVIRONMENT = {"address": "CP_ADDRESS", "token": "CP_OPERATOR_TOKEN", "tls_ca": "CP_TLS_CA",
               "tls_cert": "CP_TLS_CERT", "tls_key": "CP_TLS_KEY"}
_PINS = {"mb": operator_pb2.PINNED_MODE_MB, "eb": operator_pb2.PINNED_MODE_EB,
         "passthrough": operator_pb2.PINNED_MODE_PASSTHROUGH, "advisory": operator_pb2.PINNED_MODE_ADVISORY}
_KINDS = {"delta": operator_pb2.OVERRIDE_KIND_DELTA, "pin": operator_pb2.OVERRIDE_KIND_PIN,
          "objective": operator_pb2.OVERRIDE_KIND_OBJECTIVE}
# `watch` waits this long before it reconnects to a controller that went away.
RESUME_WAIT_S = 1.0
# The fields of the record a change answers with that its table shows, per command (`-o json|yaml` keep all).
_RECORD_FIELDS = {
    "set-delta": ("scope", "kind", "delta_s_per_token", "expires_at", "expires_at_s", "set_by", "set_at", "set_at_s",
                  "reason"),
    "pin": ("scope", "kind", "mode", "k", "n", "expires_at", "expires_at_s", "set_by", "set_at", "set_at_s", "reason"),
    "clear": ("scope", "kind", "cleared", "set_by", "set_at", "set_at_s", "reason"),
    "set-objective": ("scope", "kind", "objective", "expires_at", "expires_at_s", "set_by", "set_at", "set_at_s",
                      "reason"),
}
# The message an audit entry's old/new JSON holds, by the entry's kind.
_AUDITED = {"delta": operator_pb2.OverrideRecord, "pin": operator_pb2.OverrideRecord,
            "objective": operator_pb2.OverrideRecord,
            "calibration": operator_pb2.Calibration}
_SCOPE_HELP = "fleet | pool:MODEL|ACCELERATOR[|ROLE] | engine:ENGINE_ID (required)"
_STRICT_HELP = ("refuse (exit 1, nothing changed) a pool or engine scope that covers no engine the controller "
                "knows (asks ListEngines first); without it such a change is made, with a warning naming the "
                "known pools")
_LIST_COLUMNS = ("ENGINE", "POOL", "CONNECTED", "VLLM", "MODE", "K", "N", "B_MAX", "B_CAP", "δ", "VERSION",
                 "ACKED", "TELEMETRY AGE")


class UsageError(Exception):
    """A bad flag value found after parsing (e.g. an unreadable file); exit code 2."""


class UnknownScopeError(Exception):
    """--strict and a pool or engine scope that covers no engine the controller knows; exit code 1."""


def parse_scope(text: str) -> operator_pb2.Scope:
    if text == "fleet":
        return operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET)
    kind, sep, rest = text.partition(":")
    if sep and kind == "pool":
        return operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=parse_pool(rest))
    if sep and kind == "engine" and rest:
        return operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id=rest)
    raise argparse.ArgumentTypeError(
        f"scope must be fleet, pool:MODEL|ACCELERATOR[|ROLE] or engine:ENGINE_ID, got {text[:64]!r}")


def _add_common_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """Connection and output options; accepted before the command and after it (the later one wins)."""
    default = None if top else argparse.SUPPRESS
    group = parser.add_argument_group("connection and output" + ("" if top else " (also accepted before COMMAND)"))
    group.add_argument("--address", default=default, metavar="HOST:PORT",
                       help=f"controller address (env CP_ADDRESS; default {DEFAULT_ADDRESS})")
    group.add_argument("--token", default=default, help="operator bearer token (env CP_OPERATOR_TOKEN)")
    group.add_argument("--tls-ca", type=Path, default=default, metavar="PEM",
                       help="controller CA certificate; enables TLS (env CP_TLS_CA)")
    group.add_argument("--tls-cert", type=Path, default=default, metavar="PEM",
                       help="client certificate for mutual TLS (env CP_TLS_CERT)")
    group.add_argument("--tls-key", type=Path, default=default, metavar="PEM",
                       help="client private key for mutual TLS (env CP_TLS_KEY)")
    group.add_argument("--timeout-s", type=nonnegative_float, default=default if not top else 10.0, metavar="S",
                       help="deadline of each call, seconds (default 10; watch streams have none)")
    group.add_argument("-o", "--output", choices=output.FORMATS, default=default if not top else "table",
                       help="table (default), json or yaml")


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("ctl", help="operator commands (list, explain, overrides, audit, watch, report)",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common_options(parser, top=True)
    sub = parser.add_subparsers(dest="action", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _add_common_options(p, top=False)
        return p

    p = command("list", "engines: pool, connection, vLLM version and support (full, degraded, stock: what the "
                        "agent's probe of vLLM found), the decision in force (mode, k, N, budget, δ), versions, "
                        "telemetry age")
    p.add_argument("--pool", type=parse_pool, metavar="MODEL|ACCELERATOR", help="only this pool")
    p = command("get", "one engine's decision view (decision, latest computation, ACKed version, engine info)")
    p.add_argument("engine_id", metavar="ENGINE")
    p = command("explain", "every term behind an engine's decision (p0, η, μ_L, μ_O, θ0, Δθ, θ̂*, N̂*, k̂*, "
                           "LHS, RHS, δ), the crossover rule's verdict and the δ that would flip it")
    p.add_argument("engine_id", metavar="ENGINE")
    command("overrides", "the overrides in force (δ and pins), most specific scope last")
    p = command("audit", "override and calibration changes, newest first")
    p.add_argument("--limit", type=bounded_int(low=1, high=10_000), default=100,
                   help="entries to show (default 100, at most 10000)")
    p = command("set-delta", "set the margin δ for a scope: > 0 favours mixed batching (TTFT), < 0 exclusive "
                             "batching (throughput)")
    p.add_argument("delta", type=finite_float, metavar="DELTA_S_PER_TOKEN",
                   help="δ in seconds per token, |δ| ≤ 0.01 (e.g. 2e-5 or -1e-5)")
    p.add_argument("--scope", type=parse_scope, required=True, help=_SCOPE_HELP)
    p.add_argument("--strict", action="store_true", help=_STRICT_HELP)
    p.add_argument("--expires-in-s", type=nonnegative_float, default=0.0, metavar="S",
                   help="seconds until the override lapses (default 0: never)")
    p.add_argument("--reason", default="", help="recorded in the audit (at most 1024 characters)")
    p = command("pin", "pin the mode for a scope (advisory: decide and report, do not apply)")
    p.add_argument("mode", choices=sorted(_PINS))
    p.add_argument("--scope", type=parse_scope, required=True, help=_SCOPE_HELP)
    p.add_argument("--strict", action="store_true", help=_STRICT_HELP)
    p.add_argument("--k", type=bounded_int(low=0, high=MAX_REQUESTS), default=0,
                   help=f"phase-switch threshold, requests (default 0: computed; at most {MAX_REQUESTS})")
    p.add_argument("--n", type=bounded_int(low=0, high=MAX_REQUESTS), default=0,
                   help=f"batch size cap N, requests (default 0: computed; at most {MAX_REQUESTS}; above an "
                        f"engine's max_num_seqs it is ignored there, with a warning)")
    p.add_argument("--expires-in-s", type=nonnegative_float, default=0.0, metavar="S",
                   help="seconds until the pin lapses (default 0: never)")
    p.add_argument("--reason", default="", help="recorded in the audit (at most 1024 characters)")
    p = command("set-objective", "hold a TTFT and/or TPOT quantile of each pool in the scope under a target: the "
                                 "controller moves δ, then P-PAS's B_cap, within bounds to meet it (an explicit δ "
                                 "override or pin wins)")
    p.add_argument("--scope", type=parse_scope, required=True, help=_SCOPE_HELP)
    p.add_argument("--strict", action="store_true", help=_STRICT_HELP)
    for name, what in (("ttft", "time to first token"), ("tpot", "time per output token after the first")):
        p.add_argument(f"--{name}-quantile", type=finite_float, default=0.0, metavar="Q",
                       help=f"the {what} quantile to hold, in [0.5, 0.9999] (e.g. 0.99)")
        p.add_argument(f"--{name}-target-s", type=nonnegative_float, default=0.0, metavar="S",
                       help="its target, seconds")
    p.add_argument("--delta-min", type=finite_float, default=0.0, metavar="S_PER_TOKEN",
                   help="lowest δ the loop may set (≤ 0; with --delta-max both 0: ±0.01)")
    p.add_argument("--delta-max", type=finite_float, default=0.0, metavar="S_PER_TOKEN",
                   help="highest δ the loop may set (≥ 0)")
    for end, meaning in (("min", "the agent's floor"), ("max", "the engine's B_max")):
        p.add_argument(f"--budget-{end}", type=bounded_int(low=0, high=2**32 - 1), default=0, metavar="TOKENS",
                       help=f"{'lowest' if end == 'min' else 'highest'} B_cap the loop may set (0: {meaning})")
    p.add_argument("--expires-in-s", type=nonnegative_float, default=0.0, metavar="S",
                   help="seconds until the objective lapses (default 0: never)")
    p.add_argument("--reason", default="", help="recorded in the audit (at most 1024 characters)")
    command("objectives", "the latency objectives in force, with each pool's state (meeting, adjusting, "
                          "infeasible)")
    command("rollouts", "guarded mode changes: those in progress on this replica, then the recent verdicts")
    p = command("rollout", "promote or abort a pool's rollout in progress now (audited)")
    p.add_argument("rollout_action", choices=("promote", "abort"), metavar="{promote,abort}")
    p.add_argument("--pool", type=parse_pool, required=True, metavar="MODEL|ACCELERATOR")
    p.add_argument("--reason", default="", help="recorded in the audit (at most 1024 characters)")
    p = command("clear", "remove the δ override, the pin or the objective of a scope (NOT_FOUND when there is none)")
    p.add_argument("kind", choices=sorted(_KINDS))
    p.add_argument("--scope", type=parse_scope, required=True, help=_SCOPE_HELP)
    p.add_argument("--strict", action="store_true", help=_STRICT_HELP)
    p.add_argument("--reason", default="", help="recorded in the audit")
    p = command("watch", "the current decisions, then every decision as it is pushed (Ctrl-C stops)")
    p.add_argument("--pool", type=parse_pool, metavar="MODEL|ACCELERATOR", help="only this pool")
    p.add_argument("--engine-id", default="", metavar="ENGINE", help="only this engine")
    p.add_argument("--max-events", type=bounded_int(low=0, high=2**31), default=0,
                   help="stop after this many pushed decisions (default 0: run until interrupted)")
    p.add_argument("--no-resume", dest="resume", action="store_false",
                   help="end when the controller goes away (default: reconnect and resume from the last decision "
                        "seen, the ones made meanwhile shown from the history)")
    p = command("calibration", "put or get a pool's cost profile (eb-vllm calibration JSON files)")
    p.add_argument("verb", choices=("put", "get"))
    p.add_argument("--pool", type=parse_pool, required=True, metavar="MODEL|ACCELERATOR")
    p.add_argument("--file", type=Path, action="append", default=[], metavar="JSON",
                   help="pd_calibration_*.json and/or beta_mb_*.json (put; may repeat, later files win)")
    p = command("report", "write a self-contained HTML report: decision timelines per pool and engine, latency "
                          "timelines per pool, overrides, the explain view of every engine, the audit")
    add_report_arguments(p)
    parser.set_defaults(run=run)


def resolve_connection(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """address, token and TLS paths: the flag, else its environment variable, else the default."""
    def pick(name: str) -> Any:
        value = getattr(args, name, None)
        if value is None:
            value = env.get(ENVIRONMENT[name]) or None
        return value

    return {"address": pick("address") or DEFAULT_ADDRESS, "token": pick("token") or "",
            "tls_ca": pick("tls_ca"), "tls_cert": pick("tls_cert"), "tls_key": pick("tls_key")}


def _read_pem(path: Any, flag: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot read: {exc.strerror}") from None


def _channel(connection: dict[str, Any]) -> grpc.aio.Channel:
    ca = _read_pem(connection["tls_ca"], "--tls-ca")
    cert = _read_pem(connection["tls_cert"], "--tls-cert")
    key = _read_pem(connection["tls_key"], "--tls-key")
    if (cert is None) != (key is None):
        raise UsageError("--tls-cert and --tls-key go together (mutual TLS)")
    if ca is None:
        if cert is not None:
            raise UsageError("--tls-cert/--tls-key need --tls-ca (TLS)")
        return grpc.aio.insecure_channel(connection["address"])
    credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    return grpc.aio.secure_channel(connection["address"], credentials)


class Ctl:
    """One ctl invocation: a stub, call options and the output format."""

    def __init__(self, stub: operator_pb2_grpc.OperatorServiceStub, *, metadata: tuple, timeout_s: float,
                 fmt: str, address: str) -> None:
        self.stub = stub
        self.metadata = metadata
        self.timeout_s = timeout_s or None
        self.fmt = fmt
        self.address = address

    def kw(self) -> dict[str, Any]:
        return {"metadata": self.metadata, "timeout": self.timeout_s}

    def emit(self, data: Any, table) -> None:
        if self.fmt == "table":
            table()
        else:
            output.print_data(data, self.fmt)

    # ---- reads ----

    async def engine_rows(self, pool: common_pb2.Pool | None = None) -> list[dict[str, Any]]:
        request = operator_pb2.ListEnginesRequest()
        if pool is not None:
            request.pool.CopyFrom(pool)
        infos = (await self.stub.ListEngines(request, **self.kw())).engines
        views = await asyncio.gather(*(self.decision_view(info.engine_id) for info in infos))
        return [engine_row(info, view) for info, view in zip(infos, views, strict=True)]

    async def decision_view(self, engine_id: str) -> operator_pb2.DecisionView | None:
        try:
            return await self.stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id=engine_id), **self.kw())
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    async def list(self, args: argparse.Namespace) -> int:
        rows = await self.engine_rows(args.pool)
        self.emit({"engines": rows}, lambda: output.print_table(_LIST_COLUMNS, [list_cells(r) for r in rows]))
        return 0

    async def get(self, args: argparse.Namespace) -> int:
        view = await self.stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id=args.engine_id), **self.kw())
        infos = (await self.stub.ListEngines(operator_pb2.ListEnginesRequest(), **self.kw())).engines
        info = next((i for i in infos if i.engine_id == args.engine_id), None)
        data = output.message_to_dict(view)
        data["engine"] = engine_info_dict(info) if info is not None else None
        self.emit(data, lambda: output.print_fields(get_fields(data)))
        return 0

    async def explain(self, args: argparse.Namespace) -> int:
        view = await self.stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id=args.engine_id), **self.kw())
        data = explain(view)
        title = (f"{data['engine_id']}  pool {output.pool_text(data['pool'])}  "
                 f"{data['source']} computation at {data['computed_at'] or '-'}  version {data['decision_version']}")
        self.emit(data, lambda: output.print_table(("TERM", "VALUE", "UNIT", "MEANING"), explain_rows(data),
                                                   title=title))
        return 0

    async def overrides(self, args: argparse.Namespace) -> int:
        response = await self.stub.ListOverrides(operator_pb2.ListOverridesRequest(), **self.kw())
        rows = [output.message_to_dict(r) for r in response.overrides]
        self.emit({"overrides": rows}, lambda: output.print_table(
            ("SCOPE", "KIND", "VALUE", "EXPIRES", "SET BY", "SET AT", "REASON"),
            [(r["scope"], r["kind"], override_value(r), r["expires_at"] or "never", r["set_by"], r["set_at"],
              r["reason"]) for r in rows]))
        return 0

    async def audit(self, args: argparse.Namespace) -> int:
        response = await self.stub.ListAudit(operator_pb2.ListAuditRequest(limit=args.limit), **self.kw())
        rows = [audit_dict(entry) for entry in response.entries]
        self.emit({"entries": rows}, lambda: output.print_table(
            ("AT", "ACTOR", "ACTION", "KIND", "TARGET", "REASON", "OLD", "NEW"),
            [(r["at"], r["actor"], r["action"], r["kind"], r["target"], r["reason"], audit_summary(r["old"]),
              audit_summary(r["new"])) for r in rows]))
        return 0

    # ---- changes ----

    async def _record(self, record: operator_pb2.OverrideRecord, action: str) -> int:
        """Print the record a change answered with: its warnings on stderr, then the fields that `action`
        (set-delta, pin or clear) concerns as a table, or every field as data."""
        data = output.message_to_dict(record)
        for warning in record.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        self.emit(data, lambda: output.print_fields([(key, data[key]) for key in _RECORD_FIELDS[action]]))
        return 0

    async def check_scope(self, args: argparse.Namespace) -> None:
        """With --strict, raise UnknownScopeError unless the scope is the fleet or covers an engine that
        ListEngines lists (the test the controller warns on, `scopes.unknown_scope`)."""
        if not args.strict or args.scope.kind == operator_pb2.SCOPE_KIND_FLEET:
            return
        engines = (await self.stub.ListEngines(operator_pb2.ListEnginesRequest(), **self.kw())).engines
        unknown = unknown_scope(args.scope, engines)
        if unknown is not None:
            raise UnknownScopeError(unknown)

    async def set_delta(self, args: argparse.Namespace) -> int:
        await self.check_scope(args)
        return await self._record(await self.stub.SetDelta(operator_pb2.SetDeltaRequest(
            scope=args.scope, delta_s_per_token=args.delta, expires_in_s=args.expires_in_s, reason=args.reason),
            **self.kw()), "set-delta")

    async def pin(self, args: argparse.Namespace) -> int:
        await self.check_scope(args)
        return await self._record(await self.stub.PinMode(operator_pb2.PinModeRequest(
            scope=args.scope, mode=_PINS[args.mode], k=args.k, n=args.n, expires_in_s=args.expires_in_s,
            reason=args.reason), **self.kw()), "pin")

    async def set_objective(self, args: argparse.Namespace) -> int:
        await self.check_scope(args)
        objective = operator_pb2.LatencyObjective(
            ttft_quantile=args.ttft_quantile, ttft_target_s=args.ttft_target_s, tpot_quantile=args.tpot_quantile,
            tpot_target_s=args.tpot_target_s, delta_min_s_per_token=args.delta_min,
            delta_max_s_per_token=args.delta_max, budget_min_tokens=args.budget_min, budget_max_tokens=args.budget_max)
        return await self._record(await self.stub.SetObjective(operator_pb2.SetObjectiveRequest(
            scope=args.scope, objective=objective, expires_in_s=args.expires_in_s, reason=args.reason),
            **self.kw()), "set-objective")

    async def objectives(self, args: argparse.Namespace) -> int:
        response = await self.stub.ListOverrides(operator_pb2.ListOverridesRequest(), **self.kw())
        rows = [output.message_to_dict(r) for r in response.overrides
                if r.kind == operator_pb2.OVERRIDE_KIND_OBJECTIVE]
        self.emit({"objectives": rows}, lambda: output.print_table(
            ("SCOPE", "OBJECTIVE", "EXPIRES", "SET BY", "SET AT", "REASON"),
            [(r["scope"], override_value(r), r["expires_at"] or "never", r["set_by"], r["set_at"], r["reason"])
             for r in rows]))
        return 0

    async def rollouts(self, args: argparse.Namespace) -> int:
        response = await self.stub.ListRollouts(operator_pb2.ListRolloutsRequest(), **self.kw())
        running = [output.message_to_dict(r) for r in response.rollouts]
        recent = [output.message_to_dict(r) for r in response.recent]
        self.emit({"rollouts": running, "recent": recent}, lambda: output.print_table(
            ("POOL", "CHANGE", "STATE", "STARTED", "ENDED", "CANARIES", "DETAIL"),
            [(output.pool_text(r["pool"]), f"{r['from_mode']}→{r['to_mode']}", r["state"],
              r["started_at"], r["ended_at"] or "-",
              "switchback" if r.get("switchback") else f"{len(r['canary_engine_ids'])} of {r['num_engines']}",
              r["detail"]) for r in running + recent]))
        return 0

    async def rollout(self, args: argparse.Namespace) -> int:
        action = {"promote": operator_pb2.ROLLOUT_ACTION_PROMOTE, "abort": operator_pb2.ROLLOUT_ACTION_ABORT}
        view = await self.stub.SteerRollout(operator_pb2.SteerRolloutRequest(
            pool=args.pool, action=action[args.rollout_action], reason=args.reason), **self.kw())
        data = output.message_to_dict(view)
        pool = output.pool_text(output.message_to_dict(view.pool))
        self.emit(data, lambda: output.print_fields([("pool", pool), *((key, data[key]) for key in (
            "from_mode", "to_mode", "state", "ended_at", "detail"))]))
        return 0

    async def clear(self, args: argparse.Namespace) -> int:
        await self.check_scope(args)
        return await self._record(await self.stub.ClearOverride(operator_pb2.ClearOverrideRequest(
            scope=args.scope, kind=_KINDS[args.kind], reason=args.reason), **self.kw()), "clear")

    async def calibration(self, args: argparse.Namespace) -> int:
        if args.verb == "get":
            if args.file:
                raise UsageError("calibration get takes no --file")
            calibration = await self.stub.GetCalibration(operator_pb2.GetCalibrationRequest(pool=args.pool),
                                                         **self.kw())
        else:
            calibration = await self.stub.PutCalibration(operator_pb2.PutCalibrationRequest(
                calibration=calibration_from_files(args.file, args.pool)), **self.kw())
        data = output.message_to_dict(calibration)
        self.emit(data, lambda: output.print_fields(calibration_fields(data)))
        return 0

    # ---- streams and reports ----

    async def watch(self, args: argparse.Namespace) -> int:
        request = operator_pb2.WatchDecisionsRequest(engine_id=args.engine_id)
        if args.pool:
            request.pool.CopyFrom(args.pool)
        # Subscribe first, then take the snapshot: a decision pushed in between shows up in both and is
        # printed once (by engine and version).
        stream = self.stub.WatchDecisions(request, metadata=self.metadata)
        printer = WatchPrinter(self.fmt)
        since_s = time.time()
        for row in await self.engine_rows(args.pool):
            if args.engine_id and row["engine_id"] != args.engine_id:
                continue
            printer.show(row, event="snapshot")
        num_events = 0
        while True:
            try:
                async for view in stream:
                    since_s = max(since_s, view.decision.decided_at_s)
                    if printer.seen(view.engine_id, view.decision.version):
                        continue
                    printer.show(engine_row(None, view), event="pushed")
                    num_events += 1
                    if args.max_events and num_events >= args.max_events:
                        stream.cancel()
                        return 0
                return 0
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or not args.resume:
                    raise
            # The controller went away (a restart, a rolling upgrade): resume from the last decision seen, so
            # the decisions made meanwhile are shown from the history, each version once.
            print(f"watch: the controller is unavailable; resuming from {output.iso_utc(since_s)}", file=sys.stderr)
            await asyncio.sleep(RESUME_WAIT_S)
            request.since_s = since_s
            stream = self.stub.WatchDecisions(request, metadata=self.metadata)

    async def report(self, args: argparse.Namespace) -> int:
        engines = await self.engine_rows()
        async def read_views() -> list[operator_pb2.DecisionView]:
            return [v for v in await asyncio.gather(*(self.decision_view(e["engine_id"]) for e in engines)) if v]
        async def read_explains() -> list[dict[str, Any]]:
            return [explain(v) for v in await read_views()]

        samples = await sample_latencies(read_explains, num_samples=args.latency_samples - 1,
                                         every_s=args.latency_every_s)
        engines = await self.engine_rows() if samples else engines  # the engines as they are at the end
        history = await self.stub.ListHistory(operator_pb2.ListHistoryRequest(limit=args.history_limit),
                                              **self.kw())
        overrides = await self.stub.ListOverrides(operator_pb2.ListOverridesRequest(), **self.kw())
        audit = await self.stub.ListAudit(operator_pb2.ListAuditRequest(limit=50), **self.kw())
        views = await read_views()
        explains = [explain(v) for v in views]
        samples += pool_samples(explains, at_s=time.time())
        if args.latency_history_s:
            pools = [*(v.pool for v in views), *(e.pool for e in history.entries)]
            samples += await recorded_latencies(lambda request: self.stub.ListLatencyHistory(request, **self.kw()),
                                                pools, since_s=time.time() - args.latency_history_s)
        page = render_report(
            generated_at_s=time.time(), address=self.address, engines=engines,
            history=[output.message_to_dict(e) for e in history.entries],
            overrides=[output.message_to_dict(r) for r in overrides.overrides],
            explains=explains, audit=[audit_dict(a) for a in audit.entries], latency_samples=samples,
        )
        try:
            args.out.write_text(page, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--out {args.out}: cannot write: {exc.strerror}") from None
        print(f"wrote {args.out}: {len(engines)} engines, {len(history.entries)} decisions", file=sys.stderr)
        return 0


def override_value(record: dict[str, Any]) -> str:
    if record["kind"] == "delta":
        return f"δ={record['delta_s_per_token']:.6g} s/token"
    if record["kind"] == "objective":
        objective = record["objective"] or {}
        parts = [f"{name.upper()} p{100 * objective[f'{name}_quantile']:g} ≤ {objective[f'{name}_target_s']:g} s"
                 for name in ("ttft", "tpot") if objective.get(f"{name}_quantile")]
        return ", ".join(parts)
    parts = [record["mode"]]
    parts += [f"k={record['k']}"] if record["k"] else []
    parts += [f"n={record['n']}"] if record["n"] else []
    return " ".join(parts)


def calibration_fields(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """A calibration's table rows: its fields, the pool written as the CLI takes it (MODEL|ACCELERATOR)."""
    return [(key, output.pool_text(data["pool"]) if key == "pool" else value) for key, value in data.items()]


def audit_dict(entry: operator_pb2.AuditEntry) -> dict[str, Any]:
    """An audit entry with its old and new values (`audited_value`)."""
    data = output.message_to_dict(entry)
    for name in ("old", "new"):
        data[name] = audited_value(data.pop(f"{name}_json"), entry.kind)
    return data


def audited_value(text: str, kind: str) -> dict[str, Any] | None:
    """An audit entry's old or new JSON as the record it holds is shown elsewhere (`output.message_to_dict`:
    "pin", "eb", "pool:MODEL|ACCELERATOR"…, as `ctl overrides` and `calibration get` print it); the JSON as
    stored when it is not such a record (an entry of another kind or release); null when empty or not JSON."""
    try:
        value = json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
    message_type = _AUDITED.get(kind)
    if not isinstance(value, dict) or message_type is None:
        return value
    try:
        return output.message_to_dict(json_format.ParseDict(value, message_type(), ignore_unknown_fields=True))
    except json_format.ParseError:
        return value


def audit_summary(value: dict[str, Any] | None) -> str | None:
    """An audit entry's old or new value in a table cell: "δ=2e-05 s/token", "eb k=8 n=32", the calibration's
    fixed costs, else the start of its JSON."""
    if value is None:
        return None
    if value.get("kind") in _KINDS:
        return override_value(value)
    if "alpha_p_s" in value:
        return f"α_p={value['alpha_p_s']:.4g} α_d={value.get('alpha_d_s', 0):.4g}"
    return json.dumps(value)[:60]


def calibration_from_files(paths: list[Path], pool: common_pb2.Pool) -> operator_pb2.Calibration:
    """The Calibration message of eb-vllm calibration files (later files win); UsageError naming the file."""
    if not paths:
        raise UsageError("calibration put needs --file (pd_calibration_*.json, optionally beta_mb_*.json)")
    profile = CalibrationProfile()
    for path in paths:
        try:
            profile = profile.merged(parse_calibration(json.loads(path.read_text())))
        except OSError as exc:
            raise UsageError(f"--file {path}: cannot read: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise UsageError(f"--file {path}: not JSON: {exc}") from None
        except CalibrationError as exc:
            raise UsageError(f"--file {path}: {exc}") from None
    costs = profile.to_cost_model()
    if costs is None:
        raise UsageError("calibration put needs a pd_calibration file (alpha_p, beta_p, alpha_d, beta_d)")
    return cost_model_to_calibration(costs, pool, source=",".join(p.name for p in paths))


_COMMANDS = {"list": Ctl.list, "get": Ctl.get, "explain": Ctl.explain, "overrides": Ctl.overrides,
             "audit": Ctl.audit, "set-delta": Ctl.set_delta, "pin": Ctl.pin, "clear": Ctl.clear,
             "set-objective": Ctl.set_objective, "objectives": Ctl.objectives, "rollouts": Ctl.rollouts,
             "rollout": Ctl.rollout,
             "watch": Ctl.watch, "calibration": Ctl.calibration, "report": Ctl.report}


async def _run(args: argparse.Namespace, connection: dict[str, Any]) -> int:
    metadata = (("authorization", f"Bearer {connection['token']}"),) if connection["token"] else ()
    async with _channel(connection) as channel:
        ctl = Ctl(operator_pb2_grpc.OperatorServiceStub(channel), metadata=metadata, timeout_s=args.timeout_s,
                  fmt=args.output, address=connection["address"])
        return await _COMMANDS[args.action](ctl, args)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    connection = resolve_connection(args, os.environ)
    try:
        return asyncio.run(until_interrupted(_run(args, connection)))
    except grpc.aio.AioRpcError as exc:
        details = " ".join((exc.details() or "").split())
        print(f"error: {exc.code().name}: {details} ({connection['address']})", file=sys.stderr)
        return 1
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except UnknownScopeError as exc:
        print(f"error: --strict: {exc}; nothing was changed", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return INTERRUPTED_EXIT
