"""``python -m bertcf.encode``: the command is ``bertcf.commands.encode`` (this module keeps its name)."""
import sys

from .commands.encode import main

if __name__ == "__main__":
    sys.exit(main())
