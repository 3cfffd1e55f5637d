"""The job's reproducibility record: what it ran on, and whether the machine stayed quiet.

The shepherd builds one per job, in three steps (before the fork, once the
job runs, at its end), and writes it to the job's ``record.json``
(docs/record.md). The package's parts, each owning one thing:

- ``recorder``: :class:`~recorder.Recorder`, the three steps and the file;
  ``warm_up``, the fork server's run of it before its first fork;
- ``bounds``: the size bound (``MAX_BYTES``), the caps on what a user
  controls, and the record's digest;
- ``software``: the ``software`` section (argv, libc, rlimits, environment);
- ``sides``: the side tasks, children with a deadline (the hash, nvidia-smi);
- ``executable``: what ran, hashed as the user, once per version;
- ``collect``: the static sections (kernel, CPU, frequency, memory, cgroup);
- ``sentinels``: the start and end snapshots, and their deltas;
- ``gpuquery``: the ``gpu`` section, from nvidia-smi;
- ``verdict``: quiet or noisy, and why;
- ``figures`` and ``figurefile``: the job's own figures, and their file.

Standard library only. It imports the base, never the supervisor. This
module defines nothing: each name is imported from the module that owns it.
"""
