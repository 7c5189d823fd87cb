"""What a pass costs by its new tokens: tap.states of 20 tokens, then one row of n tokens on an empty prefix through
tap.extend_many (medians of 15), and three rows (20 + 10 + 10).

    python pass_cost.py LAYER        e.g. 15"""
import time, statistics, torch, sys
from sipit.models import LayerTap, load_model
torch.set_num_threads(2)
lm = load_model("smollm2")
layer = int(sys.argv[1])
tap = LayerTap(lm, layer)
g = torch.Generator().manual_seed(0)
empty = tap.prefill(torch.zeros(0, dtype=torch.long))
def t_of(rows_list):
    xs = []
    for _ in range(15):
        t = time.perf_counter(); tap.extend_many([(empty, r) for r in rows_list]); xs.append(time.perf_counter() - t)
    return statistics.median(xs) * 1e3
ids = torch.randint(0, 49152, (1, 20), generator=g)
f = []
for _ in range(15):
    t = time.perf_counter(); tap.states(ids[0]); f.append(time.perf_counter() - t)
print("tap.states 20 tokens", round(statistics.median(f)*1e3, 1), "ms")
for n in (10, 20, 30, 40, 60, 80, 120):
    print(n, "tokens one row", round(t_of([torch.randint(0, 49152, (1, n), generator=g)]), 1), "ms")
print("20 + 10 + 10 (3 rows)", round(t_of([torch.randint(0, 49152, (1, 20)), torch.randint(0, 49152, (1, 10)), torch.randint(0, 49152, (1, 10))]), 1))
