"""``python -m bertcf.gpl``: :func:`bertcf.gpl.command.main`."""
import sys

from .command import main

sys.exit(main())
