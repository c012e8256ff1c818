"""Tasks as data (bertcf.multitask.tasks, .data): declarations from a task file (YAML and JSON), the
--task flag and Python; a fourth task (three-way NLI pairs, SBERT's softmax classifier) trained
beside the report's three, from the command and from Python with the same weights; the bad
declarations and files, each one line and exit 2 before anything is written."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
from helpers import multitask_argv
from helpers import quiet_multitask as quiet
from helpers import PREMISES, write_cs224n_files
from safetensors.torch import load_file

from bertcf import SentenceEncoder, set_seed
from bertcf.cli import run_main
from bertcf.errors import DataError, UsageError
from bertcf.multitask import MultitaskConfig, MultitaskModel, MultitaskTrainer, Task, builtin_tasks, command
from bertcf.multitask import declarations, losses
from bertcf.multitask.config import parse
from bertcf.multitask.data import load_task
from bertcf.multitask.heads import Widths, build_head
from bertcf.multitask.declarations import declared_tasks, parse_task_flag

pytestmark = pytest.mark.usefixtures("one_thread")

HYPOTHESES = ["A person makes music.", "Nobody is outside.", "The animals are asleep.", "Someone is cooking.",
              "A man is singing.", "The dogs are running."]


def write_nli(path: Path, n: int, offset: int = 0, header=("premise", "hypothesis", "label")) -> Path:
    """SNLI's tsv layout (premise, hypothesis, label 0/1/2, no quoting)."""
    rows = ["\t".join(header)]
    for i in range(offset, offset + n):
        rows.append(f"{PREMISES[i % len(PREMISES)]}\t{HYPOTHESES[i % len(HYPOTHESES)]}\t{i % 3}")
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = write_cs224n_files(tmp_path_factory.mktemp("mt-tasks"))
    write_nli(d / "nli-train.tsv", 18)
    write_nli(d / "nli-dev.tsv", 9, offset=3)
    return d


def nli_entry(data_dir) -> dict:
    return {"name": "nli", "kind": "pair-classification", "train": str(data_dir / "nli-train.tsv"),
            "dev": str(data_dir / "nli-dev.tsv"), "text_columns": ["premise", "hypothesis"],
            "labels": ["entailment", "neutral", "contradiction"], "loss": "softmax", "weight": 2.0, "batch_size": 6}


def argv(bert_dir, data_dir, out_dir, *extra, steps=3, **flags) -> list[str]:
    """multitask_argv with this file's settings: every training row, one evaluation in 3 steps."""
    return multitask_argv(bert_dir, data_dir, out_dir, steps, *extra, eval_every=3, max_train_examples=None, **flags)



# ---- declarations ------------------------------------------------------------------------------------
def test_builtin_declarations_are_the_reports():
    sst, qqp, sts = builtin_tasks("data").values()
    assert (sst.kind, sst.num_classes, sst.loss, sst.metric, sst.weight, sst.batch_size, sst.dropout) == \
        ("classification", 5, "cross-entropy", "accuracy", 5.0, 32, 0.3)
    assert (qqp.kind, qqp.loss, qqp.margin, qqp.weight, qqp.batch_size, qqp.dropout) == \
        ("pair-classification", "cosine-hinge", 0.7, 20.0, 96, 0.0)
    assert (sts.kind, sts.loss, sts.metric, sts.margin, sts.weight, sts.batch_size, sts.label_range) == \
        ("pair-regression", "cosine-mse", "pearson", 0.0, 1.0, 32, (0.0, 5.0))
    assert [t.metric_key for t in (sst, qqp, sts)] == ["sst_acc", "qqp_acc", "sts_pearson"]
    assert sst.train == str(Path("data") / "ids-sst-train.csv") and qqp.dev == str(Path("data") / "quora-dev.csv")


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_task_file_adds_and_replaces_tasks(suffix, data_dir, tmp_path):
    entries = [nli_entry(data_dir), {"name": "qqp", "weight": 7.5}]  # qqp: only its weight changes
    text = json.dumps({"tasks": entries}) if suffix == ".json" else "tasks:\n" + "".join(
        f"  - {json.dumps(e)}\n" for e in entries)  # JSON objects are YAML flow mappings
    path = tmp_path / f"tasks{suffix}"
    path.write_text(text)
    tasks = declared_tasks(parse(["--data-dir", str(data_dir), "--task-file", str(path), "--device", "cpu"]))
    assert [t.name for t in tasks] == ["sst", "qqp", "sts", "nli"]
    assert tasks[1].weight == 7.5 and tasks[1].margin == 0.7 and tasks[1].reader == "qqp"
    assert tasks[3].num_classes == 3 and tasks[3].metric == "accuracy" and tasks[3].metric_key == "nli_acc"
    # --tasks picks which run, in its order
    picked = declared_tasks(parse(["--data-dir", str(data_dir), "--task-file", str(path), "--tasks", "nli,sst",
                                   "--device", "cpu"]))
    assert [t.name for t in picked] == ["nli", "sst"]


