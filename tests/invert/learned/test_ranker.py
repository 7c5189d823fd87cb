from dataclasses import replace

import pytest
import torch

from sipit.invert.learned import LinearRanker, calibrate
from sipit.invert.learned.ranker import TOP_GROUP, against, row_dots, squared_norms, top_rows
from sipit.models import LayerTap

from .conftest import FAST


@pytest.fixture(scope="module")
def ranker(lm):
    """A full-rank screen (the tests below compare its scores with exact ones, and lower the rank themselves)."""
    tap = LayerTap(lm, 2)
    return LinearRanker(calibrate(tap, replace(FAST, screen_rank=lm.d_model)), tap)


def test_reranking_fits_offset_and_gain_from_evaluated_candidates(ranker):
    """Anchors u with exact states W h(u) = b + s·P_u: the fit recovers (b, s), so the token whose
    state is b + s·P_v ranks first; one anchor g is the plain shift r = W(ĥ − h(g)) + gain·P_g."""
    W, P = ranker.cal.white.double(), ranker.cal.P.double()
    g = torch.Generator().manual_seed(0)
    b, s, v = torch.randn(P.shape[1], generator=g, dtype=torch.float64), 0.37, 5
    u = torch.tensor([1, 2, 3, 7, 11, 13])
    unwhite = lambda y: torch.linalg.solve(W, y.T).T  # y [n, d] = h @ W with W symmetric  <=>  h = W^{-1} y
    states = unwhite(b + s * P[u]).float()
    target = torch.stack([states[0], unwhite((b + s * P[v])[None])[0].float()])  # position 1 holds token v
    y, gain = ranker.anchored_residual(target, 1, (u, states))
    assert gain == pytest.approx(s, rel=1e-3)
    assert torch.allclose(y.double(), s * P[v], atol=1e-2 * float(P[v].norm()))
    assert int(ranker.scores(target, 1, False, (u, states)).argmax()) == v
    y1, gain1 = ranker.anchored_residual(target, 1, (u[:1], states[:1]))
    assert gain1 == ranker.gain and 0 < ranker.gain <= 1
    assert torch.allclose(y1, (target[1] - states[0]) @ ranker.cal.white + ranker.gain * ranker.cal.P[1], atol=1e-4)


def test_position0_is_exact_for_every_token_and_bounds_are_below_the_truth(lm, ranker):
    tap = LayerTap(lm, 2)
    ids = torch.arange(0, lm.vocab_size, 17)
    states = tap.states(ids[:, None])[:, 0]
    guesses, dists, bounds = ranker.position0(states)  # every prompt's position 0 at once
    for v, h, guess, dist, bound in zip(ids.tolist(), states, guesses.tolist(), dists, bounds):
        assert guess == v or float(dist[guess]) <= 1e-5  # a bit-identical row is as good
        true = (ranker.cal.table.double() - h.double()).norm(dim=1) / h.double().norm()
        assert bool((bound <= true + 1e-6).all())
        alone = ranker.position0(h[None])
        assert int(alone[0]) == guess and torch.allclose(alone[1][0], dist) and torch.allclose(alone[2][0], bound)


def test_guesses_recover_a_text_prompt(lm, ranker):
    ids = torch.tensor(lm.encode("The cat sat on the mat and looked at the dog.")[:12])
    [(guesses, prior)] = ranker.guesses([LayerTap(lm, 2).states(ids)])
    assert not prior and float((guesses == ids[1:]).float().mean()) >= 0.8


def test_the_lens_reranks_the_screens_best_of_text_like_prompts_only(lm, ranker):
    """Below the last layer the calibration has a lens: the LM head read through a translation of the previous
    state. A prompt scoring above lens_gate gets the screen's best re-ranked by score + 2·lm_weight·logit
    (with a huge weight: the best logit among them); one below keeps the plain top-1."""
    import copy

    cal = ranker.cal
    assert cal.lens_w is not None and cal.lens_w.shape == (lm.d_model, lm.d_model) and cal.lens_gate is not None
    target = LayerTap(lm, 2).states(torch.tensor(lm.encode("The cat sat on the mat and looked at the dog.")[:12]))
    top, scores = ranker.screen_best(ranker.context_residuals(target))
    assert top.shape[1] == min(ranker.screen_top, lm.vocab_size) and bool((scores[:, :-1] >= scores[:, 1:]).all())
    logits = ranker.lens_logits(target[:-1], top)
    assert not torch.equal(logits.argmax(1), torch.zeros(len(top), dtype=torch.long))  # the two cases differ
    for gate, weight, expect in ((float("inf"), 5.0, top[:, 0]), (-float("inf"), 1e6, top.gather(1, logits.argmax(1, keepdim=True))[:, 0])):
        other = copy.copy(ranker)
        other.cal = copy.copy(cal)
        other.cal.lens_gate, other.cal.lm_weight = gate, weight
        assert torch.equal(other.guesses([target])[0][0], expect)


