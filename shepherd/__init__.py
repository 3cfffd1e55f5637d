"""hpc-batch-shepherd: the small per-job supervisor (see shepherd/main.py), and the two packages under it.

Three parts, each importing only those before it:

- ``shepherd.base``: the standard-library base (job-directory records, the
  JSON codec, sizes, /proc and /sys reads, processes, ACLs, cgroups, user
  identity, notification text). ``hpc_batch`` imports it too; s6 keeps
  libs6 apart from s6-supervise the same way.
- ``shepherd.record``: the reproducibility record; it imports the base.
- ``shepherd`` itself (main, output, delivery, control, process, notify,
  forkserver): the supervisor; it imports the base and the record.

Both sub-packages live inside this directory because the daemon runs the
shepherd as a file (``python -E -s -S shepherd/hpc-batch-shepherd.py``):
only this directory is then on sys.path, so ``base`` and ``record`` are
found as top-level packages, and a package beside ``shepherd`` would need
site-packages on the path, which -S keeps off. tests/unit/test_layout.py
holds the three parts to their edges.
"""
