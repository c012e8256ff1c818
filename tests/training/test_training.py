"""The shared training machinery (bertcf.training): learning-rate schedules and warm-up, AdamW's
parameter groups, gradient clipping in the loop, the resumable data order, and atomic writes."""
from __future__ import annotations

import json

import pytest
import torch

from bertcf import runs, training
from bertcf.errors import NonFiniteLossError, UsageError
from bertcf.config.train import TrainConfig
from bertcf.training.loop import DIVERGENCE_FACTOR
from bertcf.utils import files


def lrs(kind: str, warmup: int, total: int, lr: float = 1.0) -> list[float]:
    """The learning rate of each of ``total`` steps (what the optimiser uses at that step)."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    sched = training.make_scheduler(opt, kind, warmup, total)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_constant_schedule_with_warmup():
    assert lrs("constant", 0, 4, lr=0.5) == [0.5] * 4
    assert lrs("constant", 4, 6) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])


def test_linear_schedule_decays_to_zero_after_warmup():
    assert lrs("linear", 2, 6) == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25])
    assert lrs("linear", 0, 4) == pytest.approx([1.0, 0.75, 0.5, 0.25])


def test_optimizer_groups_decay_and_learning_rates():
    flow, encoder = torch.nn.Linear(3, 3), torch.nn.Linear(3, 2)
    opt = training.make_optimizer([{"params": list(flow.parameters())},
                                   {"params": list(encoder.parameters()), "lr": 1e-4}], 3e-4, 0.01, "cpu")
    got = sorted((g["lr"], g["weight_decay"], tuple(p.shape for p in g["params"])) for g in opt.param_groups)
    assert got == [(1e-4, 0.0, ((2,),)), (1e-4, 0.01, ((2, 3),)), (3e-4, 0.0, ((3,),)), (3e-4, 0.01, ((3, 3),))]
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(UsageError, match="nothing to train"):
        training.make_optimizer(frozen.parameters(), 1e-3, 0.01, "cpu")


def toy_trainer(tmp_path, max_grad_norm: float, grad_scale: float = 100.0):
    """A Trainer over one linear layer whose loss has a gradient of norm ~grad_scale, plain SGD
    with lr 1, so that one step moves the weights by exactly the (clipped) gradient."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False)
    args = TrainConfig(steps=1, log_every=1, eval_every=1, seed=0, device="cpu", precision="fp32",
                       max_grad_norm=max_grad_norm)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    run = runs.Run(tmp_path / "run", {})
    trainer = training.TrainingLoop(args, run, {"model": model}, model.parameters(), {}, optimizer=opt, metric="score",
                                    save_model=lambda d: (d / "weights.txt").write_text("w"),
                                    evaluate=lambda step: {"score": float(step)}, items_per_step=1)
    x = torch.ones(1, 4)

    def step_fn(step):
        return grad_scale * model(x).sum(), {}
    return trainer, model, step_fn


def test_a_refused_resume_leaves_the_runs_record_and_a_loaded_one_writes_it(tmp_path):
    """A resumed run's config.json is written once its state has loaded (``TrainingLoop.resume``),
    for every trainer: a --resume refused on the way leaves the record as it was."""
    def loop(record: dict, resume: bool, modules: dict):
        args = TrainConfig(steps=1, eval_every=1, device="cpu", precision="fp32", resume=resume)
        return training.TrainingLoop(args, runs.Run(tmp_path / "run", record, resume=resume), modules,
                                     [p for m in modules.values() for p in m.parameters()], {}, metric="score",
                                     save_model=lambda d: (d / "weights.txt").write_text("w"),
                                     evaluate=lambda step: {"score": float(step)}, items_per_step=1)
    model = torch.nn.Linear(2, 1)
    loop({"lr": 1}, False, {"model": model}).fit(lambda step: (model(torch.ones(1, 2)).sum(), {}))
    record = tmp_path / "run" / "config.json"
    assert json.loads(record.read_text()) == {"lr": 1}
    with pytest.raises(UsageError, match="holds model, not head, model"):
        loop({"lr": 2}, True, {"model": model, "head": torch.nn.Linear(1, 1)}).resume()
    assert json.loads(record.read_text()) == {"lr": 1}
    loop({"lr": 2}, True, {"model": model}).resume()
    assert json.loads(record.read_text()) == {"lr": 2}


@pytest.mark.parametrize("max_grad_norm", [0.0, 0.5])
def test_gradient_clipping(tmp_path, max_grad_norm):
    trainer, model, step_fn = toy_trainer(tmp_path, max_grad_norm)
    before = model.weight.detach().clone()
    trainer.fit(step_fn)
    moved = (model.weight.detach() - before).norm().item()
    # The gradient is 100 * [1, 1, 1, 1] (norm 200): clipped to 0.5 when asked, else taken whole.
    assert moved == pytest.approx(max_grad_norm or 200.0, rel=1e-5)
    assert (tmp_path / "run" / "best" / "weights.txt").is_file() and (tmp_path / "run" / "last").is_dir()


