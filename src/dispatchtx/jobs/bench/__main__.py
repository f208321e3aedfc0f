"""`python -m dispatchtx.jobs.bench`: the same as `python -m dispatchtx bench`."""

import sys

from dispatchtx.jobs.bench.cli import main

sys.exit(main())
