"""Each pretraining objective against an independent implementation, on the tiny BERT and one batch:
the loss, and its gradient with respect to the embeddings (or parameters), within 1e-5.

- published SimCSE (b candidates) = sentence-transformers' MultipleNegativesRankingLoss;
- published Mirror-BERT (NT-Xent over the 2b views) = pytorch-metric-learning's NTXentLoss;
- the report's InfoNCE (2b - 1 candidates) = the report's formula written out, and MNRL with its
  query_to_query direction;
- Contrastive Tension = sentence-transformers' ContrastiveTensionLoss;
- TSDAE = sentence-transformers' DenoisingAutoEncoderLoss (decoder tied to the encoder), same
  deleted input, same cross-attention and head weights;
- MLM = transformers' BertForMaskedLM on the same labels, and the 80/10/10 draw against
  DataCollatorForLanguageModeling's;
- the Glow blocks (ActNorm, LU linear, additive coupling) = normflows' blocks with the same weights;
- BSL = the BSL paper's loss written out (online predictor, EMA target, symmetric).

Random choices are shared: dropout is off and the objectives' views are the embeddings compared.
"""
from __future__ import annotations

import math

import pytest
import torch
from helpers import batch, load, random_batch

from bertcf.models.flow import ActNorm, AdditiveCoupling, InvertibleLinear
from bertcf.objectives import BSL, TSDAE, ContrastiveTension, MaskedLM, Mirror, SimCSE
from bertcf.objectives.base import IGNORE_INDEX
from bertcf.objectives.contrastive import InfoNCE

TAU = 0.05


class Captured:
    """Wraps a function returning embeddings: keeps each output (with its gradient retained), so a
    test can rerun the loss on the very embeddings the objective computed."""

    def __init__(self, fn):
        self.fn, self.outputs = fn, []

    def __call__(self, *a, **kw):
        out = self.fn(*a, **kw)
        out.retain_grad()
        self.outputs.append(out)
        return out


def objective_views(objective, batch_):
    """(our loss, u [2b, D] the embeddings it was computed from, the loss's gradient on them)."""
    capture = Captured(objective.embed)
    objective.embed = capture
    loss, _ = objective.loss(*batch_)
    loss.backward()
    (u,) = capture.outputs
    return loss, u.detach(), u.grad


def loss_then_rewind(objective, enc):
    """(our loss on ``batch(enc)``, its gradient taken; the batch), with the objective's generator
    rewound so that the test draws the same random choices (deletions, masked positions) again."""
    ids, mask, special = batch(enc)
    state = objective.generator.get_state()
    loss, _ = objective.loss(ids, mask, special)
    loss.backward()
    objective.generator.set_state(state)
    return loss, (ids, mask, special)


def same(ours, theirs, atol=1e-5):
    assert torch.allclose(ours, theirs, atol=atol, rtol=1e-5), (ours - theirs).abs().max()


def reference_gradient(loss_fn, u):
    u = u.clone().requires_grad_(True)
    loss = loss_fn(u)
    loss.backward()
    return loss.detach(), u.grad


# ---- the contrastive losses ---------------------------------------------------------------------------
def test_published_simcse_is_multiple_negatives_ranking_loss(tiny_bert_dir):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.util import cos_sim

    enc = load(tiny_bert_dir)
    objective = SimCSE(enc, negatives="simcse", temperature=TAU, generator=torch.Generator().manual_seed(0))
    loss, u, grad = objective_views(objective, batch(enc))
    mnrl = MultipleNegativesRankingLoss(None, scale=1 / TAU, similarity_fct=cos_sim)
    theirs, their_grad = reference_gradient(lambda v: mnrl.compute_loss_from_embeddings(list(v.chunk(2)), None), u)
    same(loss.detach(), theirs)
    same(grad, their_grad)


def test_published_mirror_bert_is_pytorch_metric_learning_nt_xent(tiny_bert_dir):
    NTXentLoss = pytest.importorskip("pytorch_metric_learning.losses", reason="pip install -e '.[test]'").NTXentLoss

    enc = load(tiny_bert_dir)
    objective = Mirror(enc, negatives="ntxent", temperature=0.04, generator=torch.Generator().manual_seed(0))
    loss, u, grad = objective_views(objective, batch(enc))
    b = u.shape[0] // 2
    labels = torch.arange(b).repeat(2)  # view i and view b + i are one sentence's
    theirs, their_grad = reference_gradient(lambda v: NTXentLoss(temperature=0.04)(v, labels), u)
    same(loss.detach(), theirs)
    same(grad, their_grad)