def scripted_loss_trainer(tmp_path, losses):
    """A Trainer whose step ``i`` (0-based) reports the loss ``losses[i]``, checkpointing every 2
    steps and logging every 10."""
    model = torch.nn.Linear(1, 1)
    args = TrainConfig(steps=len(losses), log_every=10, eval_every=2, seed=0, device="cpu", precision="fp32",
                       max_grad_norm=0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    trainer = training.TrainingLoop(args, runs.Run(tmp_path / "run", {}), {"model": model}, model.parameters(), {},
                                    optimizer=opt, metric="score",
                                    save_model=lambda d: (d / "weights.txt").write_text("w"), evaluate=lambda step: {"score": float(step)}, items_per_step=1)
    return trainer, lambda step: (losses[step] + 0 * model(torch.ones(1, 1)).sum(), {})


@pytest.mark.parametrize("jump", [2e4, -2e4])
def test_a_diverging_loss_stops_like_a_non_finite_one(tmp_path, jump):
    """More than DIVERGENCE_FACTOR (1e4) times the first step's loss, or 1 when that is smaller, is
    diverging: the run stops at the next checkpoint, keeping the last good one (step 2's)."""
    assert DIVERGENCE_FACTOR == 10_000
    trainer, step_fn = scripted_loss_trainer(tmp_path, [-0.1, 0.5, jump, 1.0, 1.0, 1.0])
    with pytest.raises(NonFiniteLossError, match=rf"became {jump} at step 3 \(diverging: over 10,000 times the "
                                                 r"first step's\); stopped, keeping the last good checkpoint"):
        trainer.fit(step_fn)
    assert torch.load(tmp_path / "run" / "last" / runs.STATE_FILE, weights_only=False)["step"] == 2
    # below the limit: a loss 9,000 times the first (floored at 1), or 9,000 times a first of 30
    for name, losses in (("small", [-0.1, 9e3, 9e3, 1.0]), ("large", [30.0, -2.7e5, 2.7e5, 1.0])):
        trainer, step_fn = scripted_loss_trainer(tmp_path / name, losses)
        assert trainer.fit(step_fn)["step"] == 4
    trainer, step_fn = scripted_loss_trainer(tmp_path / "nan", [1.0, float("nan"), 1.0, 1.0])
    with pytest.raises(NonFiniteLossError, match=r"became nan at step 2; stopped"):
        trainer.fit(step_fn)


def test_epoch_sampler_covers_each_epoch_and_resumes_exactly():
    s = training.EpochSampler(10, seed=3)
    first, second = s.next(10), s.next(10)
    assert sorted(first) == sorted(second) == list(range(10)) and first != second
    s = training.EpochSampler(10, seed=3)
    s.next(7)
    state = s.state_dict()
    rest = s.next(8)  # crosses into the second epoch
    resumed = training.EpochSampler(10, seed=3)
    resumed.load_state_dict(state)
    assert resumed.next(8) == rest == (first + second)[7:15]
    assert training.EpochSampler(10, seed=4).next(10) != first
    assert training.EpochSampler(5, seed=0, shuffle=False).next(7) == [0, 1, 2, 3, 4, 0, 1]


def test_atomic_directory_write_keeps_the_old_copy_on_failure(tmp_path):
    target = tmp_path / "best"
    files.save_dir_atomic(target, lambda d: (d / "a.txt").write_text("old"))

    def broken(d):
        (d / "a.txt").write_text("half")
        raise RuntimeError("killed")
    with pytest.raises(RuntimeError):
        files.save_dir_atomic(target, broken)
    assert (target / "a.txt").read_text() == "old"
    files.save_dir_atomic(target, lambda d: (d / "a.txt").write_text("new"))
    assert (target / "a.txt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["best"]
    # A kill between the two renames leaves only .best.old: recover_dir puts it back.
    target.rename(tmp_path / ".best.old")
    assert (files.recover_dir(target) / "a.txt").read_text() == "new"


def test_write_json_atomic(tmp_path):
    path = tmp_path / "config.json"
    files.write_json_atomic(path, {"a": 1})
    files.write_json_atomic(path, {"a": 2, "path": tmp_path})
    assert json.loads(path.read_text()) == {"a": 2, "path": str(tmp_path)}
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]


def test_run_metrics_logs_an_interval_as_a_list_and_two_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = runs.Run(tmp_path / "run", {})
    run.start(0)
    run.metrics(3, {"sts_spearman": torch.tensor(0.5), "sts_spearman_ci95": [0.25, 0.75], "uniformity": -2})
    run.close()
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text()) == \
        {"step": 3, "sts_spearman": 0.5, "sts_spearman_ci95": [0.25, 0.75], "uniformity": -2.0}
    events = EventAccumulator(str(tmp_path / "run" / "tb")).Reload()
    logged = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert logged == {"eval/sts_spearman": [(3, 0.5)], "eval/sts_spearman_ci95_lo": [(3, 0.25)],
                      "eval/sts_spearman_ci95_hi": [(3, 0.75)], "eval/uniformity": [(3, -2.0)]}
