"""A record's verdict words, alone: was the machine quiet while the job ran?

Their own module so that ``dispatch list``, which prints them beside a
finished job, does not load ``records`` and with it ``os`` (about a
millisecond of every listing; see hpc_batch/client/posixcalls.py).
"""

VERDICTS = ("clean", "noisy", "unknown")
