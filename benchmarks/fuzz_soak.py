"""Fuzz soak: a controller process under 100,000+ untrusted messages, with 100,000 engine ids coming and going.

A redis-server (`start_redis_on_free_port`) and `controlplane serve --port 0 --redis-url …` (its own process,
short `--engine-ttl-s`), then from this process over real gRPC:
- a few well-behaved engines (`--good-engines`) streaming geometric telemetry and ACKing every decision for
  the whole run (their longest wait for a decision is measured against the keep-alive period ttl_s/3);
- `--engines` distinct engine ids that each connect, send a batch and leave (one in `--pool-every` claims a
  made-up pool of its own), interleaved with `--scripts` fuzz streams from `testbench/fuzz_messages`
  (hypothesis-drawn messages with one known fault each, or byte mutations, or claims on the good engines'
  ids by older agent instances);
- a warm-up first (`--warmup-engines` churning engines and `--warmup-scripts` fuzz streams of every kind, drawn
  with another seed), so the RSS baseline is taken with every code path warm (with churn alone, the
  rejection paths' first use landed in the first round: +17% after it, and +0.6 MiB per 10,000 streams after).

Printed: the run's figures as a table — streams and messages sent, the statuses they ended with, crashes
(the controller process exiting, a background loop restarting, a stream ending with a status that is neither
OK nor a rejection), non-finite numbers in any decision or view, `cp_rejections_total` by cause against the
bad streams sent, the good engines' longest gap between decisions, the engines and pools still known after
eviction, Redis keys before, at the end and once the gone engines' keys expired (`--engine-retention-s`),
and the controller's RSS (VmRSS from /proc/PID/status) at the baseline, at its peak and after each round's
eviction, and what each round after the first adds (the first leaves the allocators' high water at the churn's
peak; later rounds show what stays per engine id). Exits 1 when a crash or a non-finite number is seen (RSS is
reported, not judged: the goal is "back within 10% of the baseline after eviction").

    .venv/bin/python benchmarks/fuzz_soak.py                                   # the default run, ≤ ~5 min
    .venv/bin/python benchmarks/fuzz_soak.py --engines 5000 --scripts 1000     # a quick look
    .venv/bin/python benchmarks/fuzz_soak.py --smoke     # every step at tiny sizes, short waits: seconds
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import redis  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from controlplane.api.v1 import agent_pb2, common_pb2, operator_pb2, operator_pb2_grpc  # noqa: E402
from controlplane.service.memory import TRIM_QUIET_S  # noqa: E402
from controlplane.store.embedded import start_redis_on_free_port  # noqa: E402
from testbench.fuzz_messages import (  # noqa: E402
    CAUSES,
    TARGET_STARTED_AT_S,
    LiveAgent,
    StreamOutcome,
    StreamScript,
    compose_scripts,
    draw_corpus,
    non_finite_doubles,
    pool_names,
    run_script,
    stream_telemetry,
    telemetry_payload,
)
from testbench.messages import LIMITS  # noqa: E402
from testbench.net import free_port  # noqa: E402
from testbench.proc import cpu_s, rss_mib  # noqa: E402
from testbench.serve_process import ServeProcess  # noqa: E402

POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="RTX PRO 6000")
STREAMS_PER_CHANNEL = 32
# --smoke: every step of the soak at tiny sizes, and a short wait where the controller would trim its memory (RSS
# is not the point of a smoke run)
SMOKE = dict(engines=200, scripts=60, warmup_engines=20, warmup_scripts=20, good_engines=1, pool_every=50,
             engine_ttl_s=1.0, engine_retention_s=1.0, expiry_slack_s=1.0, concurrency=16, rounds=2, corpus_scale=0.1)
SMOKE_QUIET_S = 0.5


def _metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _total(metrics: dict, name: str, **labels: str) -> float:
    return sum(value for (sample, sample_labels), value in metrics.items()
               if sample == name and all(dict(sample_labels).get(k) == v for k, v in labels.items()))


def _label_values(metrics: dict, name: str, label: str) -> set[str]:
    return {dict(labels)[label] for (sample, labels), _ in metrics.items() if sample == name and label in dict(labels)}


@dataclass
class Tally:
    """What came back from the streams sent (folded as they end: no outcome is kept)."""

    streams: int = 0
    messages: int = 0
    codes: Counter = field(default_factory=Counter)
    expected: Counter = field(default_factory=Counter)  # rejections by cause, streams of known fault
    mutated_rejected: int = 0
    wrong_status: list[str] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)  # hung, or ended neither OK nor rejected
    decisions: int = 0
    non_finite: list[str] = field(default_factory=list)
    lost_status: int = 0

    def add(self, outcome: StreamOutcome) -> None:
        script = outcome.script
        self.streams += 1
        self.messages += script.num_messages
        self.codes[outcome.code.name if outcome.code is not None else "HUNG"] += 1
        self.lost_status += int(outcome.status_lost)
        if outcome.code is None or (outcome.code != grpc.StatusCode.OK and not outcome.rejected):
            self.broken.append(f"{script.fault}: {outcome.code} {outcome.details[:100]}")
        if script.determinable:
            if script.cause is not None:
                self.expected[script.cause] += 1
            if outcome.code != script.code and not (outcome.status_lost and script.cause is not None):
                self.wrong_status.append(f"{script.fault}: expected {script.code}, got {outcome.code} "
                                         f"{outcome.details[:100]}")
        elif outcome.rejected:
            self.mutated_rejected += 1
        for decision in outcome.decisions:
            self.decisions += 1
            self.non_finite.extend(f"{outcome.engine_id}: {path}" for path in non_finite_doubles(decision))


def _churn_script(index: int, *, made_up_pool: bool, batch: bytes) -> StreamScript:
    pool = common_pb2.Pool(model=f"made-up-{index}", accelerator="soak") if made_up_pool else POOL
    hello = agent_pb2.AgentMessage(hello=agent_pb2.Hello(
        engine_id=f"churn-{index}", pool=pool, vllm_version="0.32.0", agent_version="soak", limits=LIMITS,
        instance_id=f"churn-{index}", instance_started_at_s=1.7e9))
    return StreamScript("none:churn", None, (hello, batch), rebindable=False)


async def _run_jobs(channels: list[grpc.aio.Channel], jobs: list[tuple[StreamScript, str | None]], tally: Tally,
                    *, concurrency: int, progress_every: int) -> None:
    next_job = 0
    started, first = time.monotonic(), tally.streams

    async def worker(channel: grpc.aio.Channel) -> None:
        nonlocal next_job
        while next_job < len(jobs):
            script, engine_id = jobs[next_job]
            next_job += 1
            tally.add(await run_script(channel, script, engine_id=engine_id, timeout_s=60.0))
            if tally.streams % progress_every == 0:
                rate = (tally.streams - first) / (time.monotonic() - started)
                print(f"  … {tally.streams:,} streams, {tally.messages:,} messages ({rate:,.0f} streams/s)",
                      flush=True)

    await asyncio.gather(*(worker(channels[i % len(channels)]) for i in range(concurrency)))


async def _known_engines(channel: grpc.aio.Channel) -> list[operator_pb2.EngineInfo]:
    stub = operator_pb2_grpc.OperatorServiceStub(channel)
    return list((await stub.ListEngines(operator_pb2.ListEnginesRequest(), timeout=30)).engines)


async def soak(args: argparse.Namespace, controller: ServeProcess, metrics_port: int, redis_client) -> int:
    rows: list[tuple[str, str]] = []
    print("drawing the fuzz corpus (hypothesis) …", flush=True)
    pools = st.one_of(st.just(POOL), st.builds(common_pb2.Pool, model=pool_names(), accelerator=pool_names()))
    corpus = draw_corpus(pools=pools, seed=args.seed, scale=args.corpus_scale)
    good_ids = [f"good-{i}" for i in range(args.good_engines)]
    scripts = compose_scripts(corpus, count=args.scripts, seed=args.seed, targets=good_ids)
    rng = np.random.default_rng(args.seed)
    batches = [telemetry_payload(agent_pb2.TelemetryBatch(
        completions=agent_pb2.Completions(prompt_tokens=[300] * n, output_tokens=rng.geometric(1 / 256, n).tolist(),
                                          finish_time_s=[1.7e9] * n, aborted=[False] * n),
        steps=agent_pb2.Steps(prefill_tokens=[2048, 0], decode_tokens=[0, 64], decode_requests=[0, 64],
                              duration_s=[0.1, 0.05])).SerializeToString(), seq=1)
        for n in (8, 16, 32)]

    def churn_jobs(first: int, count: int) -> list[tuple[StreamScript, str | None]]:
        return [(_churn_script(i, made_up_pool=args.pool_every > 0 and i % args.pool_every == 0,
                               batch=batches[i % len(batches)]), None) for i in range(first, first + count)]

    channels = [grpc.aio.insecure_channel(controller.address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(max(1, args.concurrency // STREAMS_PER_CHANNEL))]
    operator_channel = grpc.aio.insecure_channel(controller.address)
    loop = asyncio.get_running_loop()
    good: list[LiveAgent] = []
    for engine_id in good_ids:
        hello = agent_pb2.Hello(engine_id=engine_id, pool=POOL, vllm_version="0.32.0", agent_version="soak-good",
                                limits=LIMITS, instance_id=engine_id, instance_started_at_s=TARGET_STARTED_AT_S)
        agent = await LiveAgent(channels[0], hello).open()
        await agent.decision(timeout_s=30)
        good.append(agent)
    stop = asyncio.Event()
    streamers = [asyncio.create_task(stream_telemetry(agent, i, stop)) for i, agent in enumerate(good)]

    async def evicted(timeout_s: float) -> tuple[int, float]:
        deadline = loop.time() + timeout_s
        while True:
            engines = await _known_engines(operator_channel)
            if len(engines) <= len(good) or loop.time() > deadline:
                return len(engines), loop.time()
            await asyncio.sleep(0.5)

    # Warm-up churn: every code path runs once before the baseline.
    warmup = Tally()
    print(f"warm-up: {args.warmup_engines:,} engines, {args.warmup_scripts:,} fuzz streams …", flush=True)
    warmup_scripts = compose_scripts(corpus, count=args.warmup_scripts, seed=args.seed + 1_000_003, targets=good_ids)
    warmup_jobs = churn_jobs(10_000_000, args.warmup_engines) + [
        (s, s.bound_engine_id(10_000_000 + i)) for i, s in enumerate(warmup_scripts)]
    await _run_jobs(channels, warmup_jobs, warmup, concurrency=args.concurrency,
                    progress_every=10**9)
    await evicted(args.engine_ttl_s + 30)
    quiet_s = SMOKE_QUIET_S if args.smoke else TRIM_QUIET_S + 1.0
    await asyncio.sleep(quiet_s)  # the controller collects and trims once evictions stop
    rss_baseline = rss_mib(controller.pid)
    keys_before = redis_client.dbsize()
    before = _metrics(metrics_port)

    # The soak: churn and fuzz interleaved.
    jobs = churn_jobs(0, args.engines) + [(s, s.bound_engine_id(i)) for i, s in enumerate(scripts)]
    order = np.random.default_rng(args.seed).permutation(len(jobs))
    jobs = [jobs[i] for i in order]
    tally = Tally()
    rss_peak = rss_baseline
    stop_sampling = asyncio.Event()

    async def sample_rss() -> None:
        nonlocal rss_peak
        while not stop_sampling.is_set():
            rss_peak = max(rss_peak, rss_mib(controller.pid))
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample_rss())
    print(f"soak: {args.engines:,} churning engines + {len(scripts):,} fuzz streams in {args.rounds} round(s), "
          f"concurrency {args.concurrency} …", flush=True)
    started_s = loop.time()
    cpu_before = cpu_s(controller.pid), time.process_time()
    rss_after: list[float] = []
    evicted_s = 0.0
    num_known = 0
    sending_s = 0.0
    for chunk in np.array_split(np.arange(len(jobs)), args.rounds):
        round_s = loop.time()
        await _run_jobs(channels, [jobs[i] for i in chunk], tally, concurrency=args.concurrency,
                        progress_every=10_000)
        sent_s = loop.time()
        sending_s += sent_s - round_s
        num_known, evicted_at_s = await evicted(args.engine_ttl_s + 60)
        evicted_s = max(evicted_s, evicted_at_s - sent_s)
        await asyncio.sleep(quiet_s)  # as for the baseline
        rss_after.append(rss_mib(controller.pid))
        print(f"  round done: {tally.streams:,} streams; engines known {num_known}; RSS {rss_after[-1]:.0f} MiB",
              flush=True)
    ended_s = loop.time()
    cpu_used = cpu_s(controller.pid) - cpu_before[0], time.process_time() - cpu_before[1]
    stop.set()
    stop_sampling.set()
    await asyncio.gather(*streamers, sampler)
    after = _metrics(metrics_port)
    engines = await _known_engines(operator_channel)
    stub = operator_pb2_grpc.OperatorServiceStub(operator_channel)
    views = [await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id=e.engine_id)) for e in engines]
    keys_at_end = redis_client.dbsize()
    # The churned engines' decision and epoch keys expire engine_retention_s after their last write.
    expiry_deadline_s = loop.time() + args.engine_retention_s + args.expiry_slack_s
    while redis_client.dbsize() > keys_before and loop.time() < expiry_deadline_s:
        await asyncio.sleep(1.0)
    keys_after = redis_client.dbsize()
    for agent in good:
        await agent.close()
    for channel in (*channels, operator_channel):
        await channel.close()

    # ---- figures ----
    counted = {c: _total(after, "cp_rejections_total", cause=c) - _total(before, "cp_rejections_total", cause=c)
               for c in CAUSES}
    good_non_finite = [f"{a.engine_id}: {p}" for a in good for _, d in a.received for p in non_finite_doubles(d)]
    view_non_finite = [f"view {v.engine_id}: {p}" for v in views for p in non_finite_doubles(v)]
    non_finite = tally.non_finite + good_non_finite + view_non_finite
    restarts = _total(after, "cp_background_loop_restarts_total")
    forgotten = {reason: _total(after, "cp_engines_evicted_total", reason=reason)
                 - _total(before, "cp_engines_evicted_total", reason=reason) for reason in ("ttl", "capacity")}
    exited = controller.process.poll()
    gaps = [a.max_gap_s(since=started_s, until=ended_s) for a in good]
    wall_s = sending_s
    rows += [
        ("streams sent (soak)", f"{tally.streams:,} ({args.engines:,} churning engines, {len(scripts):,} fuzz)"),
        ("messages sent (soak)", f"{tally.messages:,} in {wall_s:.0f} s ({tally.messages / wall_s:,.0f}/s; "
                                 f"warm-up {warmup.messages:,} more)"),
        ("CPU during the soak", f"controller {cpu_used[0]:.0f} s, this generator {cpu_used[1]:.0f} s, in "
                                f"{ended_s - started_s:.0f} s (eviction waits included)"),
        ("stream statuses", ", ".join(f"{k} {v:,}" for k, v in tally.codes.most_common())),
        ("statuses lost by grpc's client", f"{tally.lost_status:,} (server ended the stream mid-write)"),
        ("controller exited", "no" if exited is None else f"YES (exit code {exited})"),
        ("background loop restarts", f"{restarts:.0f}"),
        ("streams hung or ended neither OK nor rejected", f"{len(tally.broken)}"),
        ("streams with another status than their fault's", f"{len(tally.wrong_status)}"),
        ("decisions checked for non-finite numbers", f"{tally.decisions + sum(len(a.received) for a in good):,} "
                                                     f"+ {len(views)} views"),
        ("non-finite numbers", f"{len(non_finite)}"),
    ]
    for cause in CAUSES:
        rows.append((f"rejections {cause}", f"counted {counted[cause]:,.0f} / sent {tally.expected[cause]:,}"))
    rows += [
        ("rejections, mutated streams", f"{sum(counted.values()) - sum(tally.expected.values()):,.0f} counted beyond "
                                        f"the known faults / {tally.mutated_rejected:,} mutated streams rejected"),
        ("good engines' longest decision gap", f"{max(gaps):.2f} s (keep-alive ttl_s/3 = {args.ttl_s / 3:.2f} s)"),
        ("engines known after eviction", f"{num_known} (good engines: {len(good)}; eviction took at most "
                                         f"{evicted_s:.0f} s after a round's last stream)"),
        ("engines forgotten (soak)", ", ".join(f"{reason} {n:,.0f}" for reason, n in forgotten.items())
                                     + " (capacity: past max_disconnected_engines, before engine_ttl_s)"),
        ("pools in /metrics (cp_pool_engines)", f"{len(_label_values(before, 'cp_pool_engines', 'pool')):,} before → "
                                                f"{len(_label_values(after, 'cp_pool_engines', 'pool')):,} after"),
        ("Redis keys", f"{keys_before:,} before → {keys_at_end:,} at the end → {keys_after:,} "
                       f"{args.engine_retention_s:.0f} s later (engine_retention_s)"),
        ("controller RSS", f"baseline {rss_baseline:.0f} MiB, peak {rss_peak:.0f} MiB, after each round's eviction "
                           + ", ".join(f"{r:.0f} MiB ({100 * (r / rss_baseline - 1):+.1f}%)" for r in rss_after)
                           + " (goal ≤ +10%)"),
    ]
    if len(rss_after) >= 2:
        # What the first round leaves is the allocators' high water at the churn's peak; what each later
        # round adds is what stays per engine id.
        ids_per_round = (args.engines + len(scripts)) / len(rss_after)
        per_10k = 10_000 * (rss_after[-1] - rss_after[0]) / (ids_per_round * (len(rss_after) - 1))
        rows.append(("RSS added per round after the first", f"{per_10k:+.2f} MiB per 10,000 streams (first round: "
                                                          f"{rss_after[0] - rss_baseline:+.0f} MiB)"))
    width = max(len(name) for name, _ in rows)
    print()
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    for title, items in (("hung or broken", tally.broken), ("wrong status", tally.wrong_status),
                         ("non-finite", non_finite)):
        if items:
            print(f"\nfirst {title}: " + "; ".join(items[:5]))
    crashed = exited is not None or restarts > 0 or bool(tally.broken)
    return 1 if crashed or non_finite else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=100_000, help="distinct engine ids that come and go")
    parser.add_argument("--scripts", type=int, default=5_000, help="fuzz streams (≈4 messages each)")
    parser.add_argument("--warmup-engines", type=int, default=2_000, help="churn before the RSS baseline")
    parser.add_argument("--warmup-scripts", type=int, default=500, help="fuzz streams before the RSS baseline")
    parser.add_argument("--good-engines", type=int, default=4, help="well-behaved engines streaming throughout")
    parser.add_argument("--pool-every", type=int, default=1000,
                        help="one churning engine in this many claims a made-up pool of its own (0: none)")
    parser.add_argument("--engine-ttl-s", type=float, default=5.0, help="controller --engine-ttl-s")
    parser.add_argument("--max-disconnected-engines", type=int, default=None,
                        help="controller --max-disconnected-engines (default: the controller's; 0: no limit)")
    parser.add_argument("--engine-retention-s", type=float, default=10.0,
                        help="controller --engine-retention-s (Redis keys of gone engines expire)")
    parser.add_argument("--expiry-slack-s", type=float, default=10.0,
                        help="wait at most this long past --engine-retention-s for the gone engines' keys to expire")
    parser.add_argument("--ttl-s", type=float, default=3.0, help="controller --ttl-s (keep-alive every ttl_s/3)")
    parser.add_argument("--concurrency", type=int, default=64, help="streams open at once")
    parser.add_argument("--rounds", type=int, default=2,
                        help="split the soak in rounds, waiting for eviction and reading RSS after each: RSS that "
                             "keeps growing round after round is a leak, RSS that stays is the allocator's high water")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--corpus-scale", type=float, default=1.0,
                        help="hypothesis examples drawn for the corpus, times this (a few hundred at 1)")
    parser.add_argument("--smoke", action="store_true",
                        help="every step at tiny sizes (" + ", ".join(f"{k} {v:g}" for k, v in SMOKE.items())
                             + f") and {SMOKE_QUIET_S:g} s trim waits: seconds")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    with tempfile.TemporaryDirectory(prefix="fuzz-soak-") as tmp:
        url, server = start_redis_on_free_port(Path(tmp) / "redis")
        metrics_port = free_port()
        controller = ServeProcess.start(
            Path(tmp) / "data", log_path=Path(os.environ.get("CP_SOAK_LOG", str(Path(tmp) / "controller.log"))),
            args=("--redis-url", url, "--engine-ttl-s", str(args.engine_ttl_s), "--ttl-s", str(args.ttl_s),
                  "--engine-retention-s", str(args.engine_retention_s),
                  "--metrics-port", str(metrics_port), "--controller-id", "soak")
            + (() if args.max_disconnected_engines is None
               else ("--max-disconnected-engines", str(args.max_disconnected_engines))))
        client = redis.Redis.from_url(url)
        started = time.monotonic()
        try:
            code = asyncio.run(soak(args, controller, metrics_port, client))
        finally:
            client.close()
            controller.stop()
            server.stop()
        print(f"\ntotal wall time {time.monotonic() - started:.0f} s")
        return code


if __name__ == "__main__":
    sys.exit(main())