def report_info_nce(v: torch.Tensor, tau: float) -> torch.Tensor:
    """The report's section 3, term by term: for anchor z_i = f(x_i) and positive z'_i = f(x'_i),
    l_i = -log( e^{sim(z_i, z'_i)/tau} / (sum_j e^{sim(z_i, z'_j)/tau} + sum_{j != i} e^{sim(z_i, z_j)/tau}) ),
    sim the cosine, the loss the mean over the b anchors."""
    z, zp = v.chunk(2)
    b = z.shape[0]

    def sim(x, y):
        return (x @ y) / (x.norm() * y.norm())
    terms = []
    for i in range(b):
        denominator = sum(torch.exp(sim(z[i], zp[j]) / tau) for j in range(b))
        denominator = denominator + sum(torch.exp(sim(z[i], z[j]) / tau) for j in range(b) if j != i)
        terms.append(-torch.log(torch.exp(sim(z[i], zp[i]) / tau) / denominator))
    return torch.stack(terms).mean()


def test_the_reports_info_nce_is_its_formula_and_mnrl_with_anchors_as_negatives(tiny_bert_dir):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.util import cos_sim

    enc = load(tiny_bert_dir)
    objective = Mirror(enc, temperature=TAU, generator=torch.Generator().manual_seed(0))  # --negatives report
    loss, u, grad = objective_views(objective, batch(enc))
    u64 = u.double()
    by_hand, hand_grad = reference_gradient(lambda v: report_info_nce(v, TAU), u64)
    same(loss.detach().double(), by_hand)
    same(grad.double(), hand_grad)
    mnrl = MultipleNegativesRankingLoss(None, scale=1 / TAU, similarity_fct=cos_sim,
                                        directions=("query_to_doc", "query_to_query"))
    theirs, their_grad = reference_gradient(lambda v: mnrl.compute_loss_from_embeddings(list(v.chunk(2)), None), u)
    same(loss.detach(), theirs)
    same(grad, their_grad)


def test_the_three_variants_differ(tiny_bert_dir):
    """A check that the comparisons above can fail: each variant is a different loss."""
    torch.manual_seed(0)
    a, p = torch.randn(6, 8), torch.randn(6, 8)
    values = {n: InfoNCE(TAU, negatives=n)(a, p).item() for n in ("report", "simcse", "ntxent")}
    assert len({round(v, 4) for v in values.values()}) == 3, values


# ---- Contrastive Tension ---------------------------------------------------------------------------------
def test_contrastive_tension_is_sentence_transformers_loss(tiny_bert_dir, monkeypatch):
    """Ours averages the BCE over the b pairs, sentence-transformers' sums it: ours x b = theirs."""
    from sentence_transformers.sentence_transformer.losses import ContrastiveTensionLoss

    from bertcf.objectives import ct

    enc = load(tiny_bert_dir)
    objective = ContrastiveTension(enc, generator=torch.Generator().manual_seed(0))
    kept, second = Captured(objective.embed), Captured(ct.pooled)  # pooled: the second encoder's vectors
    objective.embed = kept
    monkeypatch.setattr(ct, "pooled", second)
    ids, mask, special = batch(enc)
    partner, labels = objective.pairs(ids.shape[0])
    objective.generator.manual_seed(0)  # the same pairs again, inside the loss
    loss, _ = objective.loss(ids, mask, special)
    loss.backward()
    (a,), (b,) = kept.outputs, second.outputs

    class Fixed(torch.nn.Module):  # sentence-transformers' two models, giving the embeddings ours computed
        def __init__(self, embedding):
            super().__init__()
            self.embedding = embedding

        def forward(self, features):
            return {"sentence_embedding": self.embedding}
    reference = ContrastiveTensionLoss(Fixed(None))
    a2, b2 = a.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True)
    reference.model1, reference.model2 = Fixed(b2), Fixed(a2)  # model2 is the one kept, as our encoder
    theirs = reference([{}, {}], labels)
    theirs.backward()
    n = ids.shape[0]
    same(loss.detach() * n, theirs.detach())
    same(a.grad * n, a2.grad)
    same(b.grad * n, b2.grad)
    assert labels.sum() == math.ceil(n / 8)  # one positive pair in 8


