"""Helpers shared by tests/ and benchmarks/ — not product code, never shipped (the wheel packages controlplane
and agents only).

A benchmark imports what it shares with the tests from here, never from `tests.*`: tiny-model writers
(`tiny_model`), survival cohorts (`cohorts`), the CUSUM recursion reference (`cusum_reference`), untrusted
agent input (`fuzz_messages`), a `controlplane serve` subprocess (`serve_process`), well-formed agent and
decision messages (`messages`), loopback ports (`net`: `free_port`, `free_ports`, `refused_port`) and a process's
resident memory and CPU time from /proc (`proc`: `rss_mib`, `cpu_s`).
"""
