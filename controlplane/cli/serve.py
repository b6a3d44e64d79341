"""`controlplane serve`: run one controller. Flags win over environment variables (CP_*).

Environment: CP_REDIS_URL, CP_DATA_DIR, CP_AGENT_TOKENS and CP_OPERATOR_TOKENS ("identity:token,…"),
CP_AGENT_SCOPES ("identity=engine-glob;engine-glob,…": the engine ids an agent identity may hold),
and the standard OTEL_* variables for trace export (nothing is exported unless they ask for it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Mapping
from pathlib import Path

from controlplane.core.types import PolicyConfig
from controlplane.observability.tracing import create_tracer_provider, tracing_settings_from_env
from controlplane.service.app import ControllerApp
from controlplane.service.config import ControllerConfig, DecisionLoopConfig, SecurityConfig


def default_data_dir(env: Mapping[str, str]) -> Path:
    """$XDG_DATA_HOME/vllm-controlplane, else ~/.local/share/vllm-controlplane."""
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "vllm-controlplane"


def parse_tokens(text: str, *, source: str) -> dict[str, str]:
    """"identity:token,identity:token" → {token: identity}; raises ValueError naming the source."""
    tokens: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        identity, sep, token = item.partition(":")
        if not sep or not identity or len(token) < 16:
            raise ValueError(f"{source}: expected identity:token with a token of ≥ 16 characters, got {item!r}")
        tokens[token] = identity
    return tokens


def parse_scopes(text: str) -> dict[str, tuple[str, ...]]:
    """"identity=glob;glob,identity=glob" → {identity: (glob, …)}: the engine ids each agent identity may
    hold (CP_AGENT_SCOPES); raises ValueError naming the bad entry."""
    scopes: dict[str, tuple[str, ...]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        identity, sep, globs = item.partition("=")
        patterns = tuple(filter(None, (g.strip() for g in globs.split(";"))))
        if not sep or not identity or not patterns:
            raise ValueError(f"CP_AGENT_SCOPES: expected identity=glob[;glob…], got {item!r}")
        scopes[identity] = patterns
    return scopes


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default %(default)s)")
    parser.add_argument("--port", type=int, default=50151, help="gRPC port (default %(default)s; 0 picks a free one)")
    parser.add_argument("--data-dir", type=Path, help="embedded Redis data directory (default: user data dir)")
    parser.add_argument("--redis-url", help="use this Redis instead of the embedded one: redis://host:port/db, "
                        "rediss://… (TLS), unix:///path, redis+sentinel://host:port[,host:port]/SERVICE[/db], "
                        "redis+cluster://host:port[,host:port] (env CP_REDIS_URL)")
    parser.add_argument("--controller-id", default=f"controller-{os.getpid()}", help="replica name")
    parser.add_argument("--metrics-port", type=int, default=0,
                        help="Prometheus /metrics port (default %(default)s; 0: off)")
    parser.add_argument("--metrics-host", default="127.0.0.1",
                        help="address /metrics listens on, unauthenticated (default %(default)s: loopback only; "
                        "0.0.0.0 for a Prometheus scrape from another host)")
    parser.add_argument("--tls-cert", type=Path, help="server certificate (PEM)")
    parser.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    parser.add_argument("--tls-client-ca", type=Path, help="CA for client certificates (mutual TLS)")
    parser.add_argument("--insecure", action="store_true",
                        help="allow listening on a non-loopback address without TLS and tokens")
    parser.add_argument("--decision-interval-s", type=float, default=5.0,
                        help="recompute period, s (default %(default)s)")
    parser.add_argument("--recompute-completions", type=int, default=256,
                        help="new completions that trigger a recomputation (default %(default)s)")
    parser.add_argument("--ttl-s", type=float, default=60.0,
                        help="decision lifetime at the agent, s (default %(default)s)")
    parser.add_argument("--min-samples", type=int, default=400,
                        help="completions before leaving cold start (default %(default)s)")
    parser.add_argument("--cooldown-s", type=float, default=30.0,
                        help="EB+ minimum time between switches, s (default %(default)s)")
    parser.add_argument("--max-connection-age-s", type=float, default=0.0,
                        help="end agent connections older than this with GOAWAY so they reconnect and spread over "
                        "replicas, s (default %(default)s: never)")
    parser.add_argument("--engine-ttl-s", type=float, default=300.0,
                        help="a disconnected engine is forgotten after this long, s (default %(default)s)")
    parser.add_argument("--bucket-s", type=float, default=1.0,
                        help="length of one pool-statistics bucket, s (default %(default)s)")
    parser.add_argument("--output-window", type=int, default=4096,
                        help="completions in a pool's output-length window, at least (default %(default)s)")
    parser.add_argument("--prompt-window", type=int, default=4096,
                        help="completions in a pool's prompt-length window, at least (default %(default)s)")
    parser.add_argument("--step-window", type=int, default=2048,
                        help="steps per cost phase in a pool's cost window, at least (default %(default)s)")
    parser.add_argument("--oom-tolerance", type=float, default=0.01,
                        help="ε: tolerated probability of exceeding the KV cache when sizing N (default %(default)s)")
    parser.add_argument("--theta-min", type=float, default=0.01, help="lower clip of θ̂* (default %(default)s)")
    parser.add_argument("--theta-max", type=float, default=0.8, help="upper clip of θ̂* (default %(default)s)")
    parser.add_argument("--hysteresis-rel", type=float, default=0.05,
                        help="EB+ relative hysteresis band (default %(default)s)")
    parser.add_argument("--no-memory-guard", action="store_true",
                        help="do not lower N when an engine preempts under EB")
    parser.add_argument("--readiness-grace-s", type=float, default=15.0,
                        help="store outage tolerated before readiness turns NOT_SERVING, s (default %(default)s)")
    parser.add_argument("--log-level", default="INFO")


def config_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> ControllerConfig:
    """Build the validated config; raises ValueError with a message naming the bad setting."""
    security = SecurityConfig(
        tls_cert=args.tls_cert, tls_key=args.tls_key, tls_client_ca=args.tls_client_ca,
        agent_tokens=parse_tokens(env.get("CP_AGENT_TOKENS", ""), source="CP_AGENT_TOKENS"),
        operator_tokens=parse_tokens(env.get("CP_OPERATOR_TOKENS", ""), source="CP_OPERATOR_TOKENS"),
        agent_scopes=parse_scopes(env.get("CP_AGENT_SCOPES", "")),
        insecure=args.insecure,
    )
    redis_url = args.redis_url or env.get("CP_REDIS_URL", "")
    data_dir = args.data_dir or (Path(env["CP_DATA_DIR"]) if env.get("CP_DATA_DIR") else default_data_dir(env))
    return ControllerConfig(
        host=args.host, port=args.port, controller_id=args.controller_id, redis_url=redis_url,
        data_dir=None if redis_url else data_dir, metrics_port=args.metrics_port, metrics_host=args.metrics_host,
        max_connection_age_s=args.max_connection_age_s,
        readiness_grace_s=args.readiness_grace_s,
        loop=DecisionLoopConfig(recompute_completions=args.recompute_completions,
                                interval_s=args.decision_interval_s, ttl_s=args.ttl_s, engine_ttl_s=args.engine_ttl_s,
                                bucket_s=args.bucket_s, output_window=args.output_window,
                                prompt_window=args.prompt_window, step_window=args.step_window),
        policy=PolicyConfig(min_samples=args.min_samples, cooldown_s=args.cooldown_s,
                            oom_tolerance=args.oom_tolerance, theta_min=args.theta_min, theta_max=args.theta_max,
                            hysteresis_rel=args.hysteresis_rel, memory_guard=not args.no_memory_guard),
        security=security,
    )


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("serve", help="run the controller", description=__doc__)
    add_server_arguments(parser)
    parser.set_defaults(run=run)


async def serve_until_signalled(app: ControllerApp) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with app:
        await stop.wait()


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = config_from_args(args, os.environ)
    except ValueError as exc:
        parser.error(str(exc))
    provider = create_tracer_provider(tracing_settings_from_env(os.environ))
    asyncio.run(serve_until_signalled(ControllerApp(config, tracer_provider=provider)))
    return 0
