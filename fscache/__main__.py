import sys

from fscache.command import main

sys.exit(main())
