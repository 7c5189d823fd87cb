"""Lock-step passes: many prompts' extends in one forward pass equal each extend alone."""
import pytest
import torch

from sipit.invert import InvertConfig, invert
from sipit.models import LayerTap, load_model
from sipit.models.surfaces import KVTap, ProjectedTap


def taps(lm):
    return [LayerTap(lm, 2), LayerTap(lm, 0), LayerTap(lm, lm.n_layers, final_norm=True), KVTap(lm, 3, "both"),
            ProjectedTap(lm, 2, torch.randn(8, lm.d_model, generator=torch.Generator().manual_seed(1)))]


@pytest.mark.parametrize("which", range(5))
@pytest.mark.parametrize("attention", [0.0, 0.3])  # (query, key) pairs free: flat passes; dear: padded only
def test_extend_many_equals_each_extend_alone(tiny_lm, which, attention):
    """Prefixes of different lengths (empty included), rows of 1 and of several tokens, several requests
    per pass: every state equals its own extend, and each grown prefix continues like a fresh forward."""
    tap = taps(tiny_lm)[which]
    tap._costs = (attention, 0.0)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, tiny_lm.vocab_size, (3, 12), generator=g)
    shapes = [(0, 5, 4, 1), (1, 0, 1, 7), (2, 9, 2, 3), (1, 2, 3, 1), (2, 3, 1, 4), (0, 5, 2, 6)]
    requests = [(tap.prefill(ids[p, :t]), torch.randint(0, tiny_lm.vocab_size, (n, k), generator=g))
                for p, t, n, k in shapes]
    for max_tokens in (1024, 8):  # one pass per kind of row, or many small passes
        for (prefix, rows), (h, grown) in zip(requests, tap.extend_many(requests, max_tokens)):
            alone = tap.extend(prefix, rows, layout="padded")
            assert h.shape == alone.shape
            assert torch.allclose(h, alone, rtol=1e-5, atol=1e-5 * float(alone.abs().max()))
            b, n = rows.shape[0] - 1, rows.shape[1]
            grown_prefix = grown(b, n)
            assert grown_prefix.ids.tolist() == prefix.ids.tolist() + rows[b].tolist()
            nxt = torch.randint(0, tiny_lm.vocab_size, (2, 2), generator=g)
            full = tap.states(torch.cat([grown_prefix.ids.expand(2, -1), nxt], 1))[:, -2:]
            assert torch.allclose(tap.extend(grown_prefix, nxt), full, rtol=1e-5, atol=1e-5 * float(full.abs().max()))



@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_extend_many_in_a_given_layout(tiny_lm, layout, monkeypatch):
    """layout= makes extend_many's pass that layout whatever its cost says (eps.measure_noise measures both
    lock-step layouts): the same states as each extend alone."""
    tap = LayerTap(tiny_lm, 2)
    tap._costs = (0.0, 0.0)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, tiny_lm.vocab_size, (3, 9), generator=g)
    used = []
    for name in ("_extend_flat", "_extend_padded"):
        monkeypatch.setattr(tap, name, lambda r, f=getattr(tap, name), name=name: used.append(name) or f(r))
    for lengths, by_cost in (((2, 2, 2), "padded"), ((5, 3, 1), "flat")):  # rows of one length / padding's waste
        requests = [(tap.prefill(ids[p, :1 + p]), ids[p, 1 + p:1 + p + k][None]) for p, k in enumerate(lengths)]
        for given in (None, layout):
            used.clear()
            answers = tap.extend_many(requests, layout=given)
            assert used == [f"_extend_{given or by_cost}"]
            for (prefix, rows), (h, _) in zip(requests, answers):
                alone = tap.extend(prefix, rows, layout="padded")
                assert torch.allclose(h, alone, rtol=1e-5, atol=1e-5 * float(alone.abs().max()))


