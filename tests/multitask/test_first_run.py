"""A first stage-3 run (issue 66): evaluation that fits the run (a fixed sample during training,
every dev and test row once at the end, said before it starts), progress that is true (a pace
without the evaluations and the first step, never "0.0 steps/s"), a line for each phase after
training, what last/ keeps (--keep-last), the prediction files as the page describes them
(--prediction-labels name), the projector active in TensorBoard, and the pages' task files, which
are the ones shipped in examples/."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import multitask_argv
from helpers import quiet_multitask as quiet
from helpers import write_cs224n_files

from bertcf import SentenceEncoder
from bertcf.cli import run_main
from bertcf.multitask import MultitaskModel, builtin_tasks, command, evaluation
from bertcf.multitask.config import parse
from bertcf.multitask.data import load_data
from bertcf.multitask.declarations import declared_tasks
from bertcf.multitask.tasks import Task
from bertcf.utils import progress
from bertcf.utils.progress import Progress

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
N_DEV, N_TEST = 20, 8  # rows of each CS224N dev and test file here


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_cs224n_files(tmp_path_factory.mktemp("first-run"), n_dev=N_DEV, n_test=N_TEST)


def argv(bert_dir, data_dir, out_dir, *extra) -> list[str]:
    """multitask_argv for 4 steps with this file's settings: every training row, batches of 4, heads of 8, the
    default --log-every."""
    return multitask_argv(bert_dir, data_dir, out_dir, 4, *extra, log_every=None, qqp_batch_size=4, proj_dim=8,
                          max_train_examples=None)


# ---- scoring in chunks --------------------------------------------------------------------------------------
def test_scoring_in_chunks_gives_the_outputs_of_one_call(tiny_bert_dir, monkeypatch):
    """The progress of a scoring comes from encoding whole batches at a time: the outputs must be
    those of one call over every row, bit for bit (bi-encoded sentences and jointly read pairs)."""
    monkeypatch.setattr(evaluation, "CHUNK_BATCHES", 2)
    torch.manual_seed(0)
    rows = [torch.randint(5, 90, (int(n),)).tolist() for n in torch.randint(3, 40, (101,))]
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    shown = Progress("none", "score", len(rows), unit="sentence")
    lengths = [len(r) for r in rows]
    chunked = evaluation.in_chunks(lambda chunk: encoder.encode_ids([rows[i] for i in chunk], 8), lengths, 8, shown)
    assert shown.done == len(rows)
    assert torch.equal(chunked, encoder.encode_ids(rows, 8))

    model = MultitaskModel(encoder, [builtin_tasks()["qqp"]], proj_dim=8, pair_encoding="cross").eval()
    types = [[0] * (len(r) // 2) + [1] * (len(r) - len(r) // 2) for r in rows]
    joint = evaluation.in_chunks(lambda chunk: model.joint_head_outputs("qqp", [rows[i] for i in chunk],
                                                                   [types[i] for i in chunk], 8),
                                 lengths, 8)
    assert torch.equal(joint, model.joint_head_outputs("qqp", rows, types, 8))


# ---- the pace and the time left -----------------------------------------------------------------------------
def test_the_pace_leaves_out_the_first_step_and_the_evaluations(monkeypatch, capsys):
    """The issue's run printed '0.0 steps/s' and a time left that swung from 22 minutes to 8: the
    rate was the steps over all the time since the start, evaluations included. On a fake clock:
    a 100 s evaluation at step 0 (80 s of it scoring), a 30 s first step, then 2 s steps."""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(progress, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    shown = Progress("lines", "run", 10, evaluations=[0, 5, 10], finish=2.0)

    def pause(seconds, scoring, step):
        with shown.paused():
            clock.now += seconds
        shown.evaluated(step, "mean_dev", 0.5, 0.5, step, scoring)

    pause(100, 80, 0)
    for step, seconds in zip(range(1, 7), (30, 2, 2, 2, 2, 2)):
        clock.now += seconds
        shown.step(step)
        if step == 5:
            pause(50, 40, 5)
    lines = [line for line in capsys.readouterr().err.splitlines() if "eval" not in line]
    assert lines[0] == "run: step 1/10 (10%), 0:02:10 elapsed"  # the first step: no pace yet
    # 6 steps at 2 s, 2 evaluations at 100 s, the end (2 evaluations' scoring) at 80 s: 372 s
    assert lines[3] == "run: step 4/10 (40%), 2.0 s/step, 0:02:16 elapsed, ~0:06:12 left"
    # after a second evaluation (50 s, 40 of them scoring): 4 steps, 1 evaluation at 75 s, the end at 2 x 60 s
    assert lines[5] == "run: step 6/10 (60%), 2.0 s/step, 0:03:10 elapsed, ~0:03:23 left"
    assert progress.pace(300) == "300.0 s/step" and progress.pace(0.25) == "4.0 steps/s"  # never 0.0 steps/s


# ---- a first run ------------------------------------------------------------------------------------------------
@pytest.fixture
def scorings(monkeypatch) -> list:
    """(name, sentences) of every scoring, in order."""
    seen = []

    class Recorded(Progress):
        def __init__(self, mode, name, total, *args, **kwargs):
            seen.append((name, total))
            super().__init__(mode, name, total, *args, **kwargs)
    monkeypatch.setattr(evaluation, "Progress", Recorded)
    return seen


def test_a_run_evaluates_a_sample_then_every_row_once_and_says_so(tiny_bert_dir, data_dir, tmp_path, scorings,
                                                                   capsys):
    run_dir = tmp_path / "run"
    quiet(argv(tiny_bert_dir, data_dir, run_dir, "--max-eval-examples", 5, "--progress", "lines"))
    err = capsys.readouterr().err
    metrics = json.loads((run_dir / "metrics.json").read_text())
    sample = 5 + 2 * 5 + 2 * 5  # SST sentences, QQP and STS pairs
    every = (N_DEV + N_TEST) * (1 + 2 + 2)  # every dev and test row of the three tasks
    assert scorings == [("run: evaluate step 0", sample), ("run: evaluate step 2", sample),
                        ("run: evaluate step 4", sample), (f"run: score step {metrics['step']}", every)]
    assert {metrics[f"{t}_dev_examples"] for t in ("sst", "qqp", "sts")} == {N_DEV}
    assert err.splitlines()[1] == (f"run: 4 steps; evaluates at steps 0, 2, 4 ({sample} sentences each: a sample, "
                                   f"--max-eval-examples 5 rows a task); at the end the best checkpoint scores every "
                                   f"dev and test row ({every} sentences)")  # after the line of what it trains
    after = err[err.index("run: training done"):].splitlines()
    assert [re.sub(r" \(\d:\d\d:\d\d since training ended\)$", "", line) for line in after
            if not line.startswith("run: score")] == [
        f"run: training done; the best checkpoint (step {metrics['step']}) scores every dev and test row: {every} "
        f"sentences",
        f"run: predictions and metrics.json written to {run_dir}",
        f"run: TensorBoard: the projector (sst), PR curves (qqp), HParams written to {run_dir / 'tb'}"], after
    assert " 0.0 steps/s" not in err
    assert (run_dir / "last" / "training_state.pt").is_file()  # --keep-last state, the default


def test_without_a_cap_every_evaluation_scores_every_dev_row(tiny_bert_dir, data_dir, tmp_path, scorings, capsys):
    quiet(argv(tiny_bert_dir, data_dir, tmp_path / "run", "--steps", 2))
    every_dev = N_DEV * (1 + 2 + 2)
    assert [total for _, total in scorings[:-1]] == [every_dev, every_dev]
    assert f"({every_dev:,} sentences each: every dev row; --max-eval-examples N scores a sample)" in \
        capsys.readouterr().err


@pytest.mark.parametrize("keep", ["weights", "none"])
def test_keep_last_keeps_less_once_the_run_has_finished(tiny_bert_dir, data_dir, tmp_path, keep, capsys):
    run_dir = tmp_path / "run"
    quiet(argv(tiny_bert_dir, data_dir, run_dir, "--keep-last", keep))
    assert (run_dir / "best" / "model.safetensors").is_file() and (run_dir / "predictions").is_dir()
    assert not (run_dir / "last" / "training_state.pt").exists()
    assert (run_dir / "last").is_dir() == (keep == "weights")
    if keep == "weights":
        assert (run_dir / "last" / "model.safetensors").is_file()
    capsys.readouterr()
    assert run_main(command.run, ["--resume", "--out-dir", str(run_dir), "--steps", "6"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: --resume: {run_dir} finished and kept no training state (--keep-last weights or none); start a "
                   f"new run, from its best checkpoint with --encoder {run_dir / 'best'}"), err


def test_a_stopped_run_keeps_its_state_whatever_keep_last_says(tiny_bert_dir, data_dir, tmp_path, monkeypatch):
    """--keep-last acts once the predictions are written: a run that stops before can resume."""
    from bertcf.multitask import trainer

    def fail(*args, **kwargs):
        raise OSError("the disk is full")
    monkeypatch.setattr(trainer, "write_predictions", fail)
    with pytest.raises(OSError, match="the disk is full"):
        quiet(argv(tiny_bert_dir, data_dir, tmp_path / "run", "--keep-last", "none"))
    assert (tmp_path / "run" / "last" / "training_state.pt").is_file()


# ---- the prediction files ---------------------------------------------------------------------------------------
def test_prediction_files_as_the_page_describes_them(tiny_bert_dir, data_dir, tmp_path):
    """CS224N's layout for every task; ids are line numbers (a .jsonl's first row is 1, a .tsv's
    2, after its header); --prediction-labels name writes a declared task's class names, read back
    as the indices the default writes."""
    questions = ("name=questions,kind=classification,train=" + str(EXAMPLES / "questions-train.tsv") + ",dev="
                 + str(EXAMPLES / "questions-dev.tsv") + ",text_columns=question,labels=ABBR;DESC;ENTY;HUM;LOC;NUM")
    run_dir = tmp_path / "run"
    quiet(argv(tiny_bert_dir, data_dir, run_dir, "--task-file", EXAMPLES / "snli.yaml", "--task", questions,
               "--prediction-labels", "name"))
    files = run_dir / "predictions"
    snli = (files / "snli-dev-output.csv").read_text().splitlines()
    assert snli[0] == "id \t Predicted_Label "
    assert [line.split(" , ")[0] for line in snli[1:]] == [str(i) for i in range(1, 76)]
    assert all(re.fullmatch(r"\d+ , (entailment|neutral|contradiction) ", line) for line in snli[1:]), snli[:3]
    tsv = (files / "questions-dev-output.csv").read_text().splitlines()
    assert [line.split(" , ")[0] for line in tsv[1:]] == [str(i) for i in range(2, 26)]
    assert all(re.fullmatch(r"\d+ , (ABBR|DESC|ENTY|HUM|LOC|NUM) ", line) for line in tsv[1:])
    sst = (files / "sst-dev-output.csv").read_text().splitlines()
    assert sst[0] == "id \t Predicted_Sentiment " and all(re.fullmatch(r"\w+ , [0-4] ", line) for line in sst[1:])

    quiet(["--predict-only", "--checkpoint", str(run_dir), "--out-dir", str(tmp_path / "again"), "--device", "cpu"])
    tasks = {t.name: t for t in declared_tasks(parse(["--data-dir", str(data_dir), "--task-file",
                                                      str(EXAMPLES / "snli.yaml"), "--task", questions]))}
    for name in ("snli", "questions"):
        file = f"{name}-dev-output.csv"
        names = evaluation.read_predictions(files / file, tasks[name])
        indices = evaluation.read_predictions(tmp_path / "again" / "predictions" / file, tasks[name])
        assert names == indices and set(indices.values()) <= set(map(float, range(tasks[name].num_classes)))


# ---- TensorBoard ----------------------------------------------------------------------------------------------
def test_tensorboard_lists_the_projector_of_a_finished_run(tiny_bert_dir, data_dir, tmp_path):
    """TensorBoard decides in a background thread whether the projector has data, so its first
    listing says inactive (what the issue saw); within seconds it must say active."""
    from tensorboard import program
    from tensorboard.backend import application
    from werkzeug.test import Client

    quiet(argv(tiny_bert_dir, data_dir, tmp_path / "run", "--progress", "none"))
    board = program.TensorBoard()
    board.configure(argv=[None, "--logdir", str(tmp_path / "run" / "tb"), "--load_fast", "false"])
    provider, multiplexer = board._make_data_provider()
    client = Client(application.TensorBoardWSGIApp(board.flags, board.plugin_loaders, provider,
                                                   board.assets_zip_provider, multiplexer))
    listed = []
    for _ in range(40):
        listed.append(json.loads(client.get("/data/plugins_listing").get_data())["projector"]["enabled"])
        if listed[-1]:
            break
        time.sleep(0.25)
    assert listed[-1], f"the projector never became active: {listed}"


# ---- the pages' task files ---------------------------------------------------------------------------------------
def yaml_blocks(page: Path) -> list[str]:
    """The YAML blocks of a page, their indentation (a block in a list item) removed."""
    blocks = re.finditer(r"^( *)```yaml\n(.*?)^\1```", page.read_text(encoding="utf-8"), re.M | re.S)
    return [re.sub(rf"^{m.group(1)}", "", m.group(2), flags=re.M) for m in blocks]


@pytest.mark.parametrize("page", ["README.md", "docs/multitask.md"])
def test_the_pages_task_files_are_the_shipped_ones(page, tiny_bert_dir):
    """Each task file a page shows is the file in examples/ its first line names, every field as
    shipped, and it declares tasks whose files load."""
    blocks = yaml_blocks(ROOT / page)
    assert blocks, page
    tokenizer = SentenceEncoder.from_pretrained(tiny_bert_dir).tokenizer
    for block in blocks:
        name = re.match(r"# (examples/[\w.-]+\.yaml)", block).group(1)
        assert block == (ROOT / name).read_text(encoding="utf-8"), f"{page}'s {name} is not the shipped file"
        declared = [t for t in declared_tasks(parse(["--task-file", str(ROOT / name)])) if not t.reader]
        assert declared and all(isinstance(t, Task) for t in declared)
        data = load_data(declared, tokenizer, 32)
        assert all(len(data[t.name, "dev"]) == 75 for t in declared)


def test_the_task_flag_example_declares_its_labels(tiny_bert_dir):
    """The page's --task example names its classes (labels=A;B;...), so the sample's label names
    are read; the same declaration with num_classes=6 alone refuses them, in one line."""
    text = (ROOT / "docs" / "multitask.md").read_text(encoding="utf-8")
    flag = re.search(r"--task '([^']+)'", text).group(1)
    assert "labels=ABBR;DESC;ENTY;HUM;LOC;NUM" in flag
    tokenizer = SentenceEncoder.from_pretrained(tiny_bert_dir).tokenizer
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)  # the example's paths are the repository's
        (task,) = declared_tasks(parse(["--task", flag, "--tasks", "questions"]))
        data = load_data([task], tokenizer, 32)
        assert sorted(set(data["questions", "dev"].labels)) == list(range(6))
        numbered = flag.replace("labels=ABBR;DESC;ENTY;HUM;LOC;NUM", "num_classes=6")
        with pytest.raises(Exception, match="label 'ABBR' is not one of its classes"):
            load_data(declared_tasks(parse(["--task", numbered, "--tasks", "questions"])), tokenizer, 32)
