"""``python -m bertcf.gpl``: the command is ``bertcf.commands.gpl`` (GPL, domain adaptation)."""
import sys

from .commands.gpl import main

if __name__ == "__main__":
    sys.exit(main())
