"""``python -m bertcf.data COMMAND ...``: the data tools' command line (``bertcf.data.commands``)."""
import sys

from .commands import main

sys.exit(main())
