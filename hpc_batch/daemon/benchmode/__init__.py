"""Benchmark mode's machine-side work: quiet cores, IRQ steering, cpufreq, cpuset partitions,
the housekeeping CPUs and the ledger of what was changed, with the kernel files they write."""
