#!/usr/bin/env python
"""Multitask fine-tuning (SST-5, QQP, STS): python run_multitask.py [--help]."""
import sys

from bertcf.multitask.command import main

if __name__ == "__main__":
    sys.exit(main())
