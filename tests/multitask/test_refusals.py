"""Stage 3 under bad input and faults (issue 65): each case refused in one line and exit status 2
before anything is written, with the task and the field named, the Python API raising UsageError
with the same words; a --resume against changed settings or declarations leaving the run directory
byte-identical (and still resumable); the faults that used to crash (jointly encoded pairs under an
aggregator, a crash before the first checkpoint) now running or leaving a directory a rerun reuses."""
from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import quiet_multitask as quiet
from helpers import refused
from test_aggregation import OFFERED, needs_solvers
from test_tasks import argv, data_dir, nli_entry, write_nli  # noqa: F401 (data_dir: the same task files)

from bertcf import SentenceEncoder
from bertcf.errors import DataError, UsageError
from bertcf.multitask import MultitaskTrainer, Task, builtin_tasks
from bertcf.multitask import trainer as mt
from bertcf.multitask.aggregation import aggregated_backward, build_aggregator
from bertcf.multitask.config import resumed
from bertcf.multitask.data import load_task
from bertcf.multitask.declarations import declared_tasks, parse_task_flag

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:You are solving a parameterized problem that is not DPP")]


def files(directory: Path) -> dict:
    """Every file under ``directory`` and a hash of its bytes: what "unchanged" is checked on."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def task_file(path: Path, *entries) -> Path:
    path.write_text(json.dumps(list(entries)))
    return path


# ---- --resume against another declaration or setting --------------------------------------------------
@pytest.fixture(scope="module")
def stopped_run(tiny_bert_dir, data_dir, tmp_path_factory) -> tuple[Path, Path]:
    """Two of four steps of the three tasks and NLI (from a task file): (the run, its task file)."""
    root = tmp_path_factory.mktemp("mt-stopped")
    tasks = task_file(root / "tasks.json", nli_entry(data_dir))
    quiet(argv(tiny_bert_dir, data_dir, root / "run", "--task-file", tasks, steps=2))
    return root / "run", tasks


RESUMED = {  # case -> (flags of the --resume, what its one line says)
    "tasks narrowed": (["--tasks", "sst,qqp"], "the run trains sst, qqp, sts, nli, in that order"),
    "tasks reordered": (["--tasks", "nli,sst,qqp,sts"], "these settings declare nli, sst, qqp, sts"),
    "another task file": (["--task-file", "OTHER"], "task 'nli': batch_size is 4 here, 6 in"),
    "task file edited in place": ([], "task 'nli': weight is 3 here, 2.0 in"),
    "a setting": (["--lr", "0.5"], "--lr is 0.5 here, 0.001 in"),
    "a method": (["--aggregator", "pcgrad"], "--aggregator is pcgrad here, sum in"),
    "a built-in task's flag": (["--qqp-weight", "3"], "--qqp-weight is 3.0 here, 20.0 in"),
}


@pytest.mark.parametrize("case", RESUMED)
def test_a_resume_against_a_changed_declaration_is_refused_and_changes_nothing(case, stopped_run, data_dir,
                                                                               tmp_path, capsys):
    source, tasks = stopped_run
    run = tmp_path / "run"
    shutil.copytree(source, run)
    flags, needle = RESUMED[case]
    if case == "another task file":
        flags = ["--task-file", task_file(tmp_path / "other.json", nli_entry(data_dir) | {"batch_size": 4})]
    before, declared = files(run), tasks.read_text()
    try:
        if case == "task file edited in place":  # the path config.json records, its contents changed
            tasks.write_text(json.dumps([nli_entry(data_dir) | {"weight": 3}]))
        refused(["--resume", "--out-dir", run, "--steps", "4", *flags], capsys, needle, str(run / "config.json"))
    finally:
        tasks.write_text(declared)
    assert files(run) == before
    # what the refusal used to lose: the run still continues, as it was declared
    assert quiet(["--resume", "--out-dir", str(run), "--steps", "4"])["step"] == 4


def test_a_checkpoint_that_does_not_load_leaves_the_record_as_it_was(stopped_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(stopped_run[0], run)
    state = run / "last" / "training_state.pt"
    state.write_bytes(state.read_bytes()[:1000])
    before = files(run)
    refused(["--resume", "--out-dir", run, "--steps", "4"], capsys, "truncated or corrupt")
    assert files(run) == before  # config.json and environment.json not rewritten for a resume that failed


def test_a_python_resume_is_checked_as_the_commands(stopped_run, tiny_bert_dir, data_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(stopped_run[0], run)
    config = resumed(run)  # the run's settings, as --resume takes them
    tasks = declared_tasks(config)
    tasks[3] = tasks[3].replace(batch_size=5)
    before = files(run)
    with pytest.raises(UsageError, match="--resume: task 'nli': batch_size is 5 here, 6 in"):
        MultitaskTrainer(SentenceEncoder.from_pretrained(tiny_bert_dir), tasks, config)
    assert files(run) == before


# ---- faults that crashed -----------------------------------------------------------------------------
def test_jointly_encoded_pairs_train_under_an_aggregator(tiny_bert_dir, data_dir, tmp_path):
    """--pair-encoding cross --aggregator pcgrad used to fail in torchjd at step 1 (the pooled [CLS]
    is computed from the last hidden state: no cut of the graph), leaving best/ without last/."""
    tasks = task_file(tmp_path / "tasks.json", nli_entry(data_dir))
    out = tmp_path / "run"
    summary = quiet(argv(tiny_bert_dir, data_dir, out, "--task-file", tasks, "--tasks", "sst,nli",
                         "--pair-encoding", "cross", "--aggregator", "pcgrad", steps=2, proj_dim=None))
    assert summary["step"] == 2 and (out / "last").is_dir() and (out / "predictions" / "nli-dev-output.csv").is_file()


class Nested(torch.nn.Module):
    """A shared trunk whose output one head reads, and a shared layer on it (BERT's pooler) that
    two other heads read: two features, the second computed from the first."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.trunk = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh()).double()
        self.pooler = torch.nn.Linear(8, 8).double()
        self.heads = torch.nn.ModuleList([torch.nn.Linear(8, 3).double() for _ in range(3)])

    def losses(self):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(10, 6, generator=g, dtype=torch.float64)
        y = torch.randn(10, 3, generator=g, dtype=torch.float64)
        h = self.trunk(x)
        p = torch.tanh(self.pooler(h))
        return [h, p], [(self.heads[0](h) - y).square().mean(), (self.heads[1](p) + y).square().mean() * 2,
                        (self.heads[2](p) - y.flip(0)).square().mean()]


@pytest.mark.parametrize("name", OFFERED)
def test_every_aggregator_on_features_computed_from_one_another(name):
    """The shared parameters (trunk and pooler) get the aggregation of the tasks' gradients on them,
    each head its own task's: as each task's gradient from its own torch.autograd.grad gives them."""
    needs_solvers(name)
    model = Nested()
    shared = [*model.trunk.parameters(), *model.pooler.parameters()]
    _, losses = model.losses()

    def row(loss):  # a task's gradient on the shared parameters: 0 on the pooler, which the first does not read
        grads = torch.autograd.grad(loss, shared, retain_graph=True, allow_unused=True)
        return torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for p, g in zip(shared, grads)])
    rows = [row(loss) for loss in losses]
    heads = [torch.autograd.grad(loss, list(head.parameters()), retain_graph=True)
             for loss, head in zip(losses, model.heads)]
    torch.manual_seed(5)
    expected = build_aggregator(name, 3)(torch.stack(rows))
    features, losses = model.losses()
    torch.manual_seed(5)
    aggregated_backward(losses, features, shared, build_aggregator(name, 3))
    got = torch.cat([p.grad.flatten() for p in shared])
    assert torch.allclose(got, expected, rtol=1e-7, atol=1e-9 * expected.abs().max().item()), name
    for head, grads in zip(model.heads, heads):
        assert all(torch.allclose(p.grad, g, rtol=1e-12, atol=1e-14) for p, g in zip(head.parameters(), grads))
    assert not any(hasattr(p, "jac") for p in shared)


