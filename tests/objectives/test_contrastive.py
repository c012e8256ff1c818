"""Token-span masking and InfoNCE (bertcf.objectives.contrastive), checked against the distribution
and a loop-based reference written independently of the implementation."""
import math

import pytest
import torch

from bertcf.objectives.contrastive import InfoNCE, sample_span_lengths, span_mask

CLS, SEP, PAD, MASK = 101, 102, 0, 103
SPECIAL = torch.tensor([PAD, CLS, SEP, MASK])


def capped_geometric_pmf(p: float, cap: int) -> list[float]:
    """P(L = k) for k = 1..cap, L ~ Geometric(p) on {1, 2, ...} with the tail folded into cap."""
    pmf = [(1 - p) ** (k - 1) * p for k in range(1, cap)]
    return pmf + [(1 - p) ** (cap - 1)]


def capped_geometric_mean(p: float, cap: int) -> float:
    return sum((1 - p) ** k for k in range(cap))


def make_batch(lengths, pad_to=None, seed=0):
    """BERT-style inputs [CLS] w1..wn [SEP] [PAD]..., n = lengths[i] word pieces per row."""
    g = torch.Generator().manual_seed(seed)
    t = pad_to or max(lengths) + 2
    ids = torch.full((len(lengths), t), PAD)
    mask = torch.zeros((len(lengths), t), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, 0], ids[i, n + 1] = CLS, SEP
        ids[i, 1:n + 1] = torch.randint(1000, 2000, (n,), generator=g)
        mask[i, :n + 2] = 1
    special = torch.isin(ids, SPECIAL) | (mask == 0)
    return ids, mask, special


# ---- the span length distribution -------------------------------------------------------------
def test_capped_geometric_reference_is_a_distribution():
    for p, cap in [(0.3, 5), (0.5, 3), (1.0, 4), (0.05, 1)]:
        pmf = capped_geometric_pmf(p, cap)
        assert sum(pmf) == pytest.approx(1.0)
        assert sum(k * q for k, q in enumerate(pmf, start=1)) == pytest.approx(capped_geometric_mean(p, cap))


@pytest.mark.parametrize("p,cap", [(0.3, 5), (0.5, 3), (0.1, 10), (0.8, 2)])
def test_span_lengths_match_capped_geometric(p, cap):
    n = 200_000
    lengths = sample_span_lengths(n, p, cap, torch.Generator().manual_seed(1))
    assert lengths.dtype == torch.long and lengths.shape == (n,)
    assert int(lengths.min()) >= 1 and int(lengths.max()) <= cap
    pmf = capped_geometric_pmf(p, cap)
    mean = capped_geometric_mean(p, cap)
    var = sum(k * k * q for k, q in enumerate(pmf, start=1)) - mean ** 2
    # Tight: 5 standard errors of the empirical mean (about 0.015 tokens for p=0.3, cap 5).
    assert float(lengths.double().mean()) == pytest.approx(mean, abs=5 * math.sqrt(var / n) + 1e-9)
    counts = torch.bincount(lengths, minlength=cap + 1)[1:].double() / n
    for k, (freq, q) in enumerate(zip(counts.tolist(), pmf), start=1):
        assert freq == pytest.approx(q, abs=5 * math.sqrt(q * (1 - q) / n) + 1e-9), f"P(L={k})"


def test_span_length_p_one_and_cap_zero():
    assert torch.equal(sample_span_lengths(1000, 1.0, 5, torch.Generator().manual_seed(0)), torch.ones(1000, dtype=torch.long))
    assert torch.equal(sample_span_lengths(1000, 0.3, 0, torch.Generator().manual_seed(0)), torch.zeros(1000, dtype=torch.long))


