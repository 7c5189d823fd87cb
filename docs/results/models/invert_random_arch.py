"""random:tinystories-33m: learned policy, 3 prompts of 20 random ids per layer, states from one full forward."""
import json, sys, time, torch
from sipit.models import LayerTap, load_model
from sipit.invert import InvertConfig, invert
torch.set_num_threads(1)
spec = sys.argv[1]
rows = []
for layer in [int(x) for x in sys.argv[2].split(",")]:
    lm = load_model(spec, max_layer=layer)
    ids = torch.randint(0, lm.vocab_size, (3, 20), generator=torch.Generator().manual_seed(1))
    tap = LayerTap(lm, layer)
    h = tap.states(ids)
    t = time.perf_counter(); tap.states(ids[0]); fwd = time.perf_counter() - t
    t = time.perf_counter()
    r = invert(lm, h, layer, InvertConfig(policy="learned"), progress=False, true_ids=ids.tolist())
    s = time.perf_counter() - t
    row = dict(model=spec, layer=layer, exact=sum(p.exact for p in r.prompts), prompts=3,
               status=[p.status for p in r.prompts], calibration_s=round(r.calibration_seconds, 1),
               seconds_per_prompt=[round(p.seconds, 3) for p in r.prompts], forward_s=round(fwd, 4),
               candidates_per_position=round(sum(q.tried for p in r.prompts for q in p.positions) / 60, 2), eps=r.eps)
    print(json.dumps(row), flush=True)
