"""``python -m bertcf.cross``: the command is ``bertcf.commands.cross``."""
import sys

from .commands.cross import main

if __name__ == "__main__":
    sys.exit(main())