def test_span_lengths_reproducible_with_generator():
    a = sample_span_lengths(500, 0.3, 5, torch.Generator().manual_seed(7))
    b = sample_span_lengths(500, 0.3, 5, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


# ---- span_mask ---------------------------------------------------------------------------------
def masked_positions(before, after):
    return (before != after).nonzero().flatten().tolist()


def test_span_mask_one_contiguous_span_never_special():
    lengths = [1, 2, 3, 5, 8, 13, 20, 30] * 25
    ids, mask, special = make_batch(lengths, pad_to=40, seed=3)
    ids_before, mask_before, special_before = ids.clone(), mask.clone(), special.clone()
    out = span_mask(ids, mask, special, MASK, p=0.3, cap=5, generator=torch.Generator().manual_seed(0))
    # The input is not modified.
    assert torch.equal(ids, ids_before) and torch.equal(mask, mask_before) and torch.equal(special, special_before)
    assert out.shape == ids.shape and out.dtype == ids.dtype
    changed = out != ids
    assert torch.all(out[changed] == MASK)  # only [MASK] is written
    assert not changed[special].any()  # never [CLS], [SEP] or padding
    assert not changed[:, 0].any()
    assert torch.equal(out[mask == 0], ids[mask == 0])
    for i, n in enumerate(lengths):
        pos = masked_positions(ids[i], out[i])
        assert 1 <= len(pos) <= min(5, n), (n, pos)  # exactly one non-empty span per sentence
        assert pos == list(range(pos[0], pos[0] + len(pos))), pos  # contiguous
        assert pos[0] >= 1 and pos[-1] <= n  # inside the words, between [CLS] and [SEP]


def test_span_mask_span_length_is_the_drawn_length_capped_by_the_sentence():
    # span_mask draws the lengths first from the same generator: the masked count of each
    # sentence is min(drawn length, maskable tokens).
    lengths = [1, 2, 3, 4, 6, 9, 15, 25] * 10
    ids, mask, special = make_batch(lengths, seed=4)
    drawn = sample_span_lengths(len(lengths), 0.3, 5, torch.Generator().manual_seed(11))
    out = span_mask(ids, mask, special, MASK, p=0.3, cap=5, generator=torch.Generator().manual_seed(11))
    counts = (out != ids).sum(1)
    assert counts.tolist() == [min(int(d), n) for d, n in zip(drawn, lengths)]


def test_span_mask_empirical_mean_matches_distribution():
    # Long sentences (never shorter than the cap): masked counts follow the capped geometric law.
    b, p, cap = 20_000, 0.3, 5
    ids, mask, special = make_batch([12] * b, seed=5)
    out = span_mask(ids, mask, special, MASK, p=p, cap=cap, generator=torch.Generator().manual_seed(2))
    counts = (out != ids).sum(1)
    pmf = capped_geometric_pmf(p, cap)
    mean = capped_geometric_mean(p, cap)
    var = sum(k * k * q for k, q in enumerate(pmf, start=1)) - mean ** 2
    assert float(counts.double().mean()) == pytest.approx(mean, abs=5 * math.sqrt(var / b))
    freq = torch.bincount(counts, minlength=cap + 1)[1:].double() / b
    for q_emp, q in zip(freq.tolist(), pmf):
        assert q_emp == pytest.approx(q, abs=5 * math.sqrt(q * (1 - q) / b))
    # The start is uniform over the possible positions: every position gets masked sometimes.
    assert (out[:, 1:13] == MASK).any(0).all()


def test_span_mask_short_sentences_get_shorter_spans():
    # p tiny: the drawn length is the cap (5) but for a chance of ~1e-6 per draw; 1-, 2- and
    # 3-word sentences get spans of 1, 2 and 3 tokens.
    ids, mask, special = make_batch([1, 2, 3] * 50 + [10] * 50, seed=6)
    out = span_mask(ids, mask, special, MASK, p=1e-6, cap=5, generator=torch.Generator().manual_seed(0))
    counts = (out != ids).sum(1)
    assert counts[0:150:3].eq(1).all() and counts[1:150:3].eq(2).all() and counts[2:150:3].eq(3).all()
    assert counts[150:].eq(5).all()


def test_span_mask_cap_zero_masks_nothing():
    ids, mask, special = make_batch([3, 7, 12], seed=7)
    out = span_mask(ids, mask, special, MASK, p=0.3, cap=0, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, ids) and out is not ids


def test_span_mask_nothing_maskable():
    # A sentence of only [CLS] [SEP] (empty text) and a fully special row stay untouched.
    ids = torch.tensor([[CLS, SEP, PAD, PAD], [CLS, 1500, 1600, SEP]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    special = torch.isin(ids, SPECIAL) | (mask == 0)
    out = span_mask(ids, mask, special, MASK, p=0.3, cap=5, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out[0], ids[0])
    assert (out[1] == MASK).sum() in (1, 2) and out[1, 0] == CLS and out[1, 3] == SEP


def test_span_mask_respects_special_tokens_mask_with_real_tokenizer(tmp_path):
    from transformers import BertTokenizerFast
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "dog", "runs", "in", "the", "park", "."]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(vocab=str(tmp_path / "vocab.txt"))
    enc = tok(["a dog runs in the park .", "a dog", "the park"], padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    special = torch.isin(ids, torch.tensor(tok.all_special_ids)) | (mask == 0)
    for seed in range(30):
        out = span_mask(ids, mask, special, tok.mask_token_id, p=0.3, cap=5, generator=torch.Generator().manual_seed(seed))
        changed = out != ids
        assert not changed[special].any()
        assert (changed.sum(1) >= 1).all()
        assert torch.equal(out[:, 0], ids[:, 0])  # [CLS]


# ---- InfoNCE -------------------------------------------------------------------------------------
def reference_info_nce(anchors, positives, temperature):
    """Plain loops: for anchor i the candidates are every positive j and every anchor j != i;
    loss_i = -log softmax over those candidates at the positive i; mean over i."""
    b = anchors.shape[0]

    def cos(x, y):
        return (x * y).sum() / (x.norm() * y.norm())

    losses, counts = [], []
    for i in range(b):
        candidates = []  # (score, is_target)
        for j in range(b):
            candidates.append((cos(anchors[i], positives[j]) / temperature, i == j))
        for j in range(b):
            if j != i:
                candidates.append((cos(anchors[i], anchors[j]) / temperature, False))
        counts.append(len(candidates))
        target = [s for s, t in candidates if t]
        assert len(target) == 1
        log_denominator = torch.logsumexp(torch.stack([s for s, _ in candidates]), dim=0)
        losses.append(log_denominator - target[0])
    return torch.stack(losses).mean(), counts


@pytest.mark.parametrize("b,d,temperature", [(2, 5, 0.05), (5, 8, 0.05), (8, 16, 0.5), (3, 4, 1.0)])
def test_info_nce_matches_loop_reference(b, d, temperature):
    g = torch.Generator().manual_seed(b * 100 + d)
    anchors = torch.randn(b, d, generator=g, dtype=torch.float64)
    positives = anchors + 0.5 * torch.randn(b, d, generator=g, dtype=torch.float64)
    expected, counts = reference_info_nce(anchors, positives, temperature)
    assert counts == [2 * b - 1] * b
    loss = InfoNCE(temperature=temperature)(anchors, positives)
    assert loss.dim() == 0 and loss.dtype == torch.float32
    assert float(loss) == pytest.approx(float(expected), rel=1e-5, abs=1e-5)


def test_info_nce_candidate_count_and_logits():
    b, d, tau = 6, 10, 0.05
    g = torch.Generator().manual_seed(0)
    a, p = torch.randn(b, d, generator=g), torch.randn(b, d, generator=g)
    logits, targets = InfoNCE(temperature=tau).logits_and_targets(a, p)
    assert logits.shape == (b, 2 * b)
    assert torch.isfinite(logits).sum(1).tolist() == [2 * b - 1] * b  # the anchor itself is excluded
    assert torch.equal(targets, torch.arange(b))
    an, pn = torch.nn.functional.normalize(a, dim=-1), torch.nn.functional.normalize(p, dim=-1)
    for i in range(b):
        # abs: a cosine near 0 loses its relative precision to float32 rounding (CPU-dependent)
        assert float(logits[i, i]) == pytest.approx(float(an[i] @ pn[i]) / tau, rel=1e-5, abs=1e-5)
        assert logits[i, b + i] == float("-inf")


def test_info_nce_gradient_matches_reference():
    b, d, tau = 5, 7, 0.1
    g = torch.Generator().manual_seed(3)
    a0 = torch.randn(b, d, generator=g, dtype=torch.float64)
    p0 = a0 + torch.randn(b, d, generator=g, dtype=torch.float64)
    a, p = a0.clone().requires_grad_(), p0.clone().requires_grad_()
    InfoNCE(temperature=tau)(a, p).backward()
    ra, rp = a0.clone().requires_grad_(), p0.clone().requires_grad_()
    reference_info_nce(ra, rp, tau)[0].backward()
    assert a.grad is not None and p.grad is not None
    torch.testing.assert_close(a.grad, ra.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(p.grad, rp.grad, rtol=1e-4, atol=1e-6)
    assert p.grad.abs().sum() > 0 and a.grad.abs().sum() > 0


def test_info_nce_scale_invariant_and_prefers_aligned_pairs():
    g = torch.Generator().manual_seed(4)
    a = torch.randn(8, 12, generator=g)
    loss = InfoNCE(0.05)
    # Cosine similarity: rescaling the rows changes nothing.
    assert float(loss(a * 3.0, a * 0.5 + 0)) == pytest.approx(float(loss(a, a)), rel=1e-5)
    # Identical views score lower than unrelated ones.
    assert float(loss(a, a)) < float(loss(a, torch.randn(8, 12, generator=g)))


def test_info_nce_is_float32_under_autocast():
    g = torch.Generator().manual_seed(5)
    a, p = torch.randn(8, 64, generator=g), torch.randn(8, 64, generator=g)
    loss = InfoNCE(0.05)
    expected = loss(a, p)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, _ = loss.logits_and_targets(a.bfloat16().float(), p)
        got = loss(a, p)
    assert logits.dtype == torch.float32 and got.dtype == torch.float32
    assert float(got) == pytest.approx(float(expected), rel=1e-6)