def test_a_16_bit_models_lock_step_requests_share_only_padded_passes_of_their_prefix_length(monkeypatch):
    """In bfloat16 a flat pass of many requests put a state 10% from one full forward (SmolLM2 layer 15, where padded
    passes gave 1.6%), and a padded pass whose longer prefixes shifted a row's keys put the truth outside ε, where a
    pass of its own put it 5.2% off, within ε (fresh seed 1277, position 1 after ' spontaneous'): its attention kernels
    round by where the keys lie. So a 16-bit model's extend_many goes padded, even where layout="flat" is asked
    (eps's measurement), and a request shares a pass only with requests after prefixes of its length: those states
    are each extend's alone, up to bfloat16's rounding. A float32 model's still go flat, all in one pass."""
    for precision in ("bf16", "fp32"):
        tap = LayerTap(load_model("tiny-llama", precision=precision), 2)
        ids = torch.randint(0, tap.lm.vocab_size, (3, 9), generator=torch.Generator().manual_seed(4))
        passes = []
        for name in ("_extend_flat", "_extend_padded"):
            monkeypatch.setattr(tap, name, lambda r, f=getattr(tap, name), name=name:
                                passes.append((name, sorted(p.length for p, _ in r))) or f(r))
        extend = tap.extend
        monkeypatch.setattr(tap, "extend", lambda prefix, rows, keep=False, layout=None:
                            passes.append((layout, [prefix.length])) or extend(prefix, rows, keep=keep, layout=layout))
        requests = [(tap.prefill(ids[p, :t]), ids[p, t:t + k][None]) for p, (t, k) in enumerate(((1, 5), (2, 3), (2, 1)))]
        answers = tap.extend_many(requests, layout="flat")
        if precision == "fp32":
            assert passes == [("_extend_flat", [1, 2, 2])]
            continue
        assert sorted(passes) == [("_extend_padded", [2, 2]), ("padded", [1])]
        for (prefix, rows), (h, _) in zip(requests, answers):
            alone = extend(prefix, rows, layout="padded").float()
            assert torch.allclose(h.float(), alone, rtol=2e-2, atol=2e-2 * float(alone.abs().max()))


@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_grown_prefix_copies_its_cache_when_first_extended(tiny_lm, layout):
    """A grown prefix holds no cache of its own until extended (Prefix.make), and one extended after other
    passes ran (a lock-step batch's) continues like a fresh forward all the same."""
    tap = LayerTap(tiny_lm, 2)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, tiny_lm.vocab_size, (9,), generator=g)
    rows = torch.randint(0, tiny_lm.vocab_size, (3, 4), generator=g)
    _, grown = tap.extend(tap.prefill(ids[:5]), rows, keep=True, layout=layout)
    later = [grown(b, 2 + b) for b in range(3)]
    assert all(p.make is not None and p.made is None for p in later)
    tap.extend(tap.prefill(ids[:3]), rows, layout=layout)  # another pass before they are extended
    for prefix in later:
        nxt = torch.randint(0, tiny_lm.vocab_size, (2, 2), generator=g)
        full = tap.states(torch.cat([prefix.ids.expand(2, -1), nxt], 1))[:, -2:]
        assert torch.allclose(tap.extend(prefix, nxt), full, rtol=1e-5, atol=1e-5 * float(full.abs().max()))
        assert prefix.make is None  # copied once, the pass's cache released

def test_pack_chooses_passes_and_layouts_by_cost():
    """Rows of one length on empty prefixes share one padded pass (flat would pay attention between all
    of them); rows of many lengths go flat instead of padding short rows to a long one; max_tokens
    splits passes; a single larger request runs alone."""
    from sipit.models.tap import PASS_TOKENS, pack

    assert pack([(0, 1, 20)] * 32, 1024, 4e-4) == [(list(range(32)), False)]
    shapes = [(5, 1, 20)] + [(5, 1, 2)] * 30  # padded: 31 rows · 20; flat: 80 tokens against 235 keys
    assert 20 + 60 + PASS_TOKENS + 4e-4 * 80 * 235 < 31 * 20
    assert pack(shapes, 1024, 4e-4) == [(list(range(31)), True)]
    assert pack(shapes, 1024, 4e-4, flat=False) == [([0], False), (list(range(1, 31)), False)]
    assert pack([(0, 1, 10)] * 4, 20, 0.0) == [([0, 1], False), ([2, 3], False)]
    assert pack([(0, 5, 10), (0, 1, 3)], 20, 0.0) == [([0], False), ([1], False)]