def test_the_lm_stream_joins_from_the_third_batch(lm, ranker):
    """Without a prior the LM's ranking comes from prefix_lm(), asked for once, at the third batch:
    the token it ranks first is in that batch even when the linear scores rank it last."""
    ids = torch.tensor(lm.encode("The cat sat on the mat and looked at the dog.")[:6])
    target = LayerTap(lm, 2).states(ids)
    last = int(ranker.scores(target, 3, False).argmin())
    asked = []

    def prefix_lm():
        asked.append(1)
        return torch.nn.functional.one_hot(torch.tensor(last), lm.vocab_size).float()

    empty = (torch.zeros(0, dtype=torch.long), target.new_zeros(0, target.shape[1]))
    batches = list(ranker.ranking(target, 3, False, [4, 8, 16], lambda: empty, prefix_lm))
    assert last not in torch.cat(batches[:2]).tolist() and last in batches[2].tolist()
    assert len(asked) == 1
    assert sorted(torch.cat(batches).tolist()) == list(range(lm.vocab_size))  # every token once


def test_the_norm_free_stream_joins_from_the_second_batch(lm, ranker):
    """From the second batch on, a quarter of each follows the linear model without its norm term
    (free_scores = scores + g²‖P_v‖²): where its best token not yet given is not among the main scores' picks
    for that batch, it is in the batch anyway; the first batch, without anchors or a prior, is the main
    scores' best alone."""
    ids = torch.tensor(lm.encode("The cat sat on the mat and looked at the dog.")[:8])
    target = LayerTap(lm, 2).states(ids)
    empty = (torch.zeros(0, dtype=torch.long), target.new_zeros(0, target.shape[1]))
    only_free = []
    for t in range(1, len(ids)):
        main = ranker.scores(target, t, False)
        free = main + ranker.gain ** 2 * ranker.cal.P_sq
        batches = list(ranker.ranking(target, t, False, [4, 8, 16], lambda: empty))
        assert batches[0].tolist() == main.topk(4).indices.tolist()
        assert sorted(torch.cat(batches).tolist()) == list(range(lm.vocab_size))  # every token once
        given = torch.zeros(lm.vocab_size, dtype=torch.bool).index_fill_(0, batches[0], True)
        best_free = int(free.masked_fill(given, -float("inf")).argmax())
        if best_free not in main.masked_fill(given, -float("inf")).topk(8 - 8 // 4).indices.tolist():
            only_free.append(t)
            assert best_free in batches[1].tolist()
    assert only_free  # (the prompt has positions where the two streams differ: the test can see the quarter)
    expected = ranker.scores(target, 1, False) + ranker.gain ** 2 * ranker.cal.P_sq
    assert torch.allclose(ranker.free_scores(target, 1), expected)


def test_token_scores_screen_in_the_subspace_and_are_exact_for_the_best(lm, ranker, monkeypatch):
    """With a low-rank screen (rank 8 of d), token_scores is exact for the EXACT_TOP best by the projected
    distance (2g·(yB)·(P_v B) − g²‖P_v B‖²) and 2g·(yB)·(P_v B) − g²‖P_v‖² for the rest; a full-rank screen is
    exact. Rows with their own gains scored together give what each gives alone. A bfloat16 screen gives the
    float32 one's values to bfloat16's rounding."""
    import copy

    from sipit.invert.learned import ranker as module

    c = ranker.cal
    y, g = torch.randn(c.P.shape[1], generator=torch.Generator().manual_seed(1)), 0.7
    exact = 2 * g * (c.P @ y) - g * g * c.P_sq
    assert c.p_basis.shape[1] == c.P.shape[1] and torch.allclose(ranker.token_scores(y[None], torch.tensor([g]))[0], exact,
                                                                   rtol=1e-6, atol=1e-4)
    cal = copy.copy(c)
    cal.p_basis = c.p_basis[:, :8].contiguous()
    cal.p_proj = (c.P @ cal.p_basis).contiguous()
    monkeypatch.setattr(module, "EXACT_TOP", 32)
    low = LinearRanker(cal, LayerTap(lm, 2), low=torch.float32)
    s = low.token_scores(y[None], torch.tensor([g]))[0]
    y2 = torch.randn(c.P.shape[1], generator=torch.Generator().manual_seed(2))
    both = low.token_scores(torch.stack([y, y2]), torch.tensor([g, 1.3]))
    assert torch.allclose(both[0], s, atol=1e-5) and torch.allclose(both[1], low.token_scores(y2[None], torch.tensor([1.3]))[0], atol=1e-5)
    dots = 2 * g * (cal.p_proj @ (y @ cal.p_basis))
    top = (dots - g * g * (cal.p_proj ** 2).sum(1)).topk(32).indices
    screen = dots - g * g * c.P_sq
    rest = torch.ones(len(s), dtype=torch.bool)
    rest[top] = False
    assert torch.allclose(s[top], exact[top]) and torch.allclose(s[rest], screen[rest], atol=1e-5)
    assert not torch.allclose(screen[top], exact[top])  # rank 8 is a real approximation
    bf16 = LinearRanker(cal, LayerTap(lm, 2), low=torch.bfloat16).token_scores(y[None], torch.tensor([g]))[0]
    assert torch.allclose(bf16[rest], screen[rest], rtol=2e-2, atol=2e-2 * float(screen.abs().max()))


def test_revised_guesses_anchor_each_position_on_the_state_given_for_it(lm, ranker):
    """revised([(target, t, ids, states, prior, shortlist)]): a position whose given state is the observed one (its
    guess in the right context) keeps that guess; one whose given state is another token's in the right
    context is re-ranked to the observed token, from the shortlist first_look picked its guess from (a shortlist
    without it gives one of its own tokens). Many revisions at once (a lock-step batch's) give what each gives
    alone."""
    ids = torch.tensor(lm.encode("The cat sat on the mat and looked at the dog.")[:10])
    tap = LayerTap(lm, 2)
    target = tap.states(ids).float()
    wrong = ids.clone()
    wrong[5] = (ids[5] + 1) % lm.vocab_size
    seen = torch.stack([target[4], tap.extend(tap.prefill(ids[:5]), wrong[5:6])[0].float(), target[6]])
    [(_, _, shortlist)] = ranker.first_look([target])  # [9, m]: positions 1..9
    assert shortlist.shape[1] > 1 and bool((shortlist[4] == ids[5]).any())
    new, = ranker.revised([(target, 4, wrong[4:7], seen, False, shortlist[3:6])])
    assert new.tolist() == ids[4:7].tolist()
    without = shortlist[3:6].clone()
    without[1][without[1] == ids[5]] = wrong[5]
    new, = ranker.revised([(target, 4, wrong[4:7], seen, False, without)])
    assert int(new[1]) != int(ids[5]) and int(new[1]) in without[1].tolist()
    items = [(target, 4, wrong[4:7], seen, False, shortlist[3:6]),
             (target, 1, ids[1:4], target[1:4] + 0.1, False, shortlist[0:3]),
             (target, 7, wrong[7:9], target[7:9], False, shortlist[6:8])]
    assert [g.tolist() for g in ranker.revised(items)] == [ranker.revised([item])[0].tolist() for item in items]


def test_screens_in_row_blocks_give_what_one_product_gives(lm, ranker, monkeypatch):
    """screen and screen_prior split many residuals into SCREEN_ROWS-row products (cache-sized
    temporaries); the top-1 ids are those of one product over all rows."""
    import copy

    from sipit.invert.learned import ranker as module

    c = copy.copy(ranker.cal)
    c.p_basis = ranker.cal.p_basis[:, :8].contiguous()  # a low-rank screen: the screened path
    c.p_proj = (c.P @ c.p_basis).contiguous()
    c.u_basis, c.lm_weight = torch.eye(c.P.shape[1]), 5.0  # an LM prior, as at the last layer
    c.u_proj = ranker.unembed if ranker.unembed is not None else lm.unembedding_rows().float()
    low = LinearRanker(c, LayerTap(lm, 2), low=torch.float32)
    low.unembed = c.u_proj
    g = torch.Generator().manual_seed(3)
    r, n = torch.randn(37, c.P.shape[1], generator=g), torch.randn(37, c.P.shape[1], generator=g)
    whole = low.screen(r), low.screen_prior(r, n)
    monkeypatch.setattr(module, "SCREEN_ROWS", 5)
    assert torch.equal(low.screen(r), whole[0]) and torch.equal(low.screen_prior(r, n), whole[1])


def test_biased_screen_is_half_the_score_less_a_row_constant(lm, ranker):
    """One product with the bias folded in: (rB)·(P_v B) − (g/2)‖P_v B‖² − ‖rB‖²/2g for every token (float32
    screen: to float32 rounding; bfloat16: the same order for the best, up to its rounding)."""
    c, g = ranker.cal, ranker.gain
    r = torch.randn(5, c.P.shape[1], generator=torch.Generator().manual_seed(2))
    x = r @ c.p_basis
    want = x @ c.p_proj.T - (g / 2) * (c.p_proj ** 2).sum(1) - (x ** 2).sum(1, keepdim=True) / (2 * g)
    f32 = LinearRanker(c, LayerTap(lm, 2), low=torch.float32)
    got = f32._biased_screen([x], f32.screen_table)
    assert got.dtype == torch.float32 and torch.allclose(got, want, rtol=1e-4, atol=1e-3 * float(want.abs().max()))
    bf16 = LinearRanker(c, LayerTap(lm, 2), low=torch.bfloat16)
    low = bf16._biased_screen([x], bf16.screen_table)
    assert low.dtype == torch.bfloat16 and torch.allclose(low.float(), want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))


