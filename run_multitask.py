#!/usr/bin/env python
"""Multitask fine-tuning (SST-5, QQP, STS): python run_multitask.py [--help]."""
import sys

from bertcf.multitask import command

if __name__ == "__main__":
    sys.exit(command())
