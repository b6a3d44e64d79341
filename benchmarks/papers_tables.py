"""The papers' published figures that `benchmarks/twin_vs_papers.py` sets the twin against: [EB] Tables
2, 4 and 6, [EB] §4.2 and [EB] §4.3.3, and [PPAS] Tables 1, 3, 9 and 10 ([PPAS] Table 2, [EB] Table 3 and the
[EB] App. A figures are written beside the rows that use them)."""

from __future__ import annotations

# ------------------------------------------------------------------------------------------------ EB paper

TABLE2_RPS = {  # (profile, workload) → (v1 req/s, EB(k̂*) req/s), [EB] Table 2 (RTX PRO 6000, Qwen3-8B)
    ("rtx-pro-6000-qwen3-8b", "sharegpt"): (17.07, 19.68), ("rtx-pro-6000-qwen3-8b", "wildchat"): (12.75, 14.19),
    ("rtx-pro-6000-qwen3-8b", "longbench"): (8.35, 8.66), ("rtx-pro-6000-qwen3-8b", "numinamath"): (0.73, 0.74),
}
TABLE2_CHANGE = {  # EB(k̂*) over v1 in %, [EB] Table 2 and [EB] §4.3.2
    ("rtx-pro-6000-qwen3-8b", "sharegpt"): 15.3, ("rtx-pro-6000-qwen3-8b", "wildchat"): 11.3,
    ("rtx-pro-6000-qwen3-8b", "longbench"): 3.7, ("rtx-pro-6000-qwen3-8b", "numinamath"): 1.4,
    ("rtx-pro-6000-qwen3-30b-a3b", "sharegpt"): -3.1, ("rtx-pro-6000-qwen3-30b-a3b", "wildchat"): 11.6,
    ("rtx-pro-6000-qwen3-30b-a3b", "longbench"): 4.8, ("rtx-pro-6000-qwen3-30b-a3b", "numinamath"): -7.7,
}
TABLE2_AVERAGE = {"rtx-pro-6000-qwen3-8b": 7.9, "rtx-pro-6000-qwen3-30b-a3b": 1.4, "h200-qwen3-8b": 1.5,
                  "h200-qwen3-30b-a3b": -2.9}
TPOT_MS = {  # (profile, workload) → (v1 ms, EB ms), [EB] §4.3.3
    ("rtx-pro-6000-qwen3-8b", "sharegpt"): (268.97, 93.68), ("rtx-pro-6000-qwen3-8b", "wildchat"): (173.33, 113.22),
    ("rtx-pro-6000-qwen3-8b", "numinamath"): (81.75, 65.22), ("h200-qwen3-8b", "wildchat"): (122.97, 79.04),
    ("h200-qwen3-8b", "numinamath"): (31.03, 26.87),
}
TTFT_S = {("rtx-pro-6000-qwen3-8b", "longbench"): (175.56, 169.64)}  # (v1 s, EB s), [EB] §4.3.3


ORACLE_PAPER = {"decode-heavy": 8.0, "balanced": 3.6, "prefill-heavy": 0.6}


TABLE4 = {"l40s-qwen3-8b": (10.36, 14.70), "b300-qwen3-8b": (50.47, 52.34)}  # WildChat req/s (v1, EB)


TABLE6_RANGE = (1.4, 4.0)  # EB(k̂*) over v1, tok/s, 128K input / 64 output: the range over the paper's seven models


# ------------------------------------------------------------------------------------------------ P-PAS paper

PPAS_TABLE1 = {"avg latency": (8.5, 11.3), "p95 latency": (3.0, 10.0), "avg TTFT": (11.8, -18.5),
               "avg TPOT": (3.4, 36.3), "makespan": (1.0, -3.9)}
PPAS_TABLE9 = {  # burst rate → scheduler → (E2E, P95, TTFT, TPOT, makespan), [PPAS] Table 9
    0.4: {"mbt:2048": (3.348, 5.168, 2.079, 0.0409, 39.226), "mbt:16384": (2.761, 4.502, 1.695, 0.0344, 39.000),
          "ppas:16384:2048": (2.735, 4.672, 1.678, 0.0341, 38.970)},
    0.6: {"mbt:2048": (4.399, 7.057, 2.551, 0.0596, 39.661), "mbt:16384": (3.678, 6.854, 2.039, 0.0529, 38.982),
          "ppas:16384:2048": (3.764, 6.659, 2.020, 0.0563, 39.022)},
    0.8: {"mbt:2048": (5.214, 8.438, 3.033, 0.0703, 43.889), "mbt:16384": (4.900, 9.909, 2.303, 0.0838, 43.180),
          "ppas:16384:2048": (4.705, 8.387, 2.579, 0.0686, 43.473)},
    1.0: {"mbt:2048": (7.451, 12.155, 4.715, 0.0882, 46.926), "mbt:16384": (8.420, 14.668, 3.466, 0.1598, 45.110),
          "ppas:16384:2048": (7.037, 11.796, 4.288, 0.0887, 46.326)},
    1.2: {"mbt:2048": (10.687, 17.237, 7.382, 0.1066, 49.907), "mbt:16384": (13.264, 19.493, 5.226, 0.2593, 45.670),
          "ppas:16384:2048": (10.251, 16.869, 6.856, 0.1095, 48.755)},
    1.4: {"mbt:2048": (12.560, 19.881, 9.180, 0.1091, 53.204), "mbt:16384": (16.649, 23.004, 6.066, 0.3414, 47.217),
          "ppas:16384:2048": (12.895, 20.537, 9.416, 0.1122, 53.688)},
}
PPAS_TABLE10 = {"mbt:2048": (14.763, 22.821, 56.399), "ppas:16384:2048": (14.324, 22.373, 55.562)}  # λ = 1.6
PPAS_TABLE3 = {  # (prompt, output) → (vs 2k avg, vs 2k p95, vs 16k avg, vs 16k p95), bursts 0.8 and 1.2
    (20_000, 32): (13.2, 8.4, 11.6, 11.5), (25_000, 32): (7.0, 1.4, 13.9, 14.4), (30_000, 32): (6.3, -2.7, 15.2, 7.1),
    (25_000, 16): (5.9, 1.3, 23.2, 20.1), (25_000, 64): (8.4, 5.4, 1.8, 3.4),
}


PAPER_SEEDS = 5  # the P-PAS paper averages five seeds (five realized traces) per figure
