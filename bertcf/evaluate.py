"""``python -m bertcf.evaluate``: the command is ``bertcf.commands.evaluate`` (this module keeps its name)."""
import sys

from .commands.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
