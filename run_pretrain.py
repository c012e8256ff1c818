#!/usr/bin/env python
"""Self-supervised pretraining: python run_pretrain.py --stage mirror|joint|flow [--help]."""
import sys

from bertcf.commands.pretrain import main

if __name__ == "__main__":
    sys.exit(main())
