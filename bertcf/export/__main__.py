"""``python -m bertcf.export onnx ...``: see bertcf/export/cli.py."""
import sys

from .cli import command

sys.exit(command())
