#!/usr/bin/env python
"""Self-supervised pretraining: python run_pretrain.py --stage mirror|joint|flow [--help]."""
import sys

from bertcf.pretrain import main
from bertcf.cli import run_main

if __name__ == "__main__":
    sys.exit(run_main(main))
