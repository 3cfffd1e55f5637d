"""The pieces of ``bench/run``: measuring hpc-batch against its performance targets.

Pure modules (``stats``, ``report``) hold the arithmetic and the markdown;
the rest start scratch daemons, run clients and read /proc. Each figure
module measures one group of rows of the table in docs/benchmarks.md.
"""
