import sys

from leaseproto.cli import main

sys.exit(main())
