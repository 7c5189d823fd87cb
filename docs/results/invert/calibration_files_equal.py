"""Calibration files of the same names in two cache folders (e.g. a fresh `sipit calibrate` under SIPIT_CACHE=DIR
against ~/.cache/sipit, fitted by an earlier commit with the same VERSION), compared tensor for tensor.

    python calibration_files_equal.py DIR_A/learned DIR_B/learned"""
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

a, b = Path(sys.argv[1]), Path(sys.argv[2])
names = sorted(p.name for p in a.glob("*.safetensors") if (b / p.name).exists())
equal = 0
for name in names:
    x, y = load_file(a / name), load_file(b / name)
    differ = sorted(set(x) ^ set(y)) + [k for k in x if k in y and not torch.equal(x[k], y[k])]
    equal += not differ
    print(f"{name}: {'identical' if not differ else 'differs in ' + ', '.join(differ)}")
print(f"{equal} of {len(names)} files in both folders identical")
