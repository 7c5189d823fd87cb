"""SAELens' own SAEs against sipit's reader: each architecture built and saved by SAELens (save_model), loaded by
sipit.models.sae.load_sae, the same latents and reconstructions of random states.

    pip install --no-deps --target DIR sae-lens==6.54.12 "transformer-lens<3" better-abc simple-parsing docstring-parser
    python saelens_check.py DIR        (DIR: SAELens and the TransformerLens it imports, beside sipit's environment)"""
import sys
import tempfile

sys.path.insert(0, sys.argv[1])
import torch  # noqa: E402
import sae_lens
from sae_lens import SAE as LensSAE
from sae_lens.saes.standard_sae import StandardSAEConfig
from sae_lens.saes.topk_sae import TopKSAEConfig
from sae_lens.saes.jumprelu_sae import JumpReLUSAEConfig
from sae_lens.saes.gated_sae import GatedSAEConfig
from sipit.models.sae import load_sae
print("sae_lens", sae_lens.__version__)
torch.manual_seed(0)
d, n = 64, 256
x = torch.randn(5, 7, d)
for name, cfg in (("standard", StandardSAEConfig(d_in=d, d_sae=n)), ("topk", TopKSAEConfig(d_in=d, d_sae=n, k=12)),
                  ("topk-rescaled", TopKSAEConfig(d_in=d, d_sae=n, k=12, rescale_acts_by_decoder_norm=True)),
                  ("jumprelu", JumpReLUSAEConfig(d_in=d, d_sae=n)), ("gated", GatedSAEConfig(d_in=d, d_sae=n)),
                  ("standard-no-bdec", StandardSAEConfig(d_in=d, d_sae=n, apply_b_dec_to_input=False))):
    cfg.metadata.hook_name = "blocks.4.hook_resid_pre"
    cfg.metadata.model_from_pretrained_kwargs = {"center_writing_weights": name == "standard"}  # (GPT-2 releases')
    lens = LensSAE.from_dict(cfg.to_dict())
    with torch.no_grad():
        for p in lens.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        if name == "jumprelu":
            lens.threshold.copy_(torch.rand(n) * 0.5)
    path = f"{tempfile.mkdtemp()}/{name}"
    lens.save_model(path)
    ours = load_sae(path)
    with torch.no_grad():
        f_lens, f_ours = lens.encode(x), ours.encode(x)
        r_lens, r_ours = lens.decode(f_lens), ours.decode(f_ours)
    print(f"{name:17s} arch {ours.architecture:8s} layer {ours.layer} centred {ours.centred_on_layernorm!s:5s} L0 {float((f_lens > 0).float().sum(-1).mean()):5.1f}"
          f"  latents max |diff| {float((f_lens - f_ours).abs().max()):.1e}  reconstruction {float((r_lens - r_ours).abs().max()):.1e}")
