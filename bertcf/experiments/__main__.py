import sys

from .suite import cli

sys.exit(cli())
