"""A/B of a fast calibration's position-0 screen (Calibration.p0_basis: position 0 scored in the principal subspace
of its predictions, the screen_top best exactly) against reading the whole embedding (p0_basis None), alternating in
one process (common.alternate: every inversion exact and ok). MODEL (smollm2) and CAL=fast as for common.alternate;
prints the rank the fit kept first.

    CAL=fast MODEL=gemma3-270m python position0_screen_ab.py LAYER SEED PER_SOURCE REPEATS B     e.g. 1 859 5 2 1"""
import sys

import common

layer, seed, per_source, repeats, B = (int(x) for x in sys.argv[1:6])
kept = {}
rank = lambda cal: (f"layer {layer}: position-0 screen of rank {None if cal.p0_basis is None else cal.p0_basis.shape[1]}"
                    f" of {cal.white0.shape[0]}")
common.alternate(layer, seed, 20, {"embedding read whole": common.calibration_field("p0_basis", False, kept, rank),
                                   "screened": common.calibration_field("p0_basis", True, kept, rank)},
                 per_source, repeats, B)
