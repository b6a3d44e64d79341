"""PNG plots of twin runs (matplotlib, Agg backend): throughput vs latency, and the decision timeline.

Writes only the paths it is given. matplotlib is imported inside the functions, so importing this module
is cheap and the rest of the twin never needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from controlplane.sim.runner import RunResult

_MODE_LEVEL = {"passthrough": 0, "mb": 1, "eb": 2}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_throughput_latency(results: Sequence[RunResult], path: Path, *, title: str = "") -> None:
    """Per scheduler: throughput (tokens/s) against mean and p95 E2E latency, one point per run, and
    throughput and mean TTFT/TPOT bars averaged over runs of the same scenario and scheduler."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    schedulers = list(dict.fromkeys(r.scheduler for r in results))
    scenarios = list(dict.fromkeys(r.scenario for r in results))
    markers = "osD^v<>phx*"
    for index, scheduler in enumerate(schedulers):
        runs = [r for r in results if r.scheduler == scheduler]
        x = [r.metrics.throughput_tokens_per_s for r in runs]
        left.scatter(x, [r.metrics.e2e_mean_s for r in runs], marker=markers[index % len(markers)],
                     label=f"{scheduler} (mean)")
        left.scatter(x, [r.metrics.e2e_p95_s for r in runs], marker=markers[index % len(markers)],
                     facecolors="none", edgecolors=f"C{index}", label=f"{scheduler} (p95)")
    left.set_xlabel("throughput (prompt + output tokens/s)")
    left.set_ylabel("E2E latency (s)")
    left.set_yscale("log")
    left.legend(fontsize=7)
    left.grid(alpha=0.3)
    width = 0.8 / max(1, len(schedulers))
    positions = np.arange(len(scenarios))
    for index, scheduler in enumerate(schedulers):
        values = []
        for scenario in scenarios:
            runs = [r.metrics.throughput_tokens_per_s for r in results if r.scheduler == scheduler
                    and r.scenario == scenario]
            values.append(float(np.mean(runs)) if runs else 0.0)
        right.bar(positions + index * width, values, width, label=scheduler)
    right.set_xticks(positions + width * (len(schedulers) - 1) / 2, [s[:28] for s in scenarios], rotation=20,
                     fontsize=7, ha="right")
    right.set_ylabel("throughput (tokens/s)")
    right.legend(fontsize=7)
    right.grid(axis="y", alpha=0.3)
    fig.suptitle(title or "twin: throughput and latency")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_timeline(result: RunResult, path: Path, *, max_points: int = 4000) -> None:
    """Mode, k and N (decisions in force) and the per-step token budget, running and waiting over time."""
    plt = _pyplot()
    fig, axes = plt.subplots(4, 1, figsize=(11, 9), sharex=True)
    steps = result.steps
    end = float(steps["end_s"][-1]) if steps and steps["end_s"].size else 1.0
    times = [d.at_s for d in result.timeline] + [end]
    if result.timeline:
        modes = [_MODE_LEVEL.get(d.mode, 0) for d in result.timeline]
        axes[0].step(times, [*modes, modes[-1]], where="post")
        ks = [d.k for d in result.timeline]
        ns = [d.n for d in result.timeline]
        axes[1].step(times, [*ks, ks[-1]], where="post", label="k")
        axes[1].step(times, [*ns, ns[-1]], where="post", label="N")
        axes[1].legend(fontsize=8)
    else:
        axes[0].step([0.0, end], [0, 0], where="post")
    axes[0].set_yticks([0, 1, 2], ["stock", "MB", "EB"])
    axes[0].set_ylabel("mode")
    axes[1].set_ylabel("requests")
    axes[1].set_yscale("symlog")
    axes[1].set_ylim(bottom=0)
    if steps and steps["end_s"].size:
        stride = max(1, steps["end_s"].size // max_points)
        t = steps["end_s"][::stride]
        axes[2].plot(t, steps["budget_tokens"][::stride], lw=0.8, label="token budget")
        axes[2].plot(t, steps["prefill_tokens"][::stride] + steps["num_decodes"][::stride], lw=0.5, alpha=0.6,
                     label="scheduled tokens")
        axes[2].set_yscale("symlog")
        axes[2].legend(fontsize=8)
        axes[3].plot(t, steps["num_running"][::stride], lw=0.8, label="running")
        axes[3].plot(t, steps["num_waiting"][::stride], lw=0.8, label="waiting")
        axes[3].plot(t, steps["num_seqs_cap"][::stride], lw=0.8, ls="--", label="cap N in force")
        axes[3].legend(fontsize=8)
    axes[2].set_ylabel("tokens / step")
    axes[3].set_ylabel("requests")
    axes[3].set_xlabel("simulated time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"{result.scheduler} on {result.scenario} ({result.profile})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