def test_the_task_flag_declares_one_inline(data_dir):
    text = (f"name=nli,kind=pair-classification,train={data_dir / 'nli-train.tsv'},dev={data_dir / 'nli-dev.tsv'},"
            "text_columns=premise;hypothesis,num_classes=3,loss=softmax,batch_size=6")
    assert parse_task_flag(text)["text_columns"] == ["premise", "hypothesis"]
    assert parse_task_flag(text)["num_classes"] == 3
    tasks = declared_tasks(parse(["--data-dir", str(data_dir), "--task", text, "--device", "cpu"]))
    assert tasks[-1] == Task(**parse_task_flag(text))


def test_labels_by_name_or_index_and_scores_in_their_range(tiny_bert_dir, tmp_path):
    tokenizer = SentenceEncoder.from_pretrained(tiny_bert_dir).tokenizer
    named = tmp_path / "named.csv"
    named.write_text('text,label,id\n"a man, with a dog",pos,x1\nthe film,neg,x2\n,neg,x3\n')
    task = Task("polarity", "classification", train=str(named), dev=str(named), text_columns=("text",),
                labels=("neg", "pos"), id_column="id")
    data = load_task(task, "train", tokenizer, 16)
    assert data.labels == [1, 0] and data.ids == ["x1", "x2"]  # the blank text skipped
    assert build_head(task, Widths(8, 8, 4)).label_tensor(data.labels).dtype == torch.long
    scores = tmp_path / "scores.jsonl"
    scores.write_text('{"a": "a man", "b": "a dog", "score": 0.5}\n\n{"a": "x", "b": "y", "score": 1}\n')
    task = Task("rel", "pair-regression", train=str(scores), dev=str(scores), text_columns=("a", "b"),
                label_column="score", label_range=(0, 1), metric="spearman")
    data = load_task(task, "dev", tokenizer, 16)
    assert data.labels == [0.5, 1.0] and data.ids == ["1", "3"]
    assert build_head(task, Widths(8, 8, 4)).label_tensor(data.labels).dtype == torch.float32
    # a score rescaled from [h, 1] to the declared range
    assert build_head(task, Widths(8, 8, 4)).predictions(torch.tensor([0.0, 0.5])).tolist() == pytest.approx([0.0, 0.5])


def test_softmax_pair_head_is_sberts_classifier(tiny_bert_dir):
    """A softmax pair task's head reads (u, v, |u - v|), 3D wide, and its loss is cross-entropy."""
    torch.manual_seed(0)
    nli = Task("nli", "pair-classification", train="x", dev="y", text_columns=("p", "h"), num_classes=3,
               loss="softmax", dropout=0.0)
    model = MultitaskModel(SentenceEncoder.from_pretrained(tiny_bert_dir), [nli]).eval()
    head = model.heads["nli"][1]
    assert head.in_features == 3 * model.encoder.dim and head.out_features == 3
    u, v = torch.randn(4, model.encoder.dim), torch.randn(4, model.encoder.dim)
    logits = model.heads["nli"](torch.cat([u, v]))
    torch.testing.assert_close(logits, torch.cat([u, v, (u - v).abs()], dim=-1) @ head.weight.T + head.bias)
    assert isinstance(model.heads["nli"].criterion, losses.ClassificationLoss)


