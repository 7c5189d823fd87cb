"""The bfloat16 screens computed as (table @ xᵀ)ᵀ, a [V, n] product read transposed (top_rows' first stage then
an element-wise max over contiguous slabs), against x @ tableᵀ as `against` does, patched in one process and
alternated, every inversion exact: median ratio to the forward (B = 1) or the batched forward (B > 1).

    python screen_layout_ab.py LAYER SEEDS B        e.g. 1 479,487 32"""
import sys, time, statistics, torch
from common import smollm2, SOURCES
from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.invert.learned import ranker as R
from sipit.models import LayerTap
layer, seeds, B = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
old_against, old_top = R.against, R.top_rows
def new_against(x, table):
    if x.dtype == torch.bfloat16:
        return (table @ x.T).T
    return old_against(x, table)
def new_top(x, k, largest=True):
    if x.dim() == 1 or x.is_contiguous() or not x.T.is_contiguous():
        return old_top(x, k, largest)
    n, V = x.shape; G = R.TOP_GROUP; m = V // G
    if k * 4 > m:
        return x.topk(k, dim=1, largest=largest).indices
    g = x.T[:m * G].view(G, m, n)
    best = (g.amax(0) if largest else g.amin(0)).T.topk(k, dim=1, largest=largest).indices
    cols = (best[:, :, None] + m * torch.arange(G)).flatten(1)
    if m * G < V:
        cols = torch.cat([cols, torch.arange(m * G, V).expand(n, -1)], 1)
    return cols.gather(1, x.gather(1, cols).topk(k, dim=1, largest=largest).indices)
def use(new):
    R.against, R.top_rows = (new_against, new_top) if new else (old_against, old_top)
lm = smollm2(); tap = LayerTap(lm, layer); eng = None
res = {False: [], True: []}; tried = {False: 0, True: 0}
for seed in seeds:
    data = prompts(lm, SOURCES, 8, 20, seed)
    ids = torch.tensor([p for _, p in data]); states = tap.states(ids)
    if eng is None:
        eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=tolerance_for(tap, {states.dtype}).eps)
        eng.invert_prompt(states[0])
    groups = [list(range(i, i + B)) for i in range(0, len(ids), B)]
    for rep in range(3):
        for g in groups:
            t = time.perf_counter(); tap.states(ids[g]); f = time.perf_counter() - t
            for new in (False, True) if rep % 2 == 0 else (True, False):
                use(new)
                t = time.perf_counter(); rs = eng.invert_prompts([states[i] for i in g], [ids[i].tolist() for i in g]); s = time.perf_counter() - t
                assert all(r.exact for r in rs)
                res[new].append(s / f); tried[new] += sum(q.tried for r in rs for q in r.positions)
for new in (False, True):
    print(f"layer {layer} B {B} seeds {seeds} {'transposed' if new else 'now'}: median ratio {statistics.median(res[new]):.2f} mean {statistics.mean(res[new]):.2f} (n {len(res[new])}), tried {tried[new]}")