@pytest.mark.parametrize("rows", [1, 2, 16, 17])
def test_against_is_the_product_with_the_table_transposed(rows):
    """against computes x @ tableᵀ by whichever layout is faster for its row count: the same numbers."""
    table, x = torch.randn(300, 24), torch.randn(rows, 24)
    assert torch.allclose(against(x, table), x @ table.T, atol=1e-5)
    assert against(x, table).shape == (rows, 300)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_dots_equal_the_gathered_product(dtype):
    """row_dots gives table[ids] @ x row by row, ids repeated within a row or not (float32 on a CPU: the product at
    those entries only; float64: gathered in blocks of rows), and an empty [0, m] for no rows."""
    g = torch.Generator().manual_seed(0)
    table, x = torch.randn(50, 8, generator=g, dtype=dtype), torch.randn(37, 8, generator=g, dtype=dtype)
    ids = torch.randint(0, 50, (37, 5), generator=g)
    ids[0] = 7  # (one row's entries all alike)
    assert torch.allclose(row_dots(table, ids, x, rows=16), (table[ids] @ x[:, :, None])[..., 0], atol=1e-6)
    assert row_dots(table, ids[:0], x[:0]).shape == (0, 5)


@pytest.mark.parametrize("V,k", [(49_152, 16), (49_152, 256), (4_100, 3), (4_100, 65), (300, 5)])
@pytest.mark.parametrize("largest", [True, False])
def test_top_rows_finds_what_topk_finds(V, k, largest):
    """top_rows' two stages (groups' bests, then the best groups' entries; the columns past the last whole group
    always among them) give torch.topk's indices, best first, also where the best sit in one group or in the
    tail, and for a 1-D row; (4,100, 65) and (300, 5) take topk itself."""
    g = torch.Generator().manual_seed(V + k)
    x = torch.randn(7, V, generator=g)
    x[1, 5 + (V // TOP_GROUP) * torch.arange(min(k, TOP_GROUP))] += 100 if largest else -100  # row 1: one group's all best
    x[2, -2:] += 100 if largest else -100  # row 2: two of the best past the last whole group
    want = x.topk(k, dim=1, largest=largest).indices
    assert torch.equal(top_rows(x, k, largest), want)
    assert torch.equal(top_rows(x[3], k, largest), want[3])


def test_a_ranker_rereads_its_screens_as_a_new_ranker_reads_them(lm):
    """A fit tries ranks on one ranker (use_screen, use_head after changing the calibration's subspaces): each
    screen the same, tensor for tensor, as a ranker made on the changed calibration has."""
    tap = LayerTap(lm, lm.n_layers)
    cal = calibrate(tap, FAST)
    ranker = LinearRanker(cal, tap, low=torch.float32)
    g = torch.Generator().manual_seed(0)
    cal.p_basis, cal.u_basis = (torch.linalg.qr(torch.randn(lm.d_model, 2, generator=g))[0] for _ in range(2))
    cal.p_proj, cal.u_proj = cal.P @ cal.p_basis, lm.unembedding_rows().float() @ cal.u_basis  # (rank 2 of each)
    ranker.use_screen()
    ranker.use_head()
    new = LinearRanker(cal, tap, low=torch.float32)
    for name in ("p_sq", "screen_table", "p_proj_low", "head_low", "unembed"):
        assert torch.equal(getattr(ranker, name), getattr(new, name)), name
    assert ranker.exact_screen == new.exact_screen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_squared_norms_in_blocks_are_the_whole_products_and_leave_the_rows(dtype):
    x = torch.randn(10_000, 7, generator=torch.Generator().manual_seed(0), dtype=dtype)
    kept = x.clone()
    assert torch.equal(squared_norms(x, block=4096), (x.double() ** 2).sum(1)) and torch.equal(x, kept)