# ---- four tasks -----------------------------------------------------------------------------------
def test_four_tasks_from_a_task_file_and_from_python_give_the_same_weights(tiny_bert_dir, data_dir, tmp_path,
                                                                           monkeypatch):
    path = tmp_path / "tasks.yaml"
    path.write_text("- " + json.dumps(nli_entry(data_dir)) + "\n")
    out = tmp_path / "cli"
    reads, read = [], declarations.read_task_file
    monkeypatch.setattr(declarations, "read_task_file", lambda file: reads.append(file) or read(file))
    summary = quiet(argv(tiny_bert_dir, data_dir, out, "--task-file", path))
    assert reads == [str(path)]  # the task file read once: the checks and the run take the same tasks
    metrics = summary["metrics"]
    assert set(metrics) >= {"sst_acc", "qqp_acc", "sts_pearson", "nli_acc", "nli_acc_ci95"}
    assert metrics["mean_dev"] == pytest.approx(sum(metrics[k] for k in ("sst_acc", "qqp_acc", "sts_pearson",
                                                                         "nli_acc")) / 4)
    header, *rows = (out / "predictions" / "nli-dev-output.csv").read_text().splitlines()
    assert header == "id \t Predicted_Label " and len(rows) == 9 and {r.split(" , ")[1].strip() for r in rows} <= {"0", "1", "2"}
    model = MultitaskModel.from_pretrained(out)
    assert list(model.tasks) == ["sst", "qqp", "sts", "nli"] and model.tasks["nli"].labels[2] == "contradiction"
    assert json.loads((out / "config.json").read_text())["declared_tasks"][3]["name"] == "nli"

    # The same run from Python: tasks as objects, the trainer's keywords.
    set_seed(11711)
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    tasks = list(builtin_tasks(data_dir, sst_batch_size=4, qqp_batch_size=6, sts_batch_size=4).values())
    tasks.append(Task(**nli_entry(data_dir)))
    with contextlib.redirect_stdout(io.StringIO()):
        MultitaskTrainer(encoder, tasks, steps=3, eval_every=3, log_every=1, proj_dim=16, max_length=24, lr=1e-3,
                         device="cpu", precision="fp32", out_dir=str(tmp_path / "python")).fit()
    for name in ("model.safetensors", "heads.safetensors"):
        a, b = load_file(str(out / "last" / name)), load_file(str(tmp_path / "python" / "last" / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


# ---- bad input -----------------------------------------------------------------------------------------
BAD = {
    "unknown kind": ({"kind": "ranking"}, "unknown kind 'ranking'"),
    "missing column": ({"text_columns": ["premise", "claim"]}, "no column 'claim'"),
    "label outside the classes": ({"labels": None, "num_classes": 2}, "label '2' is not one of its classes (0..1)"),
    "score not a number": ({"kind": "pair-regression", "loss": None, "labels": None, "num_classes": None,
                            "label_column": "premise"}, "is not a number"),
    "two classes for the hinge": ({"loss": "cosine-hinge"}, "two classes"),
    "bad weight": ({"weight": -1}, "weight must be"),
    "unknown field": ({"colour": "red"}, "unknown field 'colour'"),
}


@pytest.mark.parametrize("case", [*BAD, "twice in one file", "empty train file", "undeclared --tasks",
                                  "unknown aggregator", "aggregator with one task", "negative smart weight"])
def test_bad_declarations_are_one_line_and_nothing_is_written(case, tiny_bert_dir, data_dir, tmp_path, capsys):
    entry = nli_entry(data_dir)
    entries = [entry]
    extra = []
    if case in BAD:
        entry.update(BAD[case][0])
        entry = {k: v for k, v in entry.items() if v is not None}
        entries = [entry]
        needle = BAD[case][1]
    elif case == "twice in one file":
        entries, needle = [entry, entry], "declared twice"
    elif case == "empty train file":
        (tmp_path / "empty.tsv").write_text("premise\thypothesis\tlabel\n")
        entry["train"], needle = str(tmp_path / "empty.tsv"), "no labeled rows"
    elif case == "undeclared --tasks":
        extra, needle = ["--tasks", "sst,snli"], "'snli' is not declared"
    elif case == "unknown aggregator":
        extra, needle = ["--aggregator", "bogus"], "bogus"
    elif case == "aggregator with one task":
        extra, needle = ["--aggregator", "pcgrad", "--tasks", "sst"], "at least two tasks"
    else:
        extra, needle = ["--smart-weight", "-1"], "--smart-weight"
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(entries))
    out = tmp_path / "run"
    args = argv(tiny_bert_dir, data_dir, out, "--task-file", path, *extra)
    if case in ("negative smart weight", "unknown aggregator"):  # the flag's own check: argparse's exit 2
        with pytest.raises(SystemExit) as e:
            run_main(command.run, args)
        assert e.value.code == 2
    else:
        assert run_main(command.run, args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    if case in BAD or case in ("twice in one file", "empty train file"):
        assert "'nli'" in err[0]  # names the task
    assert not out.exists()


def test_python_declarations_are_checked():
    with pytest.raises(UsageError, match="task 'x': num_classes"):
        Task("x", "classification", train="a", dev="b", num_classes=1)
    with pytest.raises(UsageError, match="task name 'Bad Name'"):
        Task("Bad Name", "classification", train="a", dev="b", num_classes=2)
    with pytest.raises(UsageError, match="reads 2 text column"):
        Task("x", "pair-regression", train="a", dev="b")
    with pytest.raises(UsageError, match="unknown setting 'sst_wieght'"):
        builtin_tasks(sst_wieght=1)
    with pytest.raises(UsageError, match="--task-sampling all"):
        MultitaskConfig(aggregator="pcgrad", task_sampling="proportional")


def test_a_malformed_row_names_the_task_file_and_line(tiny_bert_dir, tmp_path):
    tokenizer = SentenceEncoder.from_pretrained(tiny_bert_dir).tokenizer
    path = tmp_path / "bad.tsv"
    path.write_text("premise\thypothesis\tlabel\na\tb\t1\na\tb\n")
    task = Task("nli", "pair-classification", train=str(path), dev=str(path), text_columns=("premise", "hypothesis"),
                num_classes=3, loss="softmax")
    with pytest.raises(DataError, match=r"task 'nli': .*bad.tsv line 3: expected 3 fields, found 2"):
        load_task(task, "train", tokenizer, 16)