def test_pack_puts_one_prompts_candidates_after_a_long_prefix_flat():
    """Padded, each of a request's rows copies its prefix's cache; flat, the prefix is there once: many
    rows after a long prefix go flat, a single row or an empty prefix stays padded (nothing to save)."""
    from sipit.models.tap import pack

    attention, copy = 4e-4, 0.011  # SmolLM2's
    assert pack([(200, 256, 1)], 1024, attention, copy) == [([0], True)]
    assert pack([(200, 1, 32)], 1024, attention, copy) == [([0], False)]
    assert pack([(0, 256, 1)], 1024, attention, copy) == [([0], False)]
    assert pack([(200, 256, 1)], 1024, attention, 0.0) == [([0], False)]  # copies free: padded, as before
    assert pack([(200, 256, 1)], 1024, attention, copy, flat=False) == [([0], False)]


@pytest.mark.parametrize("which", range(5))
def test_extend_flat_equals_padded(tiny_lm, which):
    """tap.extend's two layouts give the same states and grown prefixes, whichever it picks by cost."""
    tap = taps(tiny_lm)[which]
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, tiny_lm.vocab_size, (40,), generator=g)
    prefix = tap.prefill(ids[:30])
    rows = torch.randint(0, tiny_lm.vocab_size, (24, 3), generator=g)
    padded, grown_padded = tap.extend(prefix, rows, keep=True, layout="padded")
    for layout in ("flat", None):
        h, grown = tap.extend(prefix, rows, keep=True, layout=layout)
        assert torch.allclose(h, padded, rtol=1e-5, atol=1e-5 * float(padded.abs().max()))
        nxt = torch.randint(0, tiny_lm.vocab_size, (2, 2), generator=g)
        a, b = tap.extend(grown(5, 2), nxt), tap.extend(grown_padded(5, 2), nxt)
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))
    with pytest.raises(ValueError, match="layout"):
        tap.extend(prefix, rows, layout="flatt")
    one = tap.extend(prefix, rows[:, 0], layout="flat")  # [B] ids -> [B, d]
    assert torch.allclose(one, padded[:, 0], rtol=1e-5, atol=1e-5 * float(padded.abs().max()))


def test_extend_many_with_a_sliding_window(tiny_gemma3):
    """Requests inside the window share flat passes (at most window - 1 keys); those whose positions
    reach it share padded passes by prefix length: every state equals its own extend either way."""
    tap = LayerTap(tiny_gemma3, 4)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (12,), generator=g)
    shapes = [(2, 2, 2), (0, 3, 3), (3, 1, 1), (9, 2, 2), (9, 3, 1), (4, 2, 2)]  # (prefix, rows, k): 9 + k slides
    requests = [(tap.prefill(ids[:t]), torch.randint(0, 256, (n, k), generator=g)) for t, n, k in shapes]
    for (prefix, rows), (h, grown) in zip(requests, tap.extend_many(requests)):
        alone = tap.extend(prefix, rows, layout="padded")
        assert torch.allclose(tap.extend(prefix, rows, layout="flat"), alone, rtol=1e-5,  # (padded where it slides)
                              atol=1e-5 * float(alone.abs().max()))
        assert torch.allclose(h, alone, rtol=1e-5, atol=1e-5 * float(alone.abs().max()))
        grown_prefix = grown(0, rows.shape[1])
        nxt = torch.randint(0, 256, (1, 2), generator=g)
        full = tap.states(torch.cat([grown_prefix.ids[None], nxt], 1))[:, -2:]
        assert torch.allclose(tap.extend(grown_prefix, nxt), full, rtol=1e-5, atol=1e-5 * float(full.abs().max()))


@pytest.mark.parametrize("model_type", ["opt", "opt-350m", "llama4_text", "bloom", "mpt", "falcon", "gemma3n_text",
                                        "gemma4_text", "deepseek_v3", "lfm2", "qwen3_next",
                                        "qwen3_5_text", "jamba", "falcon_h1", "nemotron_h", "nemotron_h-moe-first",
                                        "granitemoehybrid", "zamba2"])
def test_passes_of_decoders_laid_out_unlike_llama_equal_the_full_forward(small_decoder, model_type):
    """OPT's blocks under base.decoder (OPT-350m's wider than its embedding), Llama-4's under a base model named
    otherwise, ALiBi's biases by a key's index (BLOOM, MPT: a flat pass or a cache padded to a longer prefix would
    move the keys), Falcon, recurrent blocks (conftest.LAYOUTS; Nemotron-H's MoE block before its attention keeps no
    cache layer of its own: one in its place said the cached length was 0, and every cached pass was off): every pass
    the loop uses, each layout asked for, gives the states of one full forward of the same tokens."""
    _assert_passes_equal_the_full_forward(LayerTap(small_decoder(model_type), 3))


