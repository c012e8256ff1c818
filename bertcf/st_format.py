"""``python -m bertcf.st_format upgrade DIR``, as earlier versions named it: the command is
``bertcf.commands.st_format``."""
import sys

from .commands.st_format import main

if __name__ == "__main__":
    sys.exit(main())
