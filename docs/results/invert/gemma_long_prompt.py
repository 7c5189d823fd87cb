"""Real Gemma-3-270M (local layers see 512 positions): two 600-token prompts of held-out stdlib code
captured at layer 2, inverted alone and in lock-step (fast calibration). Before defb769 SipIt raised
"cannot select from a sliding-window cache past its window". python gemma_long_prompt.py"""
import time, torch, sys
from sipit.models import load_model, LayerTap
from sipit.invert import InvertConfig, SipIt
from sipit.invert.learned.config import calibration_config
from sipit.invert.learned.data import stdlib_files
torch.set_num_threads(2)
lm = load_model("gemma3-270m", max_layer=2)
print("window", lm.model.config.get_text_config().sliding_window, "V", lm.vocab_size, flush=True)
files = stdlib_files(calibration_half=False)
text = "".join(f.read_text(errors="replace") for f in files[40:46])
ids = torch.tensor(lm.encode(text)[:1200]).view(2, 600)
tap = LayerTap(lm, 2)
states = tap.states(ids)
t = time.perf_counter()
eng = SipIt(lm, 2, InvertConfig(policy="learned", learned=calibration_config("fast")), eps=1e-4)
print("calibration", round(time.perf_counter() - t, 1), flush=True)
t = time.perf_counter(); r = eng.invert_prompt(states[0], ids[0].tolist()); print("alone", r.status, r.exact, round(time.perf_counter() - t, 1), "s", r.message[:100], flush=True)
t = time.perf_counter(); rs = eng.invert_prompts(list(states), [i.tolist() for i in ids]); print("lock-step", [(x.status, x.exact) for x in rs], round(time.perf_counter() - t, 1), "s", flush=True)
