"""--mini-batch-size, the gradient cache of the in-batch objectives (bertcf/objectives/cache.py).

- Every objective it applies to (mirror and simcse with each --negatives, character spans and
  SimCSE's MLP head; the joint stage frozen and with --unfreeze-encoder; the flow stage; BSL; CT;
  supervised SimCSE with its hard negatives),
  with dropout on: the cached step's loss and every parameter's gradient equal the uncached step's
  on the same chunks within 1e-5, and the step leaves torch's generator and the objective's where
  the uncached step does. ("The same chunks": dropout draws its masks for the tensor it drops, so a
  forward pass of 5 rows draws other masks than one of 12; the reference embeds the same chunks
  with their graphs kept, and draws exactly what the cache's first passes draw.) Without the
  replay of the generator's state the gradients differ: the comparison can fail.
- With dropout off, the cached step equals the plain step (the whole batch in one pass).
- sentence-transformers' CachedMultipleNegativesRankingLoss on the same batch and mini-batch size
  (the SimCSE variant with b candidates: MNRL at scale 1/tau; the report's 2b - 1: with its
  query_to_query direction): the same loss and encoder gradients.
- The chunks' second passes run one at a time, last first, each one's backward done before the
  next chunk is embedded again (what bounds the memory).
- Under bf16 autocast the cached step equals the uncached one on the same chunks; so does it with
  the encoder's layers compiled (slow).
- 20 steps of run_pretrain.py with --mini-batch-size reach the uncached run's weights (dropout off),
  and the chunked run's with dropout on; a cached run resumed half way ends bit-identical.
- --mini-batch-size for tsdae/mlm, or 0, is one line and exit status 2.
(Under torchrun: tests/training/test_distributed.py.)
"""
from __future__ import annotations

import pytest
import torch
from helpers import (
    CONTRADICTED,
    ENTAILED,
    PREMISES,
    assert_one_error_line,
    base_args,
    batch,
    exit_status,
    load,
    make_objective,
    run_quiet,
    stacked,
    tensors,
)
from helpers import OBJECTIVE_SENTENCES as SENTENCES

from bertcf.objectives import Objective, cache
from bertcf.objectives.contrastive import span_mask
from bertcf.utils.precision import autocast

M = 5  # 6 sentences: 12 views in chunks of 5, 5, 2; 6 rows in 5, 1
TAU = 0.05

#: name -> (stage, method, settings)
CASES = {
    "mirror": ("mirror", "mirror", {}),
    "mirror-ntxent": ("mirror", "mirror", dict(negatives="ntxent", temperature=0.04)),
    "mirror-simcse-negatives": ("mirror", "mirror", dict(negatives="simcse")),
    "mirror-char-span": ("mirror", "mirror", dict(span_unit="char", span_chars=5, negatives="ntxent")),
    "simcse": ("mirror", "simcse", {}),
    "simcse-ntxent": ("mirror", "simcse", dict(negatives="ntxent")),
    "simcse-published": ("mirror", "simcse", dict(negatives="simcse", pooling="cls-mlp")),
    "joint": ("joint", "mirror", {}),
    "joint-simcse": ("joint", "simcse", dict(span_cap=0)),
    "joint-unfrozen": ("joint", "mirror", dict(unfreeze_encoder=True)),
    "flow": ("flow", "flow", {}),
    "bsl": ("mirror", "bsl", dict(predictor_k=1)),
    "ct": ("mirror", "ct", dict(ct_negatives=1)),
}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: one intra-op thread


def build(bert_dir, case, dropout=0.1, mini_batch_size=None):
    """The objective of CASES[case] on the tiny BERT, its modules initialised alike every time."""
    stage, method, settings = CASES[case]
    torch.manual_seed(0)  # MLP head, flow, predictor
    settings = dict(settings, mini_batch_size=mini_batch_size, max_length=32)
    return make_objective(stage, method, load(bert_dir, dropout), torch.Generator().manual_seed(0), **settings).train()


