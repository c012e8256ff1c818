"""``python -m bertcf.export``: the command is ``bertcf.commands.export`` (this module keeps its name)."""
import sys

from .commands.export import main

if __name__ == "__main__":
    sys.exit(main())
