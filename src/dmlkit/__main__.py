"""``python -m dmlkit`` (and ``torchrun -m dmlkit``) runs the command line."""

import sys

from dmlkit.cli.main import main

sys.exit(main())