def test_taps_below_the_first_attention_block_equal_the_full_forward(small_decoder):
    """GraniteMoE-Hybrid's attention is its last block: a tap below it reads a cache of Mamba blocks only, which cannot
    say its length (transformers asks it for the attention masks and refused); Nemotron-H's KV surface is its attention
    `mixer`."""
    for layer in (1, 2):
        _assert_passes_equal_the_full_forward(LayerTap(small_decoder("granitemoehybrid"), layer))
    _assert_passes_equal_the_full_forward(KVTap(small_decoder("nemotron_h"), 2, "both"))


def test_a_shared_attention_block_keeps_keys_and_values_at_each_block_that_runs_it(small_decoder):
    """Zamba2's hybrid blocks (1 and 3 here) run one attention block whose weights they share, each with adapters of
    its own, and each keeps its keys and values at its own index of the cache: their KV surfaces are those (they were
    refused as blocks without an attention module), and their passes equal the full forward. Its Mamba block keeps
    none: a clear error."""
    from sipit.models import ModelError
    from sipit.models.surfaces import kv_observation

    lm = small_decoder("zamba2")
    ids = torch.randint(0, lm.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    cache = lm.new_cache(3)
    lm.model(input_ids=ids, cache=cache, use_cache=True)
    for layer in (1, 3):
        tap = KVTap(lm, layer, "both")
        full = kv_observation(cache.layers[layer - 1].keys, cache.layers[layer - 1].values, "both")
        assert torch.allclose(tap.states(ids), full, rtol=1e-5, atol=1e-5 * float(full.abs().max()))
        _assert_passes_equal_the_full_forward(tap)
    with pytest.raises(ModelError, match="block 1 .* no attention module"):
        KVTap(lm, 2)


def _assert_passes_equal_the_full_forward(tap):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, tap.lm.vocab_size, (4, 12), generator=g)
    full = tap.states(ids)  # [4, 12, d]
    spans = [(0, 0, 5), (1, 2, 3), (2, 7, 4), (3, 4, 1), (1, 0, 1)]  # (prompt, prefix length, new tokens)
    requests = [(tap.prefill(ids[p, :t]), ids[p, t:t + k][None]) for p, t, k in spans]
    for layout in (None, "flat", "padded"):
        for (p, t, k), (h, _) in zip(spans, tap.extend_many(requests, layout=layout)):
            assert torch.allclose(h[0], full[p, t:t + k], rtol=1e-5, atol=1e-5 * float(full[p].abs().max()))
        h = tap.extend(requests[2][0], ids[2, 7:9][None], layout=layout)  # one request alone
        assert torch.allclose(h[0], full[2, 7:9], rtol=1e-5, atol=1e-5 * float(full[2].abs().max()))
    close = dict(rtol=1e-5, atol=1e-5 * float(full[:, 0].abs().max()))  # one token from nothing: the position-0
    assert torch.allclose(tap.states(ids[:, :1]), full[:, :1], **close)  # table, SipIt's first position
    assert torch.allclose(tap.extend(tap.prefill(ids[0, :0]), ids[:, 0]), full[:, 0], **close)