def test_a_crash_before_the_first_checkpoint_leaves_a_directory_a_rerun_reuses(tiny_bert_dir, data_dir, tmp_path,
                                                                               monkeypatch, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # a user's file: it survives all of it
    args = argv(tiny_bert_dir, data_dir, out, steps=2)

    def crash(*args, **kwargs):
        raise RuntimeError("a fault in the step")
    monkeypatch.setattr(mt.Step, "__call__", crash)
    with pytest.raises(RuntimeError, match="a fault in the step"):
        quiet(args)
    monkeypatch.undo()
    assert (out / "best").is_dir() and not (out / "last").exists()  # step 0's evaluation, no checkpoint
    before = files(out)
    refused(["--resume", "--out-dir", out], capsys, "never reached its first checkpoint")
    assert files(out) == before
    assert quiet(args)["step"] == 2  # the same command again: it starts afresh
    assert "stopped before its first checkpoint (no last/); starting afresh" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine" and (out / "last").is_dir()
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [0, 2]


# ---- bad declarations: one line naming the task and the field, nothing written --------------------------
BAD = {  # case -> (the NLI declaration's changes, what the one line says)
    "label_range of words": ({"kind": "pair-regression", "loss": None, "labels": None, "label_range": ["a", "b"]},
                             "task 'nli': label_range must be two numbers [low, high], not ['a', 'b']"),
    "label_range of three": ({"kind": "pair-regression", "loss": None, "labels": None, "label_range": [0, 1, 2]},
                             "task 'nli': label_range must be two numbers"),
    "label_range a number": ({"kind": "pair-regression", "loss": None, "labels": None, "label_range": 5},
                             "task 'nli': label_range must be two numbers [low, high], not 5"),
    "dropout a word": ({"dropout": "abc"}, "task 'nli': dropout must be a number, not 'abc'"),
    "weight a boolean": ({"weight": True}, "task 'nli': weight must be a number, not True"),
    "labels a word": ({"labels": "abc"}, "task 'nli': labels must be a list of the class names"),
    "a directory as a file": ({"train": "DIR"}, "task 'nli': train file"),
    "a binary train file": ({"train": "BINARY"}, "is not valid UTF-8 text"),
    "duplicate dev ids": ({"dev": "DUPLICATES", "id_column": "premise"}, "appears on more than one row"),
    "a position with a header": ({"text_columns": [0, 1]}, "column 0 is a position"),
    "a name without a header": ({"header": False}, "give column 'premise' by position"),
    "a headerless file": ({"train": "HEADERLESS"}, "its first line looks like data"),
    "a margin its head does not read": ({"margin": 0.3}, "task 'nli': its margin 0.3 does not apply to its "
                                                         "softmax-pair head (--pair-encoding bi)"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_declarations_name_the_task_and_the_field(case, tiny_bert_dir, data_dir, tmp_path, capsys):
    changes, needle = BAD[case]
    made = {"DIR": tmp_path, "BINARY": tmp_path / "binary.tsv", "DUPLICATES": tmp_path / "dev.tsv",
            "HEADERLESS": tmp_path / "headerless.tsv"}
    made["BINARY"].write_bytes(bytes(range(256)) * 4)
    write_nli(made["DUPLICATES"], 9)  # its four premises repeat: as ids, rows share them
    made["HEADERLESS"].write_text("".join(line + "\n" for line in
                                          (data_dir / "nli-train.tsv").read_text().splitlines()[1:]))
    entry = {k: str(made[v]) if isinstance(v, str) and v in made else v
             for k, v in (nli_entry(data_dir) | changes).items() if v is not None}
    out = tmp_path / "run"
    refused(argv(tiny_bert_dir, data_dir, out, "--task-file", task_file(tmp_path / "tasks.json", entry)), capsys,
            needle, "'nli'")
    assert not out.exists()


BUILTIN = {  # case -> (a built-in task's entry in a task file, or flags; what the one line says)
    "a range its scores leave": ({"name": "sts", "label_range": [0, 1]}, "task 'sts': "),
    "columns its reader ignores": ({"name": "sts", "text_columns": ["a", "b"]},
                                   "task 'sts': text_columns ['a', 'b'] does not apply"),
    "a label column its reader ignores": ({"name": "qqp", "label_column": "dup"}, "task 'qqp': label_column 'dup'"),
    "fewer classes than its labels": ({"name": "sst", "num_classes": 3}, "is not one of its classes (0..2)"),
    "a flag its declaration overrides": ({"name": "qqp", "weight": 10}, "--qqp-weight 3.0 does not apply: task "
                                                                        "'qqp' is declared with weight 10"),
}


@pytest.mark.parametrize("case", BUILTIN)
def test_a_built_in_task_is_checked_against_its_declaration(case, tiny_bert_dir, data_dir, tmp_path, capsys):
    entry, needle = BUILTIN[case]
    extra = ["--qqp-weight", "3"] if case == "a flag its declaration overrides" else []
    out = tmp_path / "run"
    line = refused(argv(tiny_bert_dir, data_dir, out, "--task-file", task_file(tmp_path / "t.json", entry), *extra),
                   capsys, needle)
    if case == "a range its scores leave":
        assert "is outside label_range [0, 1]" in line
    assert not out.exists()


@pytest.mark.parametrize("flags, needle", [
    (["--tasks", ", "], "--tasks ', ' names no task"),
    (["--tasks", ""], "--tasks '' names no task"),
    (["--aggregator", "pcgrad", "--freeze-encoder"], "which --freeze-encoder freezes"),
    # a setting where it does not apply: refused, not recorded unused (config.check_settings)
    (["--task-sampling", "proportional", "--sampling-temperature", "3"],
     "--sampling-temperature does not apply without --task-sampling temperature (--task-sampling is proportional)"),
    (["--dwa-window", "5"], "--dwa-window does not apply without --task-weighting dwa (--task-weighting is fixed)"),
    (["--smart-steps", "2"], "--smart-steps does not apply without --smart-weight > 0"),
    # the pairs read jointly: no head projects or compares a cosine (checks.check_head_settings)
    (["--pair-encoding", "cross"], "--proj-dim 16 does not apply: no task's head projects a pair's sentences "
                                   "(--pair-encoding cross: sst classification, qqp cross-pair, sts cross-pair)"),
    (["--pair-encoding", "cross", "--proj-dim", "768", "--sts-margin", "0.2"],
     "task 'sts': --sts-margin 0.2 does not apply to its cross-pair head (--pair-encoding cross)"),
    (["--predict-only"], "--predict-only needs --checkpoint DIR"),
    (["--checkpoint", "somewhere"], "--checkpoint is for --predict-only"),
    (["--task", "name=x,kind=pair-regression,train=a,dev=b,text_columns=s;t,label_range=0;a"],
     "task 'x': label_range must be two numbers [low, high], not [0, 'a']"),
])
def test_bad_flags_are_one_line_and_nothing_is_written(flags, needle, tiny_bert_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    refused(argv(tiny_bert_dir, data_dir, out, *flags), capsys, needle)
    assert not out.exists()


def test_a_headerless_file_is_read_by_column_positions(tiny_bert_dir, data_dir, tmp_path):
    path = tmp_path / "sick.tsv"  # SICK's way: no header line
    path.write_text("a man plays\ta person plays\t4.5\nthe dog sleeps\ta cat runs\t1.0\n")
    flag = f"name=sick,kind=pair-regression,train={path},dev={path},text_columns=0;1,label_column=2,header=false"
    task = Task(**parse_task_flag(flag))
    assert task.text_columns == (0, 1) and task.label_column == 2 and task.header is False
    data = load_task(task, "dev", SentenceEncoder.from_pretrained(tiny_bert_dir).tokenizer, 16)
    assert data.labels == [4.5, 1.0] and data.ids == ["1", "2"]  # every line is a row, numbered from 1
    with pytest.raises(DataError, match=r"sick.tsv line 1: no column 3 \(found 3 fields"):
        load_task(task.replace(label_column=3), "dev", SentenceEncoder.from_pretrained(tiny_bert_dir).tokenizer, 16)


def test_a_single_text_column_may_be_given_as_a_word(data_dir):
    task = Task("one", "classification", train="a", dev="b", num_classes=2, text_columns="sentence")
    assert task.text_columns == ("sentence",)  # not split into letters


# ---- the Python API: UsageError with the command's words, before anything is written ----------------------
@pytest.mark.parametrize("case", ["no tasks", "a name", "one task twice", "a built-in flag",
                                  "a built-in flag, no such task", "a task file", "aggregator on a frozen encoder",
                                  "a setting that does not apply"])
def test_the_trainer_refuses_what_the_command_refuses(case, tiny_bert_dir, data_dir, tmp_path):
    builtin = builtin_tasks(data_dir)
    nli = Task(**nli_entry(data_dir))
    tasks, settings, needle = {
        "no tasks": ([], {}, "needs a list of tasks"),
        "a name": (["sst"], {}, "the tasks are Task objects, not 'sst' (str)"),
        "one task twice": ([nli, nli], {}, "task 'nli' is given twice"),
        "a built-in flag": ([builtin["qqp"], nli], {"qqp_weight": 3}, "--qqp-weight 3 does not apply: task 'qqp' "
                                                                       "is declared with weight 20.0"),
        "a built-in flag, no such task": ([builtin["sst"], nli], {"qqp_weight": 3}, "--qqp-weight 3 does not apply: no "
                                                                                   "task 'qqp' among the tasks given"),
        "a task file": ([nli], {"task_file": str(task_file(tmp_path / "t.json", nli_entry(data_dir) | {"weight": 3}))},
                        "--task-file, --task and --tasks do not apply"),
        "aggregator on a frozen encoder": ([builtin["sst"], nli], {"aggregator": "pcgrad", "freeze_encoder": True},
                                           "which --freeze-encoder freezes"),
        "a setting that does not apply": ([builtin["sst"], nli], {"dwa_temperature": 3.0},
                                          "--dwa-temperature does not apply without --task-weighting dwa"),
    }[case]
    out = tmp_path / "run"
    with pytest.raises(UsageError, match=re.escape(needle)):
        MultitaskTrainer(SentenceEncoder.from_pretrained(tiny_bert_dir), tasks, out_dir=str(out), device="cpu",
                         **settings)
    assert not out.exists()


@pytest.mark.parametrize("fields, needle", [
    ({"weight": True}, "task 'x': weight must be a number, not True"),
    ({"dropout": "abc"}, "task 'x': dropout must be a number, not 'abc'"),
    ({"batch_size": 2.5}, "task 'x': batch_size must be an integer, not 2.5"),
    ({"text_columns": ["a", None]}, "task 'x': text_columns must be a list of column names"),
])
def test_python_task_fields_are_checked_by_type(fields, needle):
    with pytest.raises(UsageError, match=re.escape(needle)):
        Task("x", "classification", train="a", dev="b", num_classes=2, **fields)