# ---- TSDAE ----------------------------------------------------------------------------------------------
def test_tsdae_is_sentence_transformers_denoising_auto_encoder_loss(tiny_bert_dir):
    """On the same deleted input: our decoder (the encoder's BERT run causally, tied, with
    cross-attention to the sentence vector, BERT's LM head) gives DenoisingAutoEncoderLoss's loss,
    with the cross-attention and head weights copied into its decoder, and the same gradient on
    the word embeddings, which encoder, decoder and head share in both."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import DenoisingAutoEncoderLoss
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    enc = load(tiny_bert_dir)
    objective = TSDAE(enc, deletion_ratio=0.5, generator=torch.Generator().manual_seed(2)).eval()
    with torch.no_grad():  # a head and cross-attention that are not at their initial values
        for p in objective.decoder.parameters():
            p.add_(0.05 * torch.randn_like(p))
    loss, (ids, mask, special) = loss_then_rewind(objective, enc)
    damaged, damaged_mask = objective.delete(ids, mask, special)

    transformer = Transformer(str(tiny_bert_dir))
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")],
                                device="cpu").eval()
    reference = DenoisingAutoEncoderLoss(model, tie_encoder_decoder=True).eval()
    decoder = reference.decoder
    ours = {f"bert.encoder.layer.{i}.crossattention.{k}": v for i, cross in enumerate(objective.decoder.cross)
            for k, v in cross.state_dict().items()}
    ours |= {f"cls.predictions.{k}": v for k, v in objective.decoder.head.state_dict().items()}
    theirs = dict(decoder.named_parameters())
    assert set(ours) <= set(theirs), set(ours) - set(theirs)
    with torch.no_grad():
        for k, v in ours.items():
            theirs[k].copy_(v)
    their_loss = reference([{"input_ids": damaged, "attention_mask": damaged_mask},
                            {"input_ids": ids, "attention_mask": mask}], None)
    their_loss.backward()
    same(loss.detach(), their_loss.detach())
    words = decoder.bert.embeddings.word_embeddings.weight  # the encoder's too (tied)
    assert words is model[0].auto_model.embeddings.word_embeddings.weight
    same(enc.bert.embeddings.word_embeddings.weight.grad, words.grad)


# ---- MLM ------------------------------------------------------------------------------------------------
def test_mlm_is_bert_for_masked_lm_loss_and_gradient(mlm_dir):
    """Our loss = BertForMaskedLM's loss on the same inputs and labels (its head initialised from
    the same checkpoint), and the gradient on the word embeddings (tied to the output layer) agrees."""
    import transformers

    enc = load(mlm_dir)
    objective = MaskedLM(enc, checkpoint=str(mlm_dir), generator=torch.Generator().manual_seed(4))
    loss, (ids, mask, special) = loss_then_rewind(objective, enc)
    inputs, labels = objective.mask_tokens(ids, mask, special)
    hf = transformers.BertForMaskedLM.from_pretrained(str(mlm_dir)).eval()
    theirs = hf(input_ids=inputs, attention_mask=mask, labels=labels).loss
    theirs.backward()
    same(loss.detach(), theirs.detach())
    ours_grad = enc.bert.embeddings.word_embeddings.weight.grad
    same(ours_grad, hf.bert.embeddings.word_embeddings.weight.grad)


def test_mlm_masking_matches_data_collator_for_language_modeling(tiny_bert_dir):
    """The 80/10/10 draw: the share of tokens selected, and of the selected ones turned into
    [MASK], a random token, or kept, agree with transformers' collator within 4 standard errors."""
    import transformers

    enc = load(tiny_bert_dir)
    objective = MaskedLM(enc, generator=torch.Generator().manual_seed(0))
    ids, mask, special = random_batch(enc.bert.config.vocab_size, b=1500, t=48)
    ours = objective.mask_tokens(ids, mask, special)
    tokenizer = transformers.BertTokenizerFast.from_pretrained(str(tiny_bert_dir))
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    torch.manual_seed(0)
    theirs = collator.torch_mask_tokens(ids.clone(), special_tokens_mask=special.clone())

    def shares(inputs, labels):
        selected = labels != IGNORE_INDEX
        n = int(selected.sum())
        masked = (inputs[selected] == tokenizer.mask_token_id).sum() / n
        kept = (inputs[selected] == ids[selected]).sum() / n
        return {"selected": (n / (mask.bool() & ~special).sum(), n_real), "masked": (masked, n),
                "kept": (kept, n), "random": (1 - masked - kept, n)}
    n_real = int((mask.bool() & ~special).sum())
    a, b = shares(*ours), shares(*theirs)
    for key in a:
        (pa, na), (pb, nb) = a[key], b[key]
        se = math.sqrt(float(pa) * (1 - float(pa)) / na + float(pb) * (1 - float(pb)) / nb)
        assert abs(float(pa) - float(pb)) < 4 * se, (key, float(pa), float(pb))
    assert abs(float(a["selected"][0]) - 0.15) < 0.01 and abs(float(a["masked"][0]) - 0.8) < 0.02


