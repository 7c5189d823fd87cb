"""EleutherAI's sparsify against sipit's reader: SparseCoders (TopK and GroupMax) built and saved by sparsify
(save_to_disk) in a directory named after their hookpoint, loaded by sipit.models.sae.load_sae, the same latents and
reconstructions of random states.

    pip install --no-deps --target DIR eai-sparsify==1.3.3 simple-parsing docstring-parser natsort schedulefree
    python sparsify_check.py DIR"""
import sys
import tempfile

sys.path.insert(0, sys.argv[1])
import torch  # noqa: E402
import sparsify  # noqa: E402
from sparsify import SparseCoder, SparseCoderConfig  # noqa: E402

from sipit.models.sae import load_sae  # noqa: E402

print("sparsify", sparsify.__version__)
torch.manual_seed(0)
d = 64
x = torch.randn(35, d)
for activation, k in (("topk", 16), ("groupmax", 16)):
    coder = SparseCoder(d, SparseCoderConfig(activation=activation, k=k, expansion_factor=4))
    with torch.no_grad():
        for p in coder.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    path = f"{tempfile.mkdtemp()}/layers.5"
    coder.save_to_disk(path)
    ours = load_sae(path)
    with torch.no_grad():
        top_acts, top_indices, _ = coder.encode(x)
        theirs = torch.zeros(len(x), coder.num_latents).scatter_(1, top_indices, top_acts)
        f = ours.encode(x)
        recon = coder.decode(top_acts, top_indices)
    print(f"{activation:9s} k {k} latents {coder.num_latents} layer {ours.layer}  latents max |diff| "
          f"{float((theirs - f).abs().max()):.1e}  reconstruction {float((recon - ours.decode(f)).abs().max()):.1e}")
