import sys

from flock.ctl._cli import main

sys.exit(main())
