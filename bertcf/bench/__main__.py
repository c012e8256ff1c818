"""``python -m bertcf.bench``: :func:`bertcf.commands.bench.main`."""
import sys

from ..commands.bench import main

sys.exit(main())
