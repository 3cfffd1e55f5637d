"""``python -m hpc_batch.daemon``: the daemon, as the hpc-batchd entry point runs it."""

import sys

from hpc_batch.daemon.main import main

sys.exit(main())
