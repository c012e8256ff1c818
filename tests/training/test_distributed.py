"""Data-parallel training on the CPU: 2 gloo processes against 1 process on the global batch.

- InfoNCE with candidates gathered from every rank: the mean of the rank losses equals the
  single-process loss, and the gradient DDP would compute (each rank backpropagates its own
  loss; DDP averages over ranks) equals the single-process gradient.
- A DDP-wrapped tiny minBERT + InfoNCE training step (AdamW) gives the same weights as one
  process on the concatenated batch.
- Every objective of ``--method bsl|ct|tsdae|mlm``, DDP-wrapped and given the global batch with
  its rank's share (``loss(..., rank=r, world=w)``), gives one process's loss, gradients, weights
  (two SGD steps, BSL's EMA after each) and BatchNorm statistics on the global batch; so do those
  of them with ``--mini-batch-size`` (the gradient cache), against one process without it.
- The bf16 autocast path of ``bertcf.autocast`` runs a minBERT forward + backward.
- Each rank draws its own dropout masks (``distributed.seed_dropout``), and logged values are the
  mean over the ranks (``distributed.mean_over_ranks``).
- ``run_pretrain``'s main with a --batch-size the ranks cannot share stops on every rank with one
  UsageError. (``run_pretrain.py`` itself under torchrun: tests/training/test_pretrain.py, at the end.)

The two processes are spawned once for the module (one process-group start, ~2 s).
"""
from __future__ import annotations

import datetime
import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import make_objective, torchrun

from bertcf.commands import pretrain
from bertcf.errors import UsageError
from bertcf.models.encoder import SentenceEncoder, pool
from bertcf.objectives import OBJECTIVES
from bertcf.objectives.contrastive import InfoNCE
from bertcf.utils import distributed
from bertcf.utils.precision import autocast
from minbert import BertConfig, BertModel

WORLD = 2
CACHED = sorted(m for m, cls in OBJECTIVES.items() if cls.mini_batches)  # --mini-batch-size applies
B, D = 8, 16  # global batch of embeddings for the loss test
STEPS = 3     # DDP steps: a parameter without gradient breaks step 2 (or, with static_graph, step 3)
TINY = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def embeddings():
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, D, generator=g), torch.randn(B, D, generator=g)


