"""``python -m bertcf.experiments``: the command is ``bertcf.commands.experiments``."""
import sys

from ..commands.experiments import main

sys.exit(main())
