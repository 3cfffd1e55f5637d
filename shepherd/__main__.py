"""``python -m shepherd``: the shepherd, as ``hpc-batch-shepherd`` runs it."""

import sys

from shepherd.main import main

sys.exit(main())
