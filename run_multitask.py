#!/usr/bin/env python
"""Multitask fine-tuning (SST-5, QQP, STS): python run_multitask.py [--help]."""
import sys

from bertcf.multitask import main
from bertcf.cli import run_main

if __name__ == "__main__":
    sys.exit(run_main(main))