def test_a_recurrent_prefix_is_grown_in_its_own_pass_not_cut_back(small_decoder, monkeypatch):
    """Qwen3-Next's gated delta nets keep a state that holds no earlier position (conftest.LAYOUTS: linear, full,
    linear attention; inverting it was refused): a shorter prefix's cache is made anew, a pass's grown prefix by a pass
    of its tokens on the prefix's own, a pass never updates a prefix's state in place, and a Prefix that cannot regrow
    refuses to be cut back rather than keep a state of its whole length; a crop grows from the crop asked for before
    it where that is shorter and made (certificates crop at t = 1, 2, ...: they made every crop anew, T²/2 tokens);
    one token from nothing takes the recurrent step, not the chunked scan. Block 0 keeps no keys and values: its KV
    surface is a clear error. Certificates (which read every position on a crop of the prompt) come out exact, on
    Nemotron-H's Mamba-2 blocks (Qwen3-Next's inversion took 71-112 s on an empty cache, in transformers' reference
    kernels: docs/results/models/decoders.py inverts it; Nemotron-H's 2 s)."""
    from sipit.models import ModelError
    from sipit.models.tap import Prefix

    lm = small_decoder("qwen3_next")
    tap = LayerTap(lm, 3)
    ids = torch.randint(0, lm.vocab_size, (12,), generator=torch.Generator().manual_seed(0))
    full = tap.states(ids)
    close = dict(rtol=1e-5, atol=1e-5 * float(full.abs().max()))
    assert lm.recurrent and not small_decoder("opt").recurrent
    prefix = tap.prefill(ids[:8])
    assert torch.allclose(tap.extend(prefix.crop(3), ids[3:5][None])[0], full[3:5], **close)
    made = []  # crops asked for in order are each grown from the one before (as certificates ask): one prefill
    monkeypatch.setattr(LayerTap, "prefill", lambda self, ids, *a, _prefill=LayerTap.prefill: made.append(len(ids))
                        or _prefill(self, ids, *a))
    for t in (2, 4, 4, 7):
        assert torch.allclose(tap.extend(prefix.crop(t), ids[t:t + 1][None])[0], full[t:t + 1], **close)
    assert made == [2]
    monkeypatch.undo()
    # one token from nothing (the position-0 table, SipIt's first position) takes the recurrent step on zero states,
    # not the chunked scan that pads it to a chunk of 64 on transformers' reference kernels (after the one prefill of
    # a token that gives the states' shapes)
    from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next

    assert torch.allclose(tap.states(ids[None, :1])[0], full[:1], **close)
    chunked, scan = [], qwen3_next.torch_chunk_gated_delta_rule
    monkeypatch.setattr(qwen3_next, "torch_chunk_gated_delta_rule", lambda *a, **k: chunked.append(1) or scan(*a, **k))
    assert torch.allclose(tap.states(ids[None, :1])[0], full[:1], **close)
    assert torch.allclose(tap.extend(tap.prefill(ids[:0]), ids[:3])[0], full[0], **close)  # 3 candidates' rows
    assert not chunked
    monkeypatch.undo()
    assert torch.allclose(tap.extend(prefix, ids[8:10][None])[0], full[8:10], **close)  # (untouched by the passes)
    assert torch.allclose(tap.extend(prefix, ids[8:10][None])[0], full[8:10], **close)
    _, grown = tap.extend(tap.prefill(ids[:2]), ids[2:7][None], keep=True)
    assert torch.allclose(tap.extend(grown(0, 3), ids[5:7][None])[0], full[5:7], **close)
    with pytest.raises(RuntimeError, match="cannot be cut back"):
        Prefix(ids[:8], prefix.cache).crop(3)
    with pytest.raises(ModelError, match="block 0 .* no attention module"):
        KVTap(lm, 1)
    lm = small_decoder("nemotron_h")
    full = LayerTap(lm, 3).states(ids)
    r = invert(lm, full[None], 3, InvertConfig(certify="top:8", calibration_tokens=8192), progress=False,
               true_ids=[ids.tolist()])
    assert r.prompts[0].ids == ids.tolist() and r.prompts[0].status == "ok"


