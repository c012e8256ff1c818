"""How tasks share the steps (bertcf.training.sampler.TaskSampler): each mode's probabilities against the
formulas written out here, the draws' frequencies, the counts in metrics.jsonl and TensorBoard,
and a resumed run that continues the same draws, bit for bit."""
from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import multitask_argv as argv
from helpers import quiet_multitask as quiet
from helpers import write_cs224n_files
from safetensors.torch import load_file

from bertcf.errors import UsageError
from bertcf.training.sampler import MODES, TaskSampler

pytestmark = pytest.mark.usefixtures("one_thread")
SIZES = {"sst": 8544, "qqp": 141506, "sts": 6040}  # the CS224N training sets
TASKS = tuple(SIZES)


def test_probabilities_follow_the_papers():
    n = torch.tensor([8544.0, 141506.0, 6040.0], dtype=torch.float64)
    steps = 101
    proportional = TaskSampler("proportional", SIZES, steps, seed=0)
    torch.testing.assert_close(proportional.probabilities(0), n / n.sum())
    temperature = TaskSampler("temperature", SIZES, steps, seed=0, temperature=4.0)
    torch.testing.assert_close(temperature.probabilities(7), n ** 0.25 / (n ** 0.25).sum())
    annealed = TaskSampler("annealed", SIZES, steps, seed=0)
    torch.testing.assert_close(annealed.probabilities(0), n / n.sum())  # alpha 1 at the start
    torch.testing.assert_close(annealed.probabilities(100), n ** 0.2 / (n ** 0.2).sum())  # 0.2 at the end
    alpha = 1 - 0.8 * 50 / 100  # Stickland & Murray's 1 - 0.8 (e - 1) / (E - 1), halfway
    torch.testing.assert_close(annealed.probabilities(50), n ** alpha / (n ** alpha).sum())


def test_each_mode_draws_as_it_says():
    assert all(TaskSampler("all", SIZES, 10, 0).tasks_at(s) == ["sst", "qqp", "sts"] for s in range(3))
    robin = TaskSampler("round-robin", SIZES, 10, 0)
    assert [robin.tasks_at(s)[0] for s in range(5)] == ["sst", "qqp", "sts", "sst", "qqp"]
    assert robin.counts == {"sst": 2, "qqp": 2, "sts": 1}
    draws = 6000
    sampler = TaskSampler("temperature", SIZES, draws, seed=3, temperature=2.0)
    picks = [sampler.tasks_at(s)[0] for s in range(draws)]
    expected = sampler.probabilities(0)
    for i, task in enumerate(SIZES):
        share = picks.count(task) / draws
        sd = math.sqrt(float(expected[i]) * (1 - float(expected[i])) / draws)
        assert abs(share - float(expected[i])) < 5 * sd, (task, share, float(expected[i]))
    assert sampler.counts == {t: picks.count(t) for t in SIZES}


def test_a_draw_depends_on_the_seed_and_step_only():
    a, b = TaskSampler("proportional", SIZES, 100, seed=5), TaskSampler("proportional", SIZES, 100, seed=5)
    first = [a.tasks_at(s) for s in range(40)]
    assert [b.tasks_at(s) for s in range(20, 40)] == first[20:]  # resumed at step 20: the same draws
    assert first != [TaskSampler("proportional", SIZES, 100, seed=6).tasks_at(s) for s in range(40)]
    b.load_state_dict(a.state_dict())
    assert b.counts == a.counts


def test_bad_settings():
    with pytest.raises(UsageError, match="sampling must be one of"):
        TaskSampler("uniform", SIZES, 10, 0)
    with pytest.raises(UsageError, match="positive"):
        TaskSampler("temperature", SIZES, 10, 0, temperature=0)
    assert MODES == ("all", "round-robin", "proportional", "temperature", "annealed")


# ---- in a run ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["round-robin", "annealed"])
def test_a_sampled_run_counts_its_batches_and_resumes_the_same_draws(mode, tiny_bert_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = write_cs224n_files(tmp_path / "data")
    straight, part = tmp_path / "straight", tmp_path / "part"
    quiet(argv(tiny_bert_dir, data, straight, 6, "--task-sampling", mode))
    quiet(argv(tiny_bert_dir, data, part, 4, "--task-sampling", mode))
    quiet(["--resume", "--out-dir", str(part), "--steps", "6"])
    for name in ("model.safetensors", "heads.safetensors"):
        a, b = load_file(str(straight / "last" / name)), load_file(str(part / "last" / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    # The batches each task had after s steps, by hand: SST, QQP, STS in turn; or the draws of the run's
    # sampler (10 training rows a task: --max-train-examples), which the tests above check.
    if mode == "round-robin":
        drawn = [TASKS[s % 3] for s in range(6)]
    else:
        seed = json.loads((straight / "config.json").read_text())["seed"]
        sampler = TaskSampler(mode, dict.fromkeys(TASKS, 10), 6, seed)
        drawn = [sampler.tasks_at(s)[0] for s in range(6)]
    counts = {s: [drawn[:s].count(t) for t in TASKS] for s in range(7)}
    events = EventAccumulator(str(straight / "tb")).Reload()
    for phase, steps in (("train", range(1, 7)), ("eval", (0, 2, 4, 6))):  # --log-every 1, --eval-every 2
        logged = {t: {e.step: e.value for e in events.Scalars(f"{phase}/batches_{t}")} for t in TASKS}
        assert all(sorted(logged[t]) == list(steps) for t in TASKS), phase
        for s in steps:
            assert [logged[t][s] for t in TASKS] == counts[s], (phase, s)
    records = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert [[r[f"batches_{t}"] for t in TASKS] for r in records] == [counts[s] for s in (0, 2, 4, 6)]
    assert [json.loads(line) for line in (part / "metrics.jsonl").read_text().splitlines()][-1] == records[-1]


def test_a_step_that_draws_one_task_counts_only_its_sentences(tiny_bert_dir, tmp_path, monkeypatch):
    """train/sentences_per_second with one task a step: that task's sentences (SST 4, QQP 6 pairs =
    12, STS 4 pairs = 8), not every task's (24). The loop's clock advances one second a reading, so
    between two logs with nothing else timed the rate is the step's sentences."""
    from types import SimpleNamespace

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from bertcf.training import loop

    clock = iter(range(10**6))
    monkeypatch.setattr(loop, "time", SimpleNamespace(perf_counter=lambda: float(next(clock))))
    data = write_cs224n_files(tmp_path / "data")
    quiet(argv(tiny_bert_dir, data, tmp_path / "run", 6, "--task-sampling", "round-robin", "--eval-every", "100"))
    rates = {e.step: e.value for e in EventAccumulator(str(tmp_path / "run" / "tb")).Reload()
             .Scalars("train/sentences_per_second")}
    middle = [rates[s] for s in (2, 3, 4)]  # no evaluation before or between them (step 0 and 6 only)
    assert sorted(middle) == [4, 8, 12], rates
