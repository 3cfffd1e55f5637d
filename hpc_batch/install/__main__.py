"""``python -m hpc_batch.install``: the installer, as install.sh and hpc-batch-install run it."""

import sys

from hpc_batch.install import main

sys.exit(main())
