import sys

from fscache.cli import main

sys.exit(main())
