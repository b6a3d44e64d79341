"""Controller load: N agent streams against real controller processes, with its own cheap load generator.

Each stream sends a Hello, then one TelemetryBatch per second (64 completions + 1,000 steps by default,
so 1,000 streams ≈ 1M events/s), and ACKs every decision it receives. Batches are pre-serialised: the
heavy columns are encoded once per workload variant, and each message only appends its sequence number
and a traceparent whose span id carries (stream, seq) — the controller copies the traceparent of the
batch that made a decision due into `Decision.trigger_traceparent`, so the generator measures batch →
decision latency end to end. The workload drifts (output-length variants cycle with the wall clock) so
pool estimates, and with them k and N, keep changing and decisions keep being pushed.

The controllers run as separate processes (`controlplane serve`) on one redis-server started here, with
the pool's calibration put first (EB/MB decisions from the first completions). Printed per scenario:
events/s and batches/s accepted (the controller's own counters), p50/p99/max batch → decision latency
(and the part of it up to the decision's `decided_at_s`, which tells the controller's share from the
push and the generator's own read),
streams never decided (no decision at all; no batch-triggered decision), controller CPU (cores) and RSS,
the generator's own CPU, Redis commands/s; for several replicas, whether decisions computed from the same
pool window carry identical pool terms (p0, η, μ_L, μ_O, θ0, samples) on every replica.

Workers (`--workers N`: one `controlplane serve --workers N`, its processes sharing one port) show as
"1xN" in the repl column; the default run ends with 1,000 and 2,000 streams on 2 workers.

    .venv/bin/python benchmarks/controller_load.py                      # 100, 1,000, 2,000 streams, 2 × 1,000
    .venv/bin/python benchmarks/controller_load.py --streams 300 --duration-s 20
    .venv/bin/python benchmarks/controller_load.py --smoke    # 20 streams on 2 replicas, then on 2 workers: seconds
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import re
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import redis  # noqa: E402

from controlplane.api.v1 import agent_pb2, common_pb2, operator_pb2, operator_pb2_grpc  # noqa: E402
from controlplane.protocol import pack_step_columns  # noqa: E402
from controlplane.store.embedded import start_redis_on_free_port  # noqa: E402
from testbench.net import free_port, free_ports  # noqa: E402
from testbench.proc import cpu_s, rss_mib  # noqa: E402

POOL = common_pb2.Pool(model="bench/Qwen3-8B", accelerator="NVIDIA H200")
CONNECT = "/controlplane.v1.AgentService/Connect"
STREAMS_PER_CHANNEL = 50
NUM_VARIANTS = 8
DRIFT_PERIOD_S = 16.0
# --smoke: (streams, replicas, workers) scenarios, and (duration_s, warmup_s, completions, steps, rss_every_s)
SMOKE_SCENARIOS = ((20, 2, 1), (20, 1, 2))
SMOKE_SIZES = (2.0, 2.0, 64, 100, 1.0)
H200 = dict(alpha_p_s=0.0012785933415095027, beta_p_s_per_token=2.4852551825304505e-05,
            alpha_d_s=0.008921181622454422, beta_d_s_per_request=4.586467522217373e-05,
            mb_coeffs_s_per_token=[2.494e-05, 5.193e-05, 1.478e-05])


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _heavy_variants(completions: int, steps: int, seed: int = 7, *, packed: bool = True) -> list[bytes]:
    """Serialised TelemetryBatch bodies (without seq/traceparent), one per output-length variant; packed: the
    steps in `Steps.packed_columns` (as the agents send them to a controller that reads them), else in the
    repeated fields (as older agents do)."""
    rng = np.random.default_rng(seed)
    variants = []
    for i in range(NUM_VARIANTS):
        mean_o = 128.0 * 2 ** (3.0 * i / (NUM_VARIANTS - 1))  # 128 … 1024 tokens
        outputs = np.maximum(1, rng.geometric(1.0 / mean_o, completions)).astype(int)
        prompts = rng.integers(64, 1024, completions)
        decode_req = rng.integers(1, 256, steps)
        prefill = np.where(rng.random(steps) < 0.1, rng.integers(256, 4096, steps), 0)
        duration = np.where(prefill > 0, 0.0013 + 2.5e-5 * prefill, 0.0089 + 4.6e-5 * decode_req)
        batch = agent_pb2.TelemetryBatch(
            completions=agent_pb2.Completions(prompt_tokens=prompts.tolist(), output_tokens=outputs.tolist(),
                                              finish_time_s=[1.7e9] * completions, aborted=[False] * completions),
            steps=_steps(prefill, np.where(prefill > 0, 0, decode_req), np.where(prefill > 0, 0, decode_req),
                         duration, packed=packed),
            kv_used_tokens=100_000, kv_total_tokens=1_500_000,
            scheduler=agent_pb2.SchedulerState(num_running_decodes=200, num_waiting=50),
            sent_at_s=1.7e9)
        variants.append(batch.SerializeToString())
    return variants


def _steps(prefill: np.ndarray, decode_tokens: np.ndarray, decode_requests: np.ndarray, duration_s: np.ndarray, *,
           packed: bool) -> agent_pb2.Steps:
    columns = (prefill.tolist(), decode_tokens.tolist(), decode_requests.tolist())
    if packed:
        return agent_pb2.Steps(packed_columns=pack_step_columns(duration_s.tolist(), *columns))
    return agent_pb2.Steps(prefill_tokens=columns[0], decode_tokens=columns[1], decode_requests=columns[2],
                           duration_s=duration_s.tolist())


def _message(heavy: bytes, *, stream: int, seq: int) -> bytes:
    traceparent = f"00-{'ab' * 16}-{stream:08x}{seq:08x}-01".encode()
    inner = (heavy + b"\x08" + _varint(seq) + b"\x4a" + _varint(len(traceparent)) + traceparent
             + b"\x41" + struct.pack("<d", time.time()))  # sent_at_s (field 8, fixed64): the last value wins
    return b"\x12" + _varint(len(inner)) + inner


def _hello(stream: int) -> bytes:
    hello = agent_pb2.Hello(engine_id=f"bench-{stream:05d}", pool=POOL, vllm_version="0.32.0", agent_version="bench",
                            instance_id=f"i{stream:05d}", instance_started_at_s=1.0,
                            limits=agent_pb2.EngineLimits(max_num_seqs=1024, max_num_batched_tokens=8192,
                                                          kv_capacity_tokens=1_500_000, block_size_tokens=16,
                                                          max_model_len_tokens=32768))
    return agent_pb2.AgentMessage(hello=hello).SerializeToString()


def _ack(version: int) -> bytes:
    return agent_pb2.AgentMessage(ack=agent_pb2.DecisionAck(version=version, applied=True)).SerializeToString()


@dataclass
class Results:
    sent_at: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)  # (monotonic, wall)
    latencies_s: list[float] = field(default_factory=list)
    to_decided_s: list[float] = field(default_factory=list)  # batch sent → the controller's decided_at_s
    decided: set[int] = field(default_factory=set)
    triggered: set[int] = field(default_factory=set)
    by_bucket: dict[int, set[tuple]] = field(default_factory=lambda: defaultdict(set))
    errors: list[str] = field(default_factory=list)


async def _stream(channel: grpc.aio.Channel, stream: int, variants: list[bytes], results: Results,
                  stop_at: float, measure_from: float) -> None:
    call = channel.stream_stream(CONNECT, request_serializer=None,
                                 response_deserializer=agent_pb2.ControllerMessage.FromString)()
    send_lock = asyncio.Lock()

    async def reader() -> None:
        try:
            await read_decisions()
        except grpc.aio.AioRpcError as exc:  # the controller ended the stream: counted like a write error
            if exc.code() != grpc.StatusCode.CANCELLED:
                results.errors.append(f"{stream}: {exc.code().name} {exc.details()}")

    async def read_decisions() -> None:
        async for message in call:
            now = time.monotonic()  # the decision's arrival, before the ACK is written (its write may wait)
            decision = message.decision
            results.decided.add(stream)
            async with send_lock:
                await call.write(_ack(decision.version))
            d = decision.diagnostics
            if d.pool_window_end_bucket:
                results.by_bucket[d.pool_window_end_bucket].add(
                    (round(d.p0, 15), round(d.eta, 18), round(d.mu_l_tokens, 9), round(d.mu_o_tokens, 9),
                     round(d.theta0, 12), d.num_samples))
            match = re.fullmatch(r"00-[0-9a-f]{32}-([0-9a-f]{8})([0-9a-f]{8})-01", decision.trigger_traceparent)
            if match:
                key = (int(match.group(1), 16), int(match.group(2), 16))
                sent = results.sent_at.pop(key, None)
                if sent is not None and sent[0] >= measure_from:
                    results.latencies_s.append(now - sent[0])
                    results.to_decided_s.append(decision.decided_at_s - sent[1])
                    results.triggered.add(stream)

    task = asyncio.create_task(reader())
    seq = 0
    next_s = time.monotonic() + (stream % 1000) / 1000.0
    try:
        await call.write(_hello(stream))
        while time.monotonic() < stop_at and not task.done():
            await asyncio.sleep(max(0.0, next_s - time.monotonic()))
            seq += 1
            variant = int(time.time() / (DRIFT_PERIOD_S / NUM_VARIANTS)) % NUM_VARIANTS
            payload = _message(variants[variant], stream=stream, seq=seq)
            results.sent_at[(stream, seq)] = (time.monotonic(), time.time())
            async with send_lock:
                await call.write(payload)
            next_s += 1.0
        await call.done_writing()
    except grpc.aio.AioRpcError as exc:
        results.errors.append(f"{stream}: {exc.code().name} {exc.details()}")
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        call.cancel()


def _connected(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("cp_connected_engines "))


def _accepted(metrics_port: int) -> tuple[float, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    events = batches = 0.0
    for line in text.splitlines():
        if line.startswith("cp_telemetry_events_total{") and 'result="accepted"' in line:
            events += float(line.rsplit(" ", 1)[1])
        elif line.startswith('cp_telemetry_batches_total{result="accepted"}'):
            batches += float(line.rsplit(" ", 1)[1])
    return events, batches


def _children(pid: int) -> list[int]:
    """Live child processes of `pid` (the workers of `serve --workers N`)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def _start_controller(redis_url: str, name: str, tmp: Path, *,
                      workers: int = 1) -> tuple[subprocess.Popen, list[tuple[int, int, int]]]:
    """`controlplane serve` (with `workers` processes on one port); returns the process and, per controller
    process, (pid, port, metrics port)."""
    port, metrics_port = free_port(), free_ports(workers)
    log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(
        [sys.executable, "-m", "controlplane", "serve", "--port", str(port), "--redis-url", redis_url,
         "--controller-id", name, "--metrics-port", str(metrics_port), "--log-level", "WARNING",
         "--workers", str(workers)],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            for i in range(workers):
                socket.create_connection(("127.0.0.1", metrics_port + i), timeout=0.2).close()
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            pids = _children(process.pid) if workers > 1 else [process.pid]
            if len(pids) == workers:
                return process, [(pid, port, metrics_port + i) for i, pid in enumerate(sorted(pids))]
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    process.wait()
    log.close()
    tail = (tmp / f"{name}.log").read_bytes()[-3000:].decode(errors="replace")  # the directory goes with the run
    raise RuntimeError(f"controller {name} did not listen (exit code {process.returncode}); its log "
                       f"ends:\n{tail}")


async def _put_calibration(port: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = operator_pb2_grpc.OperatorServiceStub(channel)
        await stub.PutCalibration(operator_pb2.PutCalibrationRequest(
            calibration=operator_pb2.Calibration(pool=POOL, source="bench", **H200)))


async def _drive(ports: list[int], num_streams: int, variants: list[bytes], duration_s: float, warmup_s: float,
                 results: Results, *, streams_per_channel: int = STREAMS_PER_CHANNEL) -> None:
    # Channels alternate between the replicas, so the streams (and one pool's engines) split evenly; each
    # channel is its own TCP connection (workers on one port get the connections the kernel gives them).
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{ports[i % len(ports)]}",
                                          options=[("grpc.use_local_subchannel_pool", 1)])
                for i in range(math.ceil(num_streams / streams_per_channel))]
    start = time.monotonic()
    stop_at = start + warmup_s + duration_s
    tasks = [asyncio.create_task(_stream(channels[i // streams_per_channel], i, variants, results, stop_at,
                                         start + warmup_s)) for i in range(num_streams)]
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close()


def run_scenario(num_streams: int, *, replicas: int, duration_s: float, warmup_s: float, completions: int,
                 steps: int, rss_every_s: float = 10.0, workers: int = 1, packed: bool = True) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as raw:
        tmp = Path(raw)
        redis_url, server = start_redis_on_free_port(tmp)
        started = [_start_controller(redis_url, f"replica-{i}", tmp, workers=workers) for i in range(replicas)]
        processes = [process for process, _ in started]
        controllers = [c for _, per_process in started for c in per_process]  # (pid, port, metrics port)
        try:
            asyncio.run(_put_calibration(controllers[0][1]))
            variants = _heavy_variants(completions, steps, packed=packed)
            results = Results()
            r = redis.Redis.from_url(redis_url)
            rss_samples: list[float] = []
            connected: list[float] = []
            scrape_s: list[float] = []
            pids = [c[0] for c in controllers]
            gen_cpu0 = resource.getrusage(resource.RUSAGE_SELF)
            wall0 = time.monotonic()

            async def main() -> tuple[list[float], list[tuple[float, float]], float, float]:
                # Workers share a port: more, smaller channels spread the streams evenly over them.
                measure_at = time.monotonic() + warmup_s
                driver = asyncio.create_task(_drive(sorted({c[1] for c in controllers}), num_streams, variants,
                                                    duration_s, warmup_s, results,
                                                    streams_per_channel=10 if workers > 1 else STREAMS_PER_CHANNEL))
                # The accepted-events counters are scraped outside the latency window (2 s before it and after
                # the streams stopped): at 1,000 engines a scrape takes the controller ~0.1-0.2 s of CPU, which
                # a load generator that scrapes nothing would not see. The scrape under load is timed instead.
                await asyncio.sleep(max(0.0, warmup_s - 2.0))
                scrape_at = time.monotonic()
                acc0 = await asyncio.gather(*(asyncio.to_thread(_accepted, c[2]) for c in controllers))
                scrape_s.append(time.monotonic() - scrape_at)
                await asyncio.sleep(max(0.0, measure_at - time.monotonic()))
                cpu0 = [cpu_s(p) for p in pids]
                cmds0 = float(r.info("stats")["total_commands_processed"])
                t0 = time.monotonic()
                while time.monotonic() - t0 < duration_s:  # RSS sampled over the run (a soak shows growth)
                    await asyncio.sleep(min(rss_every_s, max(0.0, duration_s - (time.monotonic() - t0))))
                    rss_samples.append(max(rss_mib(p) for p in pids))
                elapsed = time.monotonic() - t0
                cpu = [(cpu_s(p) - c) / elapsed for p, c in zip(pids, cpu0, strict=True)]
                cmds = (float(r.info("stats")["total_commands_processed"]) - cmds0) / elapsed
                rss = max(rss_mib(p) for p in pids)
                # The streams stop sending now: what follows is outside the window.
                connected.append(sum(await asyncio.gather(*(asyncio.to_thread(_connected, c[2]) for c in controllers))))
                await driver
                acc1 = await asyncio.gather(*(asyncio.to_thread(_accepted, c[2]) for c in controllers))
                counted_s = measure_at + duration_s - scrape_at
                acc = [tuple((b - a) / counted_s for a, b in zip(a0, a1, strict=True))
                       for a0, a1 in zip(acc0, acc1, strict=True)]
                return cpu, acc, cmds, rss

            cpu, acc, cmds, rss = asyncio.run(main())
            wall = time.monotonic() - wall0
            gen_cpu1 = resource.getrusage(resource.RUSAGE_SELF)
            gen_cores = (gen_cpu1.ru_utime + gen_cpu1.ru_stime - gen_cpu0.ru_utime - gen_cpu0.ru_stime) / wall
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=30)
            server.stop()
    lat = np.array(results.latencies_s) * 1000.0
    to_decided = np.array(results.to_decided_s) * 1000.0
    disagreeing = sum(1 for terms in results.by_bucket.values() if len(terms) > 1)
    return {
        "streams": num_streams, "replicas": replicas, "workers": workers,
        "events_per_s": sum(a[0] for a in acc), "batches_per_s": sum(a[1] for a in acc),
        "p50_ms": float(np.percentile(lat, 50)) if lat.size else math.nan,
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else math.nan,
        "max_ms": float(lat.max()) if lat.size else math.nan, "num_latencies": int(lat.size),
        "to_decided_p50_ms": float(np.percentile(to_decided, 50)) if to_decided.size else math.nan,
        "to_decided_p99_ms": float(np.percentile(to_decided, 99)) if to_decided.size else math.nan,
        "never_decided": num_streams - len(results.decided),
        "never_triggered": num_streams - len(results.triggered),
        "controller_cores": cpu, "controller_rss_mib": rss, "generator_cores": gen_cores,
        "redis_cmds_per_s": cmds, "buckets_compared": len(results.by_bucket), "buckets_disagreeing": disagreeing,
        "stream_errors": len(results.errors), "first_error": results.errors[0] if results.errors else "",
        "rss_samples_mib": rss_samples,
        "undecided_ids": sorted(set(range(num_streams)) - results.decided),
        "connected_at_end": connected[0] if connected else math.nan,
        "scrape_ms": 1000.0 * scrape_s[0] if scrape_s else math.nan,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, action="append", help="stream counts (default 100, 1000, 2000)")
    parser.add_argument("--replicas", type=int, default=1, help="controller processes for --streams runs")
    parser.add_argument("--workers", type=int, default=1,
                        help="`serve --workers N` per replica: N processes sharing one port")
    parser.add_argument("--duration-s", type=float, default=30.0, help="measured seconds per scenario")
    parser.add_argument("--warmup-s", type=float, default=10.0, help="seconds before measuring")
    parser.add_argument("--completions", type=int, default=64, help="completions per batch")
    parser.add_argument("--steps", type=int, default=1000, help="steps per batch")
    parser.add_argument("--rss-every-s", type=float, default=10.0,
                        help="sample the controllers' RSS this often while measuring (soak: --duration-s 600)")
    parser.add_argument("--steps-encoding", choices=("packed", "repeated", "both"), default="packed",
                        help="how batches carry their steps: packed (today's agents), repeated fields (older "
                             "agents), or both, one after the other, with their ratio")
    parser.add_argument("--smoke", action="store_true",
                        help="20 streams on 2 replicas, then on 1x2 workers, 2 s each: the same code paths in seconds")
    args = parser.parse_args()
    scenarios = [(n, args.replicas, args.workers) for n in args.streams] if args.streams else \
        [(100, 1, 1), (1000, 1, 1), (2000, 1, 1), (1000, 2, 1), (1000, 1, 2), (2000, 1, 2)]
    if args.smoke:
        scenarios = list(SMOKE_SCENARIOS)
        args.duration_s, args.warmup_s, args.completions, args.steps, args.rss_every_s = SMOKE_SIZES
    header = (f"{'streams':>7} {'repl':>4} {'events/s':>10} {'batches/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'max ms':>8} {'undecided':>9} {'untrig':>6} {'ctl cores':>10} {'RSS MiB':>8} {'gen cores':>9} "
              f"{'redis cmd/s':>11} {'agree':>9}")
    print(header)
    encodings = ("packed", "repeated") if args.steps_encoding == "both" else (args.steps_encoding,)
    per_batch: dict[str, float] = {}  # controller CPU seconds per accepted batch, by encoding
    for (streams, replicas, workers), encoding in ((s, e) for s in scenarios for e in encodings):
        row = run_scenario(streams, replicas=replicas, duration_s=args.duration_s, warmup_s=args.warmup_s,
                           completions=args.completions, steps=args.steps, rss_every_s=args.rss_every_s,
                           workers=workers, packed=encoding == "packed")
        if len(encodings) > 1:
            print(f"        steps {encoding}:", flush=True)
        cores = "+".join(f"{c:.2f}" for c in row["controller_cores"])
        agree = f"{row['buckets_compared'] - row['buckets_disagreeing']}/{row['buckets_compared']}"
        processes = f"{replicas}x{workers}" if workers > 1 else str(replicas)
        print(f"{streams:>7} {processes:>4} {row['events_per_s']:>10.0f} {row['batches_per_s']:>9.0f} "
              f"{row['p50_ms']:>8.1f} {row['p99_ms']:>8.1f} {row['max_ms']:>8.1f} {row['never_decided']:>9} "
              f"{row['never_triggered']:>6} {cores:>10} {row['controller_rss_mib']:>8.0f} "
              f"{row['generator_cores']:>9.2f} {row['redis_cmds_per_s']:>11.0f} {agree:>9}", flush=True)
        print(f"        of which batch sent → decided at the controller (its wall clock): "
              f"p50 {row['to_decided_p50_ms']:.1f} ms, p99 {row['to_decided_p99_ms']:.1f} ms; the rest is the push "
              f"and the generator's own read; a /metrics scrape under this load (outside the window) took "
              f"{row['scrape_ms']:.0f} ms", flush=True)
        samples = row["rss_samples_mib"]
        if len(samples) >= 2:
            print(f"        RSS MiB over the run: first {samples[0]:.0f}, min {min(samples):.0f}, "
                  f"max {max(samples):.0f}, last {samples[-1]:.0f} ({len(samples)} samples)", flush=True)
        if row["undecided_ids"]:
            ids = row["undecided_ids"]
            print(f"        undecided streams: {ids[:10]}{' …' if len(ids) > 10 else ''}; streams the controllers "
                  f"held at the end: {row['connected_at_end']:.0f}", flush=True)
        if row["stream_errors"]:
            print(f"        {row['stream_errors']} stream errors, first: {row['first_error']}", flush=True)
        per_batch[encoding] = sum(row["controller_cores"]) / row["batches_per_s"] if row["batches_per_s"] else math.nan
        if encoding == "repeated" and len(encodings) > 1:
            print(f"        controller CPU per batch, packed / repeated: {per_batch['packed'] * 1e6:.0f} / "
                  f"{per_batch['repeated'] * 1e6:.0f} µs = {per_batch['packed'] / per_batch['repeated']:.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
