"""``python -m bertcf.data download ...``: the downloader's command line."""
import sys

from .download import main

sys.exit(main())
