"""``python -m bertcf.search``: :func:`bertcf.commands.search.main`."""
import sys

from ..commands.search import main

sys.exit(main())
