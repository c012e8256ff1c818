"""``python -m bertcf.data COMMAND ...``: the data tools' command line (``bertcf.commands.data``)."""
import sys

from ..commands.data import main

sys.exit(main())