def token_batches():
    """STEPS global batches of two views (ids, mask), [B, t] each, with padding."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        lengths = torch.randint(3, 10, (B,), generator=g)
        mask = (torch.arange(10)[None] < lengths[:, None]).long()
        ids = torch.randint(5, TINY["vocab_size"], (B, 10), generator=g) * mask
        masked = ids.clone()
        masked[:, 1] = 4  # a different second view
        out.append((ids, masked * mask, mask))
    return out


def make_model():
    torch.manual_seed(0)
    return BertModel(BertConfig(**TINY))


def train(model, batches, info_nce, slice_rows=lambda x: x, wrap=lambda m: m):
    """STEPS AdamW steps of the mirror loss; returns the loss and gradients of the first step
    (the weights after the last step are in ``model``)."""
    net = wrap(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    first = None
    for step, (ids, masked, mask) in enumerate(batches):
        ids, masked, mask = slice_rows(ids), slice_rows(masked), slice_rows(mask)
        opt.zero_grad(set_to_none=True)
        if step % 2 == 0:  # both views in one forward, as the mirror stage does
            both_mask = torch.cat([mask, mask])
            u, u_masked = pool(net(torch.cat([ids, masked]), both_mask)["last_hidden_state"], both_mask).chunk(2)
        else:  # two forwards before one backward (as multitask's three tasks do)
            u = pool(net(ids, mask)["last_hidden_state"], mask)
            u_masked = pool(net(masked, mask)["last_hidden_state"], mask)
        loss = info_nce(u, u_masked)
        loss.backward()
        if first is None:
            first = (loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
        opt.step()
    return first


def objective_batch():
    """A global batch of B sentences (ids, mask, special) as pretrain builds it: [CLS] = 2 and
    [SEP] = 3 around 1-7 words, right padding."""
    g = torch.Generator().manual_seed(2)
    lengths = torch.randint(3, 10, (B,), generator=g)
    mask = (torch.arange(10)[None] < lengths[:, None]).long()
    ids = torch.randint(5, TINY["vocab_size"], (B, 10), generator=g) * mask
    ids[:, 0] = 2
    ids[torch.arange(B), lengths - 1] = 3
    return ids, mask, (ids == 2) | (ids == 3) | (mask == 0)


def train_objective(method, rank=0, world=1, wrap=lambda m: m, mini_batch_size=None):
    """Two SGD steps of ``method`` on the global batch (rank ``rank``'s share of it) with a tiny
    minBERT (dropout 0: deterministic), with the gradient cache when ``mini_batch_size`` is given;
    returns the first step's loss and gradients and the final state dict. (SGD, not Adam: Adam would blow float noise in gradients that are zero in exact
    arithmetic, e.g. the bias before BSL's BatchNorm, up to steps of ~lr.)"""
    tokenizer = SimpleNamespace(mask_token_id=4, pad_token_id=0)  # all an objective asks of it
    encoder = SentenceEncoder(make_model(), tokenizer)
    torch.manual_seed(0)
    # Uneven counts of predicted tokens per rank; BSL's predictor at width D (k = 1): the published
    # 8D sums 8 times more float noise into the gradients than this test's tolerance allows.
    objective = make_objective("mirror", method, encoder, torch.Generator().manual_seed(0), mlm_probability=0.5,
                               predictor_k=1, mini_batch_size=mini_batch_size)
    net = wrap(objective)
    ids, mask, special = objective_batch()
    opt = torch.optim.SGD(objective.trainable_parameters(), lr=0.5)
    first = None
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        loss, _ = net(ids, mask, special, rank=rank, world=world)
        loss.backward()
        if first is None:
            first = (loss.detach(), {k: p.grad.clone() for k, p in objective.named_parameters() if p.grad is not None})
        opt.step()
        objective.after_step()
    return first, objective.state_dict()


def _worker(rank, init_file, out_dir):
    torch.set_num_threads(1)  # a spawned process starts at one thread per core: two ranks on 2 cores would fight
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    try:
        per = B // WORLD
        rows = slice(rank * per, (rank + 1) * per)
        result = {}

        # 1. InfoNCE: local anchors and positives, candidates gathered from both ranks.
        a, p = (x.clone().requires_grad_() for x in embeddings())
        loss = InfoNCE(temperature=0.05)(a[rows], p[rows])
        loss.backward()
        result["loss"] = loss.detach()
        result["grad_a"], result["grad_p"] = a.grad[rows].clone(), p.grad[rows].clone()

        # 2. DDP steps of a tiny minBERT (its pooler takes no part in the loss).
        model = make_model()
        first_loss, grads = train(model, token_batches(), InfoNCE(temperature=0.05),
                                  slice_rows=lambda x: x[rows], wrap=lambda m: distributed.wrap_ddp(m, "cpu"))
        result["ddp_first_loss"] = first_loss
        result["ddp_grads"] = grads
        result["ddp_weights"] = model.state_dict()

        # 3. The objectives of --stage mirror, DDP-wrapped as run_pretrain wraps them.
        for method in sorted(OBJECTIVES):
            result[method] = train_objective(method, rank, WORLD, wrap=lambda m: distributed.wrap_ddp(m, "cpu"))
        # ... and with the gradient cache: 4 local rows (8 views) in chunks of 3.
        for method in CACHED:
            result[f"{method} cached"] = train_objective(method, rank, WORLD, mini_batch_size=3,
                                                         wrap=lambda m: distributed.wrap_ddp(m, "cpu"))

        # 4. The dropout generator under torchrun: seeded per rank and step (Trainer.fit does this).
        torch.manual_seed(0)
        draws = []
        for step in (0, 1, 0):
            distributed.seed_dropout(11711, step)
            draws.append(torch.nn.functional.dropout(torch.ones(64), 0.5))
        result["dropout"] = draws
        result["logged"] = distributed.mean_over_ranks({"loss": torch.tensor(float(rank)), "x": 2.0}, "cpu")

        # 5. run_pretrain with a global batch the ranks cannot share: the same error on every rank.
        try:
            pretrain.run(["--batch-size", "5", "--device", "cpu", "--out-dir", os.path.join(out_dir, "odd")])
        except UsageError as e:
            result["odd_batch"] = str(e)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        distributed.cleanup_distributed()  # the run has left the group already


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """The results of the 2-process run (one dict per rank)."""
    tmp = tmp_path_factory.mktemp("dist")
    torch.set_num_threads(1)
    mp.spawn(_worker, args=(str(tmp / "store"), str(tmp)), nprocs=WORLD, join=True)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.mark.slow
def test_info_nce_loss_matches_single_process(ranks):
    a, p = embeddings()
    expected = InfoNCE(temperature=0.05)(a, p)
    mean_of_ranks = torch.stack([r["loss"] for r in ranks]).mean()
    torch.testing.assert_close(mean_of_ranks, expected, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_info_nce_gradient_matches_single_process(ranks):
    """d(mean rank loss)/d(embeddings): rank r holds the gradient of its own rows summed over
    every rank's loss (the gather's backward all-reduces); DDP then divides by the world size."""
    a, p = (x.clone().requires_grad_() for x in embeddings())
    InfoNCE(temperature=0.05)(a, p).backward()
    grad_a = torch.cat([r["grad_a"] for r in ranks]) / WORLD
    grad_p = torch.cat([r["grad_p"] for r in ranks]) / WORLD
    torch.testing.assert_close(grad_a, a.grad, rtol=0, atol=1e-6)
    torch.testing.assert_close(grad_p, p.grad, rtol=0, atol=1e-6)
    # The negatives from the other rank matter: keeping only each rank's own loss gradient
    # (the previous gather_with_grad, which detached the gathered copies) gives a different one.
    a_old = a.detach().clone().requires_grad_()
    local_only = torch.cat([torch.autograd.grad(_local_loss(a_old, p.detach(), s), a_old)[0][s]
                            for s in _rows()]) / WORLD
    assert not torch.allclose(local_only, a.grad, atol=1e-3)


def _rows():
    per = B // WORLD
    return [slice(r * per, (r + 1) * per) for r in range(WORLD)]


def _local_loss(a_full, p_full, rows):
    """Rank ``rows``' loss with the other rank's candidates detached (the old gather)."""
    a = a_full.detach().clone()
    p = p_full.detach().clone()
    a[rows], p[rows] = a_full[rows], p_full[rows]
    n = torch.nn.functional.normalize
    an, pn = n(a, dim=-1), n(p, dim=-1)
    logits_p = an[rows] @ pn.T
    logits_a = an[rows] @ an.T
    idx = torch.arange(B)[rows]
    logits_a[torch.arange(len(idx)), idx] = float("-inf")
    return torch.nn.functional.cross_entropy(torch.cat([logits_p, logits_a], 1) / 0.05, idx)


def assert_grads_close(got: dict, expected: dict):
    """The ranks' gradients against one process's. DDP sums float terms in another order than one
    process does, and so do the CPU kernels of each instruction set (AVX2, AVX-512): an element that
    is a sum over every token with cancellation (the token-type row) keeps an error of ~1e-6 at a
    value of ~1e-2, so the absolute tolerance follows each tensor's scale (1e-3 of its largest
    element); a wrong gradient is off by that scale itself."""
    assert got.keys() == expected.keys()
    for k, g in expected.items():
        torch.testing.assert_close(got[k], g, rtol=1e-4, atol=max(1e-6, 1e-3 * g.abs().max().item()),
                                   msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.slow
def test_ddp_step_matches_single_process(ranks):
    batches = token_batches()
    model = make_model()
    first_loss, grads = train(model, batches, InfoNCE(temperature=0.05))
    torch.testing.assert_close(torch.stack([r["ddp_first_loss"] for r in ranks]).mean(), first_loss,
                               rtol=0, atol=1e-5)
    for rank in ranks:
        assert_grads_close(rank["ddp_grads"], grads)
        for k, w in model.state_dict().items():
            # Adam turns float noise in gradients that are zero in exact arithmetic (the key
            # biases) into updates of ~1e-6; a wrong gradient moves weights by ~lr = 1e-3.
            torch.testing.assert_close(rank["ddp_weights"][k], w, rtol=0, atol=2e-5, msg=lambda m, k=k: f"{k}: {m}")
    assert not any(k.startswith("pooler.") for k in grads)  # unused under mean pooling


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(OBJECTIVES))
def test_ddp_objective_matches_single_process(method, ranks):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        (loss, grads), state = train_objective(method)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(torch.stack([r[method][0][0] for r in ranks]).mean(), loss, rtol=0, atol=1e-5)
    for rank in ranks:
        (_, rank_grads), rank_state = rank[method]
        assert_grads_close(rank_grads, grads)
        assert rank_state.keys() == state.keys()
        for k, v in state.items():  # weights, BSL's EMA target and BatchNorm statistics
            torch.testing.assert_close(rank_state[k], v, rtol=0, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.slow
@pytest.mark.parametrize("method", CACHED)
def test_ddp_cached_objective_matches_single_process(method, ranks):
    """--mini-batch-size under DDP: each rank embeds its rows in chunks, the loss runs on the gathered
    candidates (and BSL's gathered BatchNorm), the cached gradients reach the chunks: one process's
    uncached loss, gradients, weights and statistics on the global batch."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        (loss, grads), state = train_objective(method)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(torch.stack([r[f"{method} cached"][0][0] for r in ranks]).mean(), loss, rtol=0,
                               atol=1e-5)
    for rank in ranks:
        (_, rank_grads), rank_state = rank[f"{method} cached"]
        assert_grads_close(rank_grads, grads)
        for k, v in state.items():
            torch.testing.assert_close(rank_state[k], v, rtol=0, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.slow
def test_each_rank_draws_its_own_dropout_masks_and_repeats_them(ranks):
    """Without seed_dropout every rank would draw the same masks (all seed alike); with it they
    differ across ranks and steps, and a step's masks repeat (what --resume relies on)."""
    (r0_step0, r0_step1, r0_again), (r1_step0, r1_step1, r1_again) = (r["dropout"] for r in ranks)
    assert not torch.equal(r0_step0, r1_step0) and not torch.equal(r0_step1, r1_step1)
    assert not torch.equal(r0_step0, r0_step1)
    assert torch.equal(r0_step0, r0_again) and torch.equal(r1_step0, r1_again)
    state = torch.get_rng_state()
    distributed.seed_dropout(11711, 5)  # one process: the stream is left alone
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.slow
def test_logged_values_are_averaged_over_ranks(ranks):
    for rank in ranks:
        assert rank["logged"] == {"loss": 0.5, "x": 2.0}
    assert distributed.mean_over_ranks({"loss": torch.tensor(3.0)}, "cpu") == {"loss": 3.0}


@pytest.mark.slow
def test_pretrain_batch_not_divisible_by_ranks_is_a_usage_error(ranks):
    for rank in ranks:
        assert rank["odd_batch"] == "--batch-size 5 (the global batch) is not divisible by the 2 processes"


LEAVE_GROUP = """
import gc, os, types, torch
from bertcf.utils import distributed
def train(args, device):
    model = distributed.wrap_ddp(torch.nn.Linear(3, 2), device)
    model(torch.ones(4, 3)).sum().backward()
distributed.run_distributed(train, types.SimpleNamespace(device="cpu"))
gc.collect()
threads = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
# a file per rank: the ranks' prints share torchrun's stdout and can run into one line
with open(os.path.join(os.path.dirname(__file__), f"threads-{os.environ['RANK']}.txt"), "w") as f:
    f.write(repr(threads))
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads the process's threads from /proc")
def test_leaving_the_group_ends_its_gloo_threads(tmp_path):
    """Under torchrun, after run_distributed has used DistributedDataParallel and left the group, no
    gloo thread runs on: none is left to abort at the interpreter's exit (it did once in CI, after a
    finished run). Without init_distributed's early import the group outlived destroy_process_group."""
    import subprocess

    script = tmp_path / "leave.py"
    script.write_text(LEAVE_GROUP)
    cmd, env = torchrun(script)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    threads = [(tmp_path / f"threads-{rank}.txt").read_text() for rank in (0, 1)]
    assert all("gloo" not in line for line in threads), threads


def test_wrap_ddp_is_a_no_op_without_distributed():
    model = make_model()
    assert distributed.wrap_ddp(model, "cpu") is model
    assert distributed.unwrap(model) is model
    assert distributed.is_main_process()
    assert distributed.init_distributed("cpu") == torch.device("cpu")  # no WORLD_SIZE: nothing started
    assert not dist.is_initialized()
    distributed.cleanup_distributed()


def test_bf16_autocast_forward_backward_on_cpu():
    model = make_model()
    ids, masked, mask = token_batches()[0]
    seen = []
    model.encoder.layer[0].intermediate.dense.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    with autocast("cpu", "bf16"):
        out = model(ids, mask)["last_hidden_state"]
        u = pool(out, mask)
        loss = InfoNCE()(u, pool(model(masked, mask)["last_hidden_state"], mask))
    assert seen == [torch.bfloat16, torch.bfloat16]  # the matrix work ran in bf16
    assert u.dtype == loss.dtype == torch.float32
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
    with autocast("cpu", "fp32"):
        model(ids, mask)
    assert seen[-1] == torch.float32
    with pytest.raises(UsageError):
        autocast("cpu", "fp16")
