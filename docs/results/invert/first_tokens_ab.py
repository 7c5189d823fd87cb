"""A/B of a fast calibration's kept first-token states (Calibration.first_rows: an observation at position 0 within a
kept state's radius guesses its token) against the linear position-0 model alone (first_ids None), alternating in one
process (common.alternate: every inversion exact and ok). MODEL (smollm2) and CAL=fast as for common.alternate.

    CAL=fast MODEL=gemma3-270m python first_tokens_ab.py LAYER SEED PER_SOURCE REPEATS B     e.g. 9 881 5 1 1"""
import sys

import common

layer, seed, per_source, repeats, B = (int(x) for x in sys.argv[1:6])
kept = {}
count = lambda cal: f"layer {layer}: {len(cal.first_ids)} first tokens kept"
common.alternate(layer, seed, 20, {"linear model alone": common.calibration_field("first_ids", False, kept, count),
                                   "first tokens kept": common.calibration_field("first_ids", True, kept, count)},
                 per_source, repeats, B)