def chunked_with_graph(objective, size):
    """The uncached step on the cache's chunks: ``embed_rows`` embeds the same chunks one after
    another with their graphs kept (no cache, no replay)."""
    plain = objective.embed_rows

    def embed_rows(embed, ids, mask, trainable=True):
        if ids.shape[0] <= size:
            return plain(embed, ids, mask, trainable)
        return torch.cat([plain(embed, i, m, trainable) for i, m in cache.row_chunks(ids, mask, size)])
    objective.embed_rows = embed_rows
    return objective


def step(objective, seed=5):
    """One step's loss, every parameter's gradient, and the generators' states after it."""
    torch.manual_seed(seed)  # dropout's stream
    ids, mask, special = batch(objective.encoder)
    texts = {"texts": list(SENTENCES)} if objective.needs_text else {}
    loss, _ = objective(ids, mask, special, **texts)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in objective.named_parameters() if p.grad is not None}
    return loss.detach(), grads, torch.get_rng_state(), objective.generator.get_state()


def assert_same_step(ours, theirs, atol=1e-5):
    (loss, grads, rng, gen), (loss2, grads2, rng2, gen2) = ours, theirs
    torch.testing.assert_close(loss, loss2, rtol=0, atol=atol)
    assert grads.keys() == grads2.keys()
    for k in grads:
        torch.testing.assert_close(grads[k], grads2[k], rtol=0, atol=atol, msg=k)
    assert torch.equal(rng, rng2), "the step left torch's generator elsewhere"
    assert torch.equal(gen, gen2), "the step drew other host-side random choices"


@pytest.mark.parametrize("case", list(CASES))
def test_cached_step_equals_the_uncached_step_with_dropout_on(tiny_bert_dir, case):
    cached = step(build(tiny_bert_dir, case, mini_batch_size=M))
    reference = step(chunked_with_graph(build(tiny_bert_dir, case), M))
    assert_same_step(cached, reference)
    encoder_grads = [g for k, g in cached[1].items() if k.startswith("encoder.bert.")]
    if case.startswith(("joint", "flow")) and case != "joint-unfrozen":
        assert not encoder_grads  # the frozen encoder: nothing to cache, only its chunks
    else:
        assert encoder_grads and all(torch.isfinite(g).all() for g in encoder_grads)
        assert max(g.abs().max() for g in encoder_grads) > 1e-4


@pytest.mark.parametrize("case", ["mirror", "simcse-published", "bsl", "joint-unfrozen"])
def test_without_the_replayed_random_state_the_gradient_differs(tiny_bert_dir, case, monkeypatch):
    """The check above can fail: a second pass that draws new dropout masks gives other gradients."""
    reference = step(chunked_with_graph(build(tiny_bert_dir, case), M))
    checkpoint = cache.checkpoint
    monkeypatch.setattr(cache, "checkpoint", lambda *a, **kw: checkpoint(*a, **(kw | {"preserve_rng_state": False})))
    _, grads, _, _ = step(build(tiny_bert_dir, case, mini_batch_size=M))
    key = "encoder.bert.encoder.layer.0.output.dense.weight"
    assert not torch.allclose(grads[key], reference[1][key], atol=1e-4)


@pytest.mark.parametrize("case", list(CASES))
def test_cached_step_equals_the_whole_batch_in_one_pass_with_dropout_off(tiny_bert_dir, case):
    cached = step(build(tiny_bert_dir, case, dropout=0.0, mini_batch_size=M))
    plain = step(build(tiny_bert_dir, case, dropout=0.0))
    assert_same_step(cached, plain)


def test_a_mini_batch_as_large_as_the_batch_changes_nothing(tiny_bert_dir):
    ours = step(build(tiny_bert_dir, "mirror", mini_batch_size=12))
    plain = step(build(tiny_bert_dir, "mirror"))
    assert_same_step(ours, plain, atol=0)


