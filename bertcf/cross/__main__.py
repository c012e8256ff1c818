"""``python -m bertcf.cross``: :func:`bertcf.cross.command.main`."""
import sys

from .command import main

sys.exit(main())
