"""What hpc-batchd runs for each job: ``python -E -s -S .../shepherd/hpc-batch-shepherd.py``.

Run as a file, not through the console-script wrapper, so the interpreter
skips site-packages and the wrapper's imports: a shepherd starts in a few
milliseconds and stays small. ``ps`` shows this file's name, the job id and
the user. The ``hpc-batch-shepherd`` console script runs the same ``main``.
With ``--fork-server`` it is instead the resident server hpc-batchd forks
shepherds from (see forkserver.py).
"""

import sys

if sys.argv[1:2] == ["--fork-server"]:   # the resident one hpc-batchd forks shepherds from
    from forkserver import serve
    sys.exit(serve())

from main import main

sys.exit(main())
