# A one-prompt file the shortlists missed (identify_check-smollm2-1109.jsonl: random ids' first token 'uty', layer 18
# with the final norm), identified with and without --exhaustive: bash exhaustive_check.sh
set -e
python - <<'PY'
import torch
from sipit.capture import capture
from sipit.corpora import sample
from sipit.models import load_model

lm = load_model("smollm2")
ids = sample("random:1", lm.tokenizer, 20, seed=1109, vocab_size=lm.vocab_size)[0].ids
torch.save(capture(lm, [ids], 18, True)[0][None], "/tmp/uty-18n.pt")  # a bare tensor, as nnsight saves it
PY
sipit identify /tmp/uty-18n.pt --model smollm2 || echo "exit code $?"
/usr/bin/time -f "%e s wall" sipit identify /tmp/uty-18n.pt --model smollm2 --exhaustive
