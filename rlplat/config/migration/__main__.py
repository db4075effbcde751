import sys

from rlplat.config.migration import main

sys.exit(main())
