"""`python -m dispatchtx COMMAND`: the jobs of dispatchtx (`dispatchtx.jobs.cli`)."""

from __future__ import annotations

import sys

from dispatchtx.jobs.cli import main

if __name__ == "__main__":
    sys.exit(main())