def test_several_residual_streams_are_read_side_by_side(small_decoder):
    """Gemma-3n's blocks hand on 2 streams here (AltUp, [A, B, T, d]): a layer's state is them side by side,
    [B, T, A·d], the model's own hidden_states at every layer (it was [A, B, T, d], which no inversion took). The
    final norm is applied after the model's mixing of the streams into one (it was refused): the state the LM head
    reads, and logits invert through it. What it does not have is a clear error: a KV surface of the block that reads
    an earlier one's keys and values."""
    from sipit.models import ModelError
    from sipit.models.surfaces import logits_error, logits_tap, normed_states_from_logits

    lm = small_decoder("gemma3n_text")
    ids = torch.randint(0, lm.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = lm.model(ids, output_hidden_states=True)
        normed = lm.base(ids).last_hidden_state  # [B, T, d]
    hidden = out.hidden_states  # [A, B, T, d] each
    assert lm.streams == 2 and lm.d_model == 64
    for layer in range(lm.depth + 1):
        assert torch.equal(LayerTap(lm, layer).states(ids), hidden[layer].permute(1, 2, 0, 3).flatten(2))
    assert torch.allclose(LayerTap(lm, 3, final_norm=True).states(ids), normed, rtol=1e-5, atol=1e-6)
    x = torch.stack([normed_states_from_logits(lm, z) for z in out.logits])  # (soft-capped: Gemma-3n's 30)
    config = InvertConfig(calibration_tokens=8192, observation_error=logits_error(lm, 2.0 ** -24))
    r = invert(lm, x, 3, config, progress=False, true_ids=ids.tolist(), tap=logits_tap(lm))
    assert [p.ids for p in r.prompts] == ids.tolist() and {p.status for p in r.prompts} == {"ok"}
    with pytest.raises(ModelError, match="block 2 .* keeps no KV cache of its own"):
        KVTap(lm, 3)


def test_a_block_that_does_not_run_is_a_clear_error():
    """Mllama (Llama-3.2-Vision) skips its cross-attention blocks without an image: their layers have no state of their
    own, and reading one says so (it was a KeyError); the layers below and above them read (transformers'
    hidden_states leave the skipped block out: its [2] is layer 3 here), and the last one inverts exactly though the LM
    head has 8 rows fewer than the embedding (its image tokens: the LM prior indexed past the head)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from sipit.models import ModelError
    from sipit.models.lm import LM

    text = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, cross_attention_layers=[1], pad_token_id=0, bos_token_id=1, eos_token_id=2)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_global_layers=1, attention_heads=2,
                  image_size=28, patch_size=14, vision_output_dim=32, intermediate_layers_indices=[0])
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(AutoConfig.for_model(
        "mllama", text_config=text, vision_config=vision, image_token_index=95)).eval()
    lm = LM("tiny-mllama", model, None)
    ids = torch.randint(3, 90, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
    for layer, k in ((1, 1), (3, 2)):
        assert torch.allclose(LayerTap(lm, layer).states(ids), hidden[k], atol=1e-6)
    assert torch.allclose(LayerTap(lm, 4, final_norm=True).states(ids), hidden[3], atol=1e-6)
    with pytest.raises(ModelError, match=r"block\(s\) \[1\] \(0-based\) did not run on this input"):
        LayerTap(lm, 2).states(ids)
    assert lm.vocab_size == 104 and lm.unembedding_rows().shape == (104, 32)
    prompts = torch.randint(0, lm.vocab_size, (3, 8), generator=torch.Generator().manual_seed(2))
    r = invert(lm, LayerTap(lm, 4).states(prompts), 4, InvertConfig(calibration_tokens=8192), progress=False,
               true_ids=prompts.tolist())
    assert [p.ids for p in r.prompts] == prompts.tolist() and [p.status for p in r.prompts] == ["ok"] * 3


def test_an_image_text_models_sliding_window_is_read_from_its_text_config():
    """Gemma-3's image-text model keeps its sliding window in its text config: rows past it go padded by prefix length
    (a flat pass's mask has no window), so every layout gives the states of one full forward."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from sipit.models.lm import LM

    text = dict(model_type="gemma3_text", vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
                layer_types=["sliding_attention", "full_attention"], pad_token_id=0, bos_token_id=1, eos_token_id=2)
    vision = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=2, image_size=28, patch_size=14)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(AutoConfig.for_model(
        "gemma3", text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=95,
        boi_token_index=94, eoi_token_index=93)).eval()
    lm = LM("tiny-gemma3-image-text", model, None)
    assert lm.sliding_window == 4
    tap = LayerTap(lm, 2)
    ids = torch.randint(3, 90, (2, 12), generator=torch.Generator().manual_seed(0))
    full = tap.states(ids)
    spans = [(0, 6, 5), (1, 3, 6)]  # (prompt, prefix length, new tokens): both reach past the window
    requests = [(tap.prefill(ids[p, :t]), ids[p, t:t + k][None]) for p, t, k in spans]
    for layout in (None, "flat", "padded"):
        for (p, t, k), (h, _) in zip(spans, tap.extend_many(requests, layout=layout)):
            assert torch.allclose(h[0], full[p, t:t + k], rtol=1e-5, atol=1e-5 * float(full[p].abs().max()))
