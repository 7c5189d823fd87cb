"""Certificates on recurrent models: what crops of the recovered prompt cost. `python recurrent_certify.py T LAYOUT ...`
(LAYOUT: a tests/conftest.py LAYOUTS entry, or a model type built with its defaults, e.g. llama) -> one line per
layout and certify setting: statuses, exact, seconds, and the prefills (passes from nothing) with their tokens.

Two prompts of T random ids, inverted at layer 3 of a 3-block random model (d = 32, V = 96) with certify="none" and
"top:8"; calibrations cached in SIPIT_CACHE after the first run."""
import sys
import time
import warnings
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from sipit.invert import InvertConfig, invert
from sipit.models import LayerTap
from sipit.models.lm import LM

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
import conftest  # noqa: E402

warnings.filterwarnings("ignore")
torch.set_num_threads(2)


def run(T: int, layout: str) -> None:
    options = dict(conftest.LAYOUTS.get(layout, {}))
    config = AutoConfig.for_model(options.pop("model_type", layout), vocab_size=96, hidden_size=32,
                                  intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, **options)
    torch.manual_seed(0)
    lm = LM(layout, AutoModelForCausalLM.from_config(config).eval(), None)
    tap = LayerTap(lm, 3)
    prefills = {"passes": 0, "tokens": 0}
    prefill = LayerTap.prefill

    def counted(self, ids, return_states=False):
        prefills["passes"] += 1
        prefills["tokens"] += len(ids)
        return prefill(self, ids, return_states)

    LayerTap.prefill = counted
    ids = torch.randint(0, lm.vocab_size, (2, T), generator=torch.Generator().manual_seed(0))
    full = tap.states(ids)
    for certify in ("none", "top:8"):
        prefills.update(passes=0, tokens=0)
        start = time.perf_counter()
        r = invert(lm, full, 3, InvertConfig(calibration_tokens=8192, certify=certify), progress=False,
                   true_ids=ids.tolist(), tap=tap)
        print(layout, T, certify, [p.status for p in r.prompts], "exact" if all(p.exact for p in r.prompts) else
              "NOT exact", f"{time.perf_counter() - start:.2f} s", f"prefills {prefills}", flush=True)
    LayerTap.prefill = prefill


if __name__ == "__main__":
    for name in sys.argv[2:]:
        run(int(sys.argv[1]), name)