def test_row_chunks_cut_each_chunk_after_its_last_real_token():
    ids = torch.arange(1, 13).reshape(4, 3)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]])
    chunks = cache.row_chunks(ids * mask, mask, 2)
    assert [tuple(i.shape) for i, _ in chunks] == [(2, 3), (2, 2)]
    assert torch.equal(chunks[1][0], torch.tensor([[7, 0], [10, 11]]))
    assert torch.equal(torch.cat([m for _, m in cache.row_chunks(ids, mask, 3)][:1]), mask[:3])


# ---- against sentence-transformers' GradCache ---------------------------------------------------------
@pytest.mark.parametrize("negatives", ["simcse", "report"])
def test_equals_sentence_transformers_cached_mnrl(tiny_bert_dir, negatives):
    """Mirror-BERT's two views (the sentence, its span-masked copy) through our cached objective and
    through CachedMultipleNegativesRankingLoss over the same BERT's weights (a Transformer and mean
    Pooling), mini-batches of M, dropout off (the two BERTs draw dropout masks differently): the
    loss and every encoder parameter's gradient agree within 1e-5."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from sentence_transformers.util import cos_sim

    objective = make_objective("mirror", "mirror", load(tiny_bert_dir), torch.Generator().manual_seed(0),
                               negatives=negatives, temperature=TAU, mini_batch_size=M).train()
    ids, mask, special = batch(objective.encoder)
    state = objective.generator.get_state()
    loss, _ = objective(ids, mask, special)
    loss.backward()
    objective.generator.set_state(state)  # the same span masks again
    masked = span_mask(ids, mask, special, objective.mask_token_id, objective.span_p, objective.span_cap,
                       objective.generator)

    transformer = Transformer(str(tiny_bert_dir))
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")],
                                device="cpu").eval()  # dropout off
    directions = ("query_to_doc",) + (("query_to_query",) if negatives == "report" else ())
    reference = CachedMultipleNegativesRankingLoss(model, scale=1 / TAU, similarity_fct=cos_sim, mini_batch_size=M,
                                                   directions=directions)
    bert = transformer.auto_model
    features = [{"input_ids": x, "attention_mask": mask, "token_type_ids": torch.zeros_like(x)} for x in (ids, masked)]
    theirs = reference(features, None)
    theirs.backward()
    torch.testing.assert_close(loss.detach(), theirs.detach(), rtol=0, atol=1e-5)
    their_grads = {k: p.grad for k, p in bert.named_parameters() if p.grad is not None}
    ours = {k.removeprefix("encoder.bert."): p.grad for k, p in objective.named_parameters() if p.grad is not None}
    assert ours.keys() == their_grads.keys()
    for k in ours:
        torch.testing.assert_close(ours[k], their_grads[k], rtol=0, atol=1e-5, msg=k)


# ---- one chunk at a time ----------------------------------------------------------------------------
def test_the_second_passes_run_one_chunk_at_a_time_last_first(tiny_bert_dir):
    """Events: a chunk's pass through the encoder ("embed", the chunk) and its backward reaching the
    bottom of the encoder ("backward", the chunk). The first passes run in order; the last chunk
    kept its activations and its backward runs first; then each chunk is embedded again only
    after the previous one's backward is done, so one chunk's activations are alive at a time."""
    objective = build(tiny_bert_dir, "mirror", mini_batch_size=M)
    events, chunk = [], None
    original = objective.encoder.embed

    def embed(ids, mask, token_type_ids=None, num_tokens=None):
        nonlocal chunk
        chunk = int(ids.sum())  # names the chunk
        events.append(("embed", chunk))
        return original(ids, mask, token_type_ids, num_tokens)
    objective.encoder.embed = embed

    def bottom_reached(module, inputs, output):
        if output.requires_grad and torch.is_grad_enabled():
            label = chunk
            output.register_hook(lambda grad: events.append(("backward", label)))
    objective.encoder.bert.embeddings.register_forward_hook(bottom_reached)
    ids, mask, special = batch(objective.encoder)
    loss, _ = objective(ids, mask, special)
    first, second, last = (c for _, c in events)
    assert len(events) == 3 and len({first, second, last}) == 3
    loss.backward()
    assert events[3:] == [("backward", last), ("embed", second), ("backward", second), ("embed", first),
                          ("backward", first)]


# ---- bf16 autocast ------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["mirror", "simcse-published", "joint-unfrozen"])
def test_cached_step_under_bf16_autocast(tiny_bert_dir, case):
    """The second pass runs under the autocast state of the first (bf16 matrix work), so the cached
    step equals the uncached one on the same chunks under autocast too."""
    def bf16_step(objective):
        with autocast("cpu", "bf16"):
            torch.manual_seed(5)
            ids, mask, special = batch(objective.encoder)
            loss, _ = objective(ids, mask, special)
        loss.backward()
        return loss.detach(), {k: p.grad for k, p in objective.named_parameters() if p.grad is not None}
    seen = []
    objective = build(tiny_bert_dir, case, mini_batch_size=M)
    objective.encoder.bert.encoder.layer[0].intermediate.dense.register_forward_hook(
        lambda m, i, o: seen.append(o.dtype))
    loss, grads = bf16_step(objective)
    assert seen and set(seen) == {torch.bfloat16}  # first and second passes alike
    ref_loss, ref_grads = bf16_step(chunked_with_graph(build(tiny_bert_dir, case), M))
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for k in grads:
        torch.testing.assert_close(grads[k], ref_grads[k], rtol=1e-3, atol=1e-5, msg=k)


@pytest.mark.slow
def test_cached_step_with_compiled_layers(tiny_bert_dir):
    """--compile: the layers compiled (dynamo and AOTAutograd; the aot_eager backend spares the C++
    compilation of inductor), the second passes recompute them and the step equals the uncached one
    on the same chunks."""
    cached, reference = build(tiny_bert_dir, "mirror", mini_batch_size=M), build(tiny_bert_dir, "mirror")
    for objective in (cached, reference):
        objective.encoder.bert.compile_layers(backend="aot_eager")
    assert_same_step(step(cached), step(chunked_with_graph(reference, M)))


# ---- run_pretrain.py ---------------------------------------------------------------------------------
RUN = dict(steps=20, batch_size=8, eval_every=10, lr=1e-3, log_every=5)


def assert_close_weights(ours: dict, theirs: dict, lr: float, steps: int):
    assert ours.keys() == theirs.keys()
    for k in theirs:
        # A key bias gets a zero gradient in exact arithmetic (softmax ignores a shift of every
        # score): its gradient is float noise, which Adam turns into steps of ~lr (as under torchrun).
        atol = steps * lr if k.endswith("attention.self.key.bias") else 1e-5
        torch.testing.assert_close(ours[k].double(), theirs[k].double(), rtol=0, atol=atol, msg=k)


def test_a_20_step_run_reaches_the_uncached_runs_weights(tiny_bert_dir, data_dir, tmp_path):
    flags = dict(RUN, dropout=0)
    run_quiet(base_args(tiny_bert_dir, data_dir, tmp_path / "cached", mini_batch_size=3, **flags))
    run_quiet(base_args(tiny_bert_dir, data_dir, tmp_path / "plain", **flags))
    cached, plain = (tensors(tmp_path / d / "last" / "model.safetensors") for d in ("cached", "plain"))
    assert_close_weights(cached, plain, RUN["lr"], RUN["steps"])
    start = tensors(tiny_bert_dir / "model.safetensors")
    key = "encoder.layer.0.output.dense.weight"
    assert (cached[key] - start[key]).abs().max() > 1e-3  # the weights moved: the comparison compares


def test_a_20_step_run_with_dropout_equals_the_chunked_run_and_resumes(tiny_bert_dir, data_dir, tmp_path,
                                                                       monkeypatch):
    """Dropout on (0.1): 20 cached steps reach the weights of 20 uncached steps that embed the same
    chunks (each step's generator stream undisturbed by the replays, or step 2 on would draw other
    masks); and a cached run stopped at step 10 and resumed ends bit-identical to the straight one."""
    run_quiet(base_args(tiny_bert_dir, data_dir, tmp_path / "cached", mini_batch_size=3, **RUN))
    run_quiet(base_args(tiny_bert_dir, data_dir, tmp_path / "part", mini_batch_size=3, **(RUN | {"steps": 10})))
    run_quiet(["--resume", "--out-dir", str(tmp_path / "part"), "--steps", "20"])
    with monkeypatch.context() as patch:
        plain = Objective.embed_rows

        def chunked(self, embed, ids, mask, trainable=True):
            if ids.shape[0] <= 3:
                return plain(self, embed, ids, mask, trainable)
            return torch.cat([plain(self, embed, i, m, trainable) for i, m in cache.row_chunks(ids, mask, 3)])
        patch.setattr(Objective, "embed_rows", chunked)
        run_quiet(base_args(tiny_bert_dir, data_dir, tmp_path / "chunked", **RUN))
    cached, part, chunked = (tensors(tmp_path / d / "last" / "model.safetensors")
                             for d in ("cached", "part", "chunked"))
    assert_close_weights(cached, chunked, RUN["lr"], RUN["steps"])
    assert cached.keys() == part.keys() and all(torch.equal(cached[k], part[k]) for k in cached)


@pytest.mark.parametrize("flags,message", [
    (["--method", "tsdae", "--mini-batch-size", "4"], "--mini-batch-size is for the objectives"),
    (["--method", "mlm", "--mini-batch-size", "4"], "--mini-batch-size is for the objectives"),
    (["--mini-batch-size", "0"], "argument --mini-batch-size: must be at least 1, not 0"),
])
def test_mini_batch_size_where_it_does_not_apply_is_one_line(flags, message, tiny_bert_dir, data_dir, tmp_path,
                                                            capsys):
    assert exit_status(base_args(tiny_bert_dir, data_dir, tmp_path / "run") + flags) == 2
    assert_one_error_line(capsys, message)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("negatives,pooling", [("report", "mean"), ("simcse", "cls-mlp")])
def test_supervised_simcse_cached_step_equals_the_uncached_step(tiny_bert_dir, negatives, pooling):
    """Supervised SimCSE's three columns (anchor, entailment, contradiction) through the cache: its
    loss and gradients equal the uncached step's on the same chunks, with dropout on."""
    from bertcf.objectives import SupervisedSimCSE

    def build_sup(mini_batch_size=None):
        torch.manual_seed(0)
        encoder = load(tiny_bert_dir, 0.1)
        encoder.pooling = "cls" if pooling == "cls-mlp" else "mean"  # SimCSE's MLP reads [CLS]
        return SupervisedSimCSE(encoder, negatives=negatives, mlp=pooling == "cls-mlp", temperature=TAU,
                                mini_batch_size=mini_batch_size, generator=torch.Generator().manual_seed(0)).train()

    def sup_step(objective):
        torch.manual_seed(5)
        loss, _ = objective.loss(*stacked(objective.encoder, [PREMISES, ENTAILED, CONTRADICTED]))
        loss.backward()
        grads = {k: p.grad.clone() for k, p in objective.named_parameters() if p.grad is not None}
        return loss.detach(), grads, torch.get_rng_state(), objective.generator.get_state()

    cached = sup_step(build_sup(mini_batch_size=M))
    assert_same_step(cached, sup_step(chunked_with_graph(build_sup(), M)))
    assert max(g.abs().max() for k, g in cached[1].items() if k.startswith("encoder.bert.")) > 1e-4
