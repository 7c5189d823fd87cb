"""`python -m sipit.lab enumerate ...`: the lab commands without the main CLI (= `sipit lab ...`).
Threads: $SIPIT_THREADS (default 2)."""
import argparse
import os
import sys

import torch

from sipit.io import SipitError

from .cli import add_lab_parser

lab = add_lab_parser(argparse.ArgumentParser(prog="python -m sipit").add_subparsers())
lab.prog = "python -m sipit.lab"
args = lab.parse_args()
torch.set_num_threads(int(os.environ.get("SIPIT_THREADS", "2")))
try:
    args.fn(args)
except SipitError as e:
    sys.exit(f"sipit: error: {e}")