# ---- Glow's blocks --------------------------------------------------------------------------------------
def test_glow_blocks_are_normflows_blocks():
    """ActNorm, the LU linear map and additive coupling against normflows' with the same weights:
    outputs and log-determinants (normflows' forward is our direction for all three)."""
    nf = pytest.importorskip("normflows", reason="pip install -e '.[test]'")
    from normflows.flows.mixing import _LULinear

    torch.manual_seed(0)
    d, u = 6, torch.randn(16, 6)
    ours = ActNorm(d)
    with torch.no_grad():
        ours.bias.copy_(torch.randn(d))
        ours.log_scale.copy_(0.3 * torch.randn(d))
    ours.initialized.fill_(True)
    theirs = nf.flows.ActNorm((d,))
    with torch.no_grad():  # z = (u + b) e^s = u e^s + b e^s
        theirs.s.copy_(ours.log_scale[None])
        theirs.t.copy_((ours.bias * ours.log_scale.exp())[None])
    theirs.data_dep_init_done = torch.tensor(1.0)
    (z, logdet), (z2, logdet2) = ours(u), theirs(u)
    same(z, z2)
    same(logdet, logdet2.expand(16))

    linear = InvertibleLinear(d)
    with torch.no_grad():
        linear.perm.copy_(torch.eye(d))  # normflows' _LULinear has no permutation; it is tested apart
        linear.sign_s.fill_(1.0)         # and a positive diagonal (softplus)
        linear.lower.add_(0.2 * torch.randn(d, d))
        linear.upper.add_(0.2 * torch.randn(d, d))
    lu = _LULinear(d)
    below, above = torch.tril_indices(d, d, -1), torch.triu_indices(d, d, 1)  # row by row, as normflows fills them
    with torch.no_grad():
        lu.lower_entries.copy_(linear.lower[below[0], below[1]])
        lu.upper_entries.copy_(linear.upper[above[0], above[1]])
        diagonal = linear.log_abs_s.exp()
        lu.unconstrained_upper_diag.copy_(torch.log(torch.expm1(diagonal - lu.eps)))
        lu.bias.zero_()
    (z, logdet), (z2, logdet2) = linear(u), lu(u)
    same(z, z2)
    same(logdet, logdet2)

    coupling = AdditiveCoupling(d, 8)
    with torch.no_grad():
        for p in coupling.net[-1].parameters():
            p.normal_(0, 0.3)
    coupling.eval()

    class Shift(torch.nn.Module):  # our shift network, as normflows' param_map
        def forward(self, x):
            return coupling.shift(x)
    (z1, z2_), logdet2 = nf.flows.AffineCoupling(Shift(), scale=False)([u[:, :3], u[:, 3:]])
    z, logdet = coupling(u)
    same(z, torch.cat([z1, z2_], dim=1))
    same(logdet, logdet2)


# ---- BSL -------------------------------------------------------------------------------------------------
def test_bsl_is_the_papers_loss_written_out(tiny_bert_dir):
    """BSL (Zhang et al. 2021, eq. 1-3): the online branch's predictor q(f(v)) regressed on the
    stop-gradient EMA target f_xi of the other view, both ways: L = ||q̄(f(v1)) - f̄_xi(v2)||^2 +
    ||q̄(f(v2)) - f̄_xi(v1)||^2 on unit vectors, averaged over the batch; then xi <- m xi + (1 - m) theta."""
    enc = load(tiny_bert_dir)
    objective = BSL(enc, momentum=0.9, generator=torch.Generator().manual_seed(0)).eval()
    with torch.no_grad():  # a target that differs from the online encoder
        for p in objective.target.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ids, mask, special = batch(enc)
    state = objective.generator.get_state()
    loss, _ = objective.loss(ids, mask, special)

    objective.generator.set_state(state)
    masked = objective.views(ids, mask, special)

    def embed(model, x):
        h = model(x, mask)["last_hidden_state"]
        m = mask[..., None].float()
        return (h * m).sum(1) / m.sum(1)
    o1, o2 = embed(enc.bert, ids), embed(enc.bert, masked)
    with torch.no_grad():
        t1, t2 = embed(objective.target, ids), embed(objective.target, masked)
    q1, q2 = objective.predictor(o1), objective.predictor(o2)

    def unit(x):
        return x / x.norm(dim=-1, keepdim=True)
    expected = ((unit(q1) - unit(t2)).pow(2).sum(-1) + (unit(q2) - unit(t1)).pow(2).sum(-1)).mean()
    same(loss.detach(), expected.detach())
    target = [p.detach().clone() for p in objective.target.parameters()]
    objective.after_step()
    for before, now, online in zip(target, objective.target.parameters(), enc.bert.parameters()):
        same(now, 0.9 * before + 0.1 * online.detach())
