"""``python -m bertcf.st_format upgrade DIR``, as earlier versions named it: the command is
``bertcf.models.st_format``."""
import sys

from .cli import run_main
from .models.st_format import main

if __name__ == "__main__":
    sys.exit(run_main(main))
