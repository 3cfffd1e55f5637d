import sys

from shepherd.main import main

sys.exit(main())
