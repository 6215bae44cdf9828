import sys

from proofs.check import main

sys.exit(main())
