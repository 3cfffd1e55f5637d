"""hpc-batch: a single-node batch queue with cgroup v2 and NUMA isolation."""

__version__ = "0.1.0"
