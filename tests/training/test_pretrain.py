"""The self-supervised stages end to end (run_pretrain.py: bertcf.commands.pretrain): tiny random BERT, a few dozen
sentences, a handful of steps on the CPU. Run directory layout, TensorBoard, resume
bit-identity, the joint/flow stages, bad input and Ctrl-C."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
from pathlib import Path

import pytest
import torch
from helpers import (
    PRETRAIN_WORDS,
    REPO,
    assert_one_error_line,
    base_args,
    exit_status,
    run_quiet,
    tensors,
    torchrun,
    training_state,
)
from safetensors.torch import save_file

from bertcf import cli, runs
from bertcf.cli import run_main
from bertcf.commands import pretrain
from bertcf.config import pretrain as pretrain_config
from bertcf.config.pretrain import RUN_DATA, SELECTION_LABEL, PretrainConfig
from bertcf.errors import UsageError
from bertcf.training.loop import closing_line
from bertcf.utils.memory import peak_memory_mb
from minbert import CheckpointError


MIRROR_SCALARS = ["train/loss", "train/lr", "train/peak_rss_mb", "train/pos_cosine", "train/neg_cosine",
                  "train/sentences_per_second", "eval/sts_spearman", "eval/sts_spearman_ci95_lo",
                  "eval/sts_spearman_ci95_hi", "eval/alignment", "eval/uniformity"]
FLOW_SCALARS = ["train/l_flow_nats", "train/l_flow_bits_per_dim", "train/l_mirror", "train/logdet", "train/latent_norm",
                "eval/latent_mean_norm", "eval/latent_log10_eig_ratio"]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: one intra-op thread


# ---- helpers and fixtures ----------------------------------------------------------------------
def assert_same_tensors(a: dict, b: dict):
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"tensors differ: {different[:5]}"


def tb_tags(run_dir) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(Path(run_dir) / "tb"), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def metrics_lines(run_dir) -> list[dict]:
    return [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if l.strip()]


@pytest.fixture(scope="module")
def mirror_run(tiny_bert_dir, data_dir, tmp_path_factory):
    """A 6-step mirror run (lr high enough that the encoder moves), evaluated every 3 steps."""
    out = tmp_path_factory.mktemp("runs") / "mirror"
    summary, stdout = run_quiet(base_args(tiny_bert_dir, data_dir, out, lr=3e-3))
    return out, summary, stdout


@pytest.fixture(scope="module")
def mirror_reference(tiny_bert_dir, data_dir, tmp_path_factory):
    """An uninterrupted 6-step mirror run at the default lr: the reference for resume tests."""
    out = tmp_path_factory.mktemp("runs") / "mirror-ref"
    run_quiet(base_args(tiny_bert_dir, data_dir, out))
    return out


# ---- the mirror stage end to end -----------------------------------------------------------------
def test_mirror_run_writes_run_directory(mirror_run, tiny_bert_dir):
    out, summary, stdout = mirror_run
    for name in ("config.json", "metrics.jsonl", "tb", "best", "last"):
        assert (out / name).exists(), name
    assert not any(p.name.startswith(".") for p in out.iterdir()), "temporary checkpoint directories left behind"
    assert summary["step"] == 6 and not summary["interrupted"]
    # A trained encoder is written anew at every checkpoint (no hard link between them).
    assert (out / "best" / "model.safetensors").stat().st_ino != (out / "last" / "model.safetensors").stat().st_ino

    # config.json: every setting used, including the resolved ones.
    config = json.loads((out / "config.json").read_text())
    for key, value in {"stage": "mirror", "method": "mirror", "span_p": 0.3, "span_cap": 5, "temperature": 0.05,
                       "lr": 3e-3, "batch_size": 4, "steps": 6, "seed": 11711, "pooling": "mean",
                       "dropout": 0.1, "weight_decay": 0.01, "max_length": 24, "device": "cpu",
                       "precision": "fp32"}.items():
        assert config[key] == value, key

    # metrics.jsonl: step 0 first (the untouched encoder), then every eval, with sts_spearman.
    lines = metrics_lines(out)
    assert [m["step"] for m in lines] == [0, 3, 6]
    assert all({"sts_spearman", "alignment", "uniformity"} <= m.keys() for m in lines)
    assert all(m["sts_spearman_ci95"][0] <= m["sts_spearman"] <= m["sts_spearman_ci95"][1] for m in lines)
    assert summary["first"] == pytest.approx(lines[0]["sts_spearman"])
    best = max(lines, key=lambda m: m["sts_spearman"])
    assert summary["best"] == pytest.approx(best["sts_spearman"]) and summary["best_step"] == best["step"]

    # The final print names the step-0 and best Spearman and where best/ is.
    assert f"step 0 {lines[0]['sts_spearman']:.4f}" in stdout
    assert f"best {best['sts_spearman']:.4f}" in stdout and str(out / "best") in stdout

    # last/: full training state at the last step.
    state = training_state(out)
    assert state["step"] == 6
    assert {"modules", "optimizer", "scheduler", "samplers", "rng", "extra"} <= state.keys()
    assert (out / "last" / "model.safetensors").is_file()
    assert not (out / "last" / "flow.safetensors").exists()
    # The encoder was trained.
    initial, last = tensors(Path(tiny_bert_dir) / "model.safetensors"), tensors(out / "last" / "model.safetensors")
    assert any(not torch.equal(initial[k], last[k]) for k in last if k in initial)


def test_mirror_best_loads_in_sentence_encoder_and_transformers(mirror_run):
    import transformers

    from bertcf import SentenceEncoder

    out, summary, _ = mirror_run
    encoder = SentenceEncoder.from_pretrained(out / "best")
    assert encoder.flow is None and encoder.max_length == 64  # whole sentences: the model's limit
    vectors = encoder.encode(["a man plays the guitar in the park", "two dogs run"])
    assert vectors.shape == (2, 32) and torch.isfinite(vectors).all()

    hf = transformers.BertModel.from_pretrained(str(out / "best")).eval()
    batch = encoder.tokenize(["a man plays the guitar in the park", "two dogs run"])
    with torch.no_grad():
        ours = encoder.bert.eval()(batch["input_ids"], batch["attention_mask"])["last_hidden_state"]
        theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(ours[mask], theirs[mask], atol=1e-4, rtol=1e-4)
    # best/ holds the weights of the best evaluation: re-evaluating it gives the best Spearman.
    from bertcf.data.tasks import read_sts
    from bertcf.evaluation.metrics import evaluate_sts
    pairs = read_sts(Path(json.loads((out / "config.json").read_text())["data_dir"]) / "sts-dev.csv")
    assert evaluate_sts(encoder, pairs)["sts_spearman"] == pytest.approx(summary["best"], abs=1e-6)


def test_sentence_encoder_loads_a_run_directory(mirror_run):
    from bertcf import SentenceEncoder

    out = mirror_run[0]
    assert (out / "config.json").is_file()  # the run's settings: not what makes it a checkpoint
    sentence = ["a man plays the guitar in the park"]
    assert torch.equal(SentenceEncoder.from_pretrained(out).encode(sentence),
                       SentenceEncoder.from_pretrained(out / "best").encode(sentence))


def test_mirror_tensorboard_events(mirror_run):
    out, _, _ = mirror_run
    acc = tb_tags(out)
    scalars = set(acc.Tags()["scalars"])
    missing = [t for t in MIRROR_SCALARS if t not in scalars]
    assert not missing, f"missing scalars {missing}; have {sorted(scalars)}"
    assert "eval/sts_dev_cosines" in acc.Tags()["histograms"]
    assert [e.step for e in acc.Scalars("eval/sts_spearman")] == [0, 3, 6]
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    assert all(e.value == pytest.approx(3e-3) for e in acc.Scalars("train/lr"))
    assert all(e.value > 0 for e in acc.Scalars("train/sentences_per_second"))
    peaks = [e.value for e in acc.Scalars("train/peak_rss_mb")]  # the process's, so far: never falls
    assert len(peaks) == 6 and peaks[0] > 0 and peaks == sorted(peaks)
    assert len(acc.Histograms("eval/sts_dev_cosines")) == 3
    assert acc.Histograms("eval/sts_dev_cosines")[0].histogram_value.num == 16


def test_simcse_runs_with_dropout_only(tiny_bert_dir, data_dir, tmp_path, monkeypatch):
    from bertcf.objectives import mirror

    calls = []
    real = mirror.span_mask

    def spy(ids, mask, special, mask_id, p, cap, generator):
        out = real(ids, mask, special, mask_id, p, cap, generator)
        calls.append((cap, torch.equal(out, ids)))
        return out
    monkeypatch.setattr(mirror, "span_mask", spy)
    summary, _ = run_quiet(base_args(tiny_bert_dir, data_dir, tmp_path / "simcse", steps=3, method="simcse"))
    assert summary["step"] == 3
    assert json.loads((tmp_path / "simcse" / "config.json").read_text())["span_cap"] == 0
    assert calls == [(0, True)] * 3
    assert (tmp_path / "simcse" / "best" / "model.safetensors").is_file()


def test_corpus_from_tasks(tiny_bert_dir, tiny_data_dir, tmp_path):
    out = tmp_path / "tasks"
    summary, _ = run_quiet(base_args(tiny_bert_dir, tiny_data_dir, out, steps=2, corpus=None,
                                     corpus_from_tasks=True, eval_every=2))
    assert summary["step"] == 2 and (out / "best").is_dir()
    assert json.loads((out / "config.json").read_text())["corpus_from_tasks"] is True


# ---- resume -----------------------------------------------------------------------------------
def test_mirror_resume_is_bit_identical(mirror_reference, tiny_bert_dir, data_dir, tmp_path):
    out = tmp_path / "resumed"
    run_quiet(base_args(tiny_bert_dir, data_dir, out, steps=4))  # stopped after 4 of 6 steps
    assert training_state(out)["step"] == 4
    summary, _ = run_quiet(["--resume", "--out-dir", str(out), "--steps", "6"])
    assert summary["step"] == 6
    assert_same_tensors(tensors(out / "last" / "model.safetensors"),
                        tensors(mirror_reference / "last" / "model.safetensors"))
    # The resumed run kept its settings (from config.json) and its step-0 score.
    assert json.loads((out / "config.json").read_text())["steps"] == 6
    assert summary["first"] == pytest.approx(metrics_lines(mirror_reference)[0]["sts_spearman"])
    assert [m["step"] for m in metrics_lines(out)] == [0, 3, 4, 6]


def test_joint_resume_is_bit_identical(mirror_run, tiny_bert_dir, data_dir, tmp_path):
    init = tmp_path / "init"
    shutil.copytree(mirror_run[0] / "best", init)
    joint = dict(stage="joint", init=init, model=None)
    full, part = tmp_path / "full", tmp_path / "part"
    run_quiet(base_args(tiny_bert_dir, data_dir, full, steps=5, **joint))
    run_quiet(base_args(tiny_bert_dir, data_dir, part, steps=2, **joint))
    # The frozen encoder is not in the training state (last/model.safetensors holds it) ...
    assert set(training_state(part)["modules"]) == {"flow"}
    # ... and the resumed run takes it from there, even when --init has changed since.
    weights = tensors(init / "model.safetensors")
    save_file({k: v + 1.0 if v.is_floating_point() else v for k, v in weights.items()}, str(init / "model.safetensors"))
    run_quiet(["--resume", "--out-dir", str(part), "--steps", "5"])
    for name in ("model.safetensors", "flow.safetensors"):
        assert_same_tensors(tensors(part / "last" / name), tensors(full / "last" / name))
    assert training_state(part)["step"] == 5


def test_stage_2_as_the_readme_writes_it_takes_the_data_of_its_init_run(mirror_run, tiny_bert_dir, data_dir,
                                                                         tmp_path, capsys):
    """README: `run_pretrain.py --stage joint --init runs/<mirror run>`, no data flags: the mirror
    run's --data-dir and --corpus (its config.json), said on stderr in one line."""
    out = tmp_path / "joint"
    capsys.readouterr()
    argv = base_args(tiny_bert_dir, data_dir, out, steps=1, stage="joint", init=mirror_run[0], model=None,
                     corpus=None, **{"data-dir": None})
    assert not any(flag in argv for flag in ("--data-dir", "--corpus", "--corpus-from-tasks"))
    summary, _ = run_quiet(argv)
    assert summary["step"] == 1
    notes = [l for l in capsys.readouterr().err.splitlines() if l.startswith("note:")]
    assert notes == [f"note: --init {mirror_run[0]}: its data, as no flag here gives them: --data-dir {data_dir} "
                     f"--corpus {data_dir / 'corpus.txt'}"]
    config = json.loads((out / "config.json").read_text())
    assert (config["data_dir"], config["corpus"]) == (str(data_dir), str(data_dir / "corpus.txt"))


def with_init_data(argv) -> PretrainConfig:
    """The settings of ``argv`` with what --init's run gives (``config.pretrain.data_from_init``)."""
    parser = pretrain_config.build_parser()
    config = PretrainConfig(**vars(parser.parse_args(argv)))
    return config.replace(**pretrain_config.data_from_init(config, cli.given_flags(parser, argv)))


def data_flags(argv) -> dict:
    config = with_init_data(argv)
    return {k: getattr(config, k) for k in RUN_DATA}


def test_init_data_flags_on_the_command_line_win(tmp_path, tiny_bert_dir, capsys):
    run = tmp_path / "run"
    (run / "best").mkdir(parents=True)
    settings = dict(data_dir="/data/a", corpus=None, corpus_from_tasks=True, min_words=3, max_sentences=100,
                    senteval_dir="/data/senteval", steps=7, lr=0.5)
    (run / "config.json").write_text(json.dumps(settings))
    taken = {k: settings[k] for k in RUN_DATA}
    for init in (run, run / "best"):
        assert data_flags(["--init", str(init)]) == taken
    assert "--data-dir /data/a --corpus-from-tasks --min-words 3 --max-sentences 100" in capsys.readouterr().err
    # a flag given wins, even at its default value; --corpus keeps the run's --corpus-from-tasks out
    assert data_flags(["--init", str(run), "--data-dir", "data", "--corpus", "c.txt", "--min-words", "6"]) == (
        taken | dict(data_dir="data", corpus="c.txt", corpus_from_tasks=False, min_words=6))
    assert data_flags(["--init", str(run), "--corpus-from-tasks"])["data_dir"] == "/data/a"
    capsys.readouterr()
    # nothing is taken from a checkpoint outside a run, nor under --resume (the resumed run's own
    # config.json gives its settings), and the other settings never are
    defaults = data_flags([])
    assert data_flags(["--init", str(tiny_bert_dir)]) == defaults
    assert data_flags(["--init", str(run), "--resume", "--out-dir", "x"]) == defaults
    assert "note:" not in capsys.readouterr().err
    config = with_init_data(["--init", str(run)])
    assert (config.steps, config.lr) == (10_000, None)
    assert [PretrainConfig().to_dict()[k] for k in RUN_DATA] == ["data", None, False, 6, None, None]
    (run / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json .* is not a readable JSON file"):
        data_flags(["--init", str(run)])


def test_resume_of_a_state_from_another_version_is_one_clear_line(mirror_run, tiny_bert_dir, data_dir, tmp_path,
                                                                  capsys):
    part = tmp_path / "part"
    run_quiet(base_args(tiny_bert_dir, data_dir, part, steps=2, stage="joint", init=mirror_run[0], model=None))
    state = torch.load(part / "last" / "training_state.pt", weights_only=False)
    state["modules"] = {"encoder": {}}  # what an older version wrote
    torch.save(state, part / "last" / "training_state.pt")
    capsys.readouterr()
    assert run_main(pretrain.run, ["--resume", "--out-dir", str(part), "--steps", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds encoder, not flow" in err[0] and "Traceback" not in err[0]


def test_resume_without_a_run_is_an_error(tmp_path, capsys):
    assert run_main(pretrain.run, ["--resume", "--out-dir", str(tmp_path / "nothing")]) == 2
    assert_one_error_line(capsys, "--resume")
    assert run_main(pretrain.run, ["--resume"]) == 2
    assert_one_error_line(capsys, "--out-dir")


def test_existing_run_directory_needs_resume(mirror_run, tiny_bert_dir, data_dir, capsys):
    out = mirror_run[0]
    assert run_main(pretrain.run, base_args(tiny_bert_dir, data_dir, out)) == 2
    assert_one_error_line(capsys, "--resume")


# ---- the joint and flow stages ---------------------------------------------------------------------
def flow_flags(flow: dict) -> dict:
    return {k: bool(v) for k, v in flow.items() if k.endswith("initialized")}


def test_joint_stage_trains_only_the_flow(mirror_run, tiny_bert_dir, data_dir, tmp_path):
    from bertcf import SentenceEncoder

    init = mirror_run[0]
    out = tmp_path / "joint"
    summary, stdout = run_quiet(base_args(tiny_bert_dir, data_dir, out, steps=4, eval_every=2, stage="joint",
                                          init=init, model=None))
    assert summary["step"] == 4 and "best checkpoint" in stdout
    mirror_weights = tensors(init / "best" / "model.safetensors")
    for ckpt in ("best", "last"):
        assert_same_tensors(tensors(out / ckpt / "model.safetensors"), mirror_weights)
        assert (out / ckpt / "flow.safetensors").is_file()
    # The frozen encoder was written once and hard-linked into every later checkpoint.
    assert (out / "best" / "model.safetensors").stat().st_ino == (out / "last" / "model.safetensors").stat().st_ino
    assert (out / "last" / "model.safetensors").stat().st_nlink == 2
    flow = tensors(out / "last" / "flow.safetensors")
    flags = flow_flags(flow)
    assert flags and all(flags.values()), flags  # every ActNorm initialised from data
    # The flow was trained: ActNorm biases set from the data, the zero-initialised last
    # coupling layers have moved.
    assert any(flow[k].abs().sum() > 0 for k in flow if k.endswith("actnorm.bias"))
    assert all(flow[k].abs().sum() > 0 for k in flow if k.endswith("net.6.weight"))
    config = json.loads((out / "config.json").read_text())
    assert config["lr"] == 3e-4 and config["lambda_mirror"] == 0.3 and not config["unfreeze_encoder"]
    assert config["flow_loss_unit"] == "bits-per-dim" and config["encoder_lr"] == 1e-4
    assert config["eval_max_length"] == 64  # the tiny model's max_position_embeddings

    encoder = SentenceEncoder.from_pretrained(out / "best")
    assert encoder.flow is not None and bool(encoder.flow.blocks[0].actnorm.initialized) == (summary["best_step"] > 0)
    assert torch.isfinite(encoder.encode(["a man plays the guitar"])).all()

    acc = tb_tags(out)
    scalars = set(acc.Tags()["scalars"])
    missing = [t for t in MIRROR_SCALARS + FLOW_SCALARS if t not in scalars]
    assert not missing, f"missing scalars {missing}"
    assert "eval/sts_dev_cosines" in acc.Tags()["histograms"]
    assert all(e.value > 0 for e in acc.Scalars("train/l_mirror"))
    # L_flow is logged in both units; the loss is 0.3 L_mirror + L_flow in bits per dimension.
    ln2_d = math.log(2) * 32
    for nats, bpd, mirror, loss in zip(*(acc.Scalars(f"train/{t}") for t in
                                         ("l_flow_nats", "l_flow_bits_per_dim", "l_mirror", "loss"))):
        assert bpd.value == pytest.approx(nats.value / ln2_d, rel=1e-5)
        assert loss.value == pytest.approx(0.3 * mirror.value + bpd.value, rel=1e-4, abs=1e-5)
    assert [m["step"] for m in metrics_lines(out)] == [0, 2, 4]
    assert all("latent_mean_norm" in m and "latent_log10_eig_ratio" in m for m in metrics_lines(out))


def test_joint_unfreeze_encoder_changes_encoder(mirror_run, tiny_bert_dir, data_dir, tmp_path, capsys):
    init = mirror_run[0]
    out = tmp_path / "unfrozen"
    run_quiet(base_args(tiny_bert_dir, data_dir, out, steps=3, stage="joint", init=init, model=None,
                        unfreeze_encoder=True, lr=1e-3, encoder_lr=2e-3))
    before, after = tensors(init / "best" / "model.safetensors"), tensors(out / "last" / "model.safetensors")
    changed = [k for k in after if not torch.equal(before[k], after[k])]
    assert changed and any("encoder.layer" in k for k in changed)
    assert (out / "last" / "flow.safetensors").is_file()
    # The encoder's parameters are an optimiser group of their own at --encoder-lr; the flow keeps --lr.
    groups = training_state(out)["optimizer"]["param_groups"]
    sizes = {lr: sum(len(g["params"]) for g in groups if g["lr"] == lr) for lr in {g["lr"] for g in groups}}
    from bertcf import SentenceEncoder
    encoder = SentenceEncoder.from_pretrained(out / "last")
    assert sizes == {1e-3: len(list(encoder.flow.parameters())), 2e-3: len(list(encoder.bert.parameters()))}
    assert json.loads((out / "config.json").read_text())["encoder_lr"] == 2e-3
    # --init with a flow of its own: that flow trains on, and flags asking for another one say so.
    capsys.readouterr()
    run_quiet(base_args(tiny_bert_dir, data_dir, tmp_path / "again", steps=1, stage="joint", init=out / "last",
                        model=None, flow_blocks=1))
    assert "--init already has a flow (3 blocks" in capsys.readouterr().err


def test_flow_stage_writes_flow(tiny_bert_dir, data_dir, tmp_path):
    out = tmp_path / "flow"
    summary, _ = run_quiet(base_args(tiny_bert_dir, data_dir, out, steps=3, stage="flow"))
    assert summary["step"] == 3
    config = json.loads((out / "config.json").read_text())
    assert config["method"] == "flow" and config["stage"] == "flow"
    assert (out / "best" / "flow.safetensors").is_file() and (out / "last" / "flow.safetensors").is_file()
    flags = flow_flags(tensors(out / "last" / "flow.safetensors"))
    assert flags and all(flags.values())
    # MinBERT-flow: the plain encoder is untouched.
    original = tensors(Path(tiny_bert_dir) / "model.safetensors")
    saved = tensors(out / "last" / "model.safetensors")
    assert set(saved) <= set(original)
    assert all(torch.equal(saved[k], original[k]) for k in saved)
    scalars = set(tb_tags(out).Tags()["scalars"])
    assert {"train/l_flow_nats", "train/l_flow_bits_per_dim", "train/logdet", "eval/latent_mean_norm",
            "eval/latent_log10_eig_ratio"} <= scalars
    # --flow-loss-unit nats trains the NLL itself; the logged nats equal the loss.
    out = tmp_path / "flow-nats"
    run_quiet(base_args(tiny_bert_dir, data_dir, out, steps=2, stage="flow", flow_loss_unit="nats"))
    acc = tb_tags(out)
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx(
        [e.value for e in acc.Scalars("train/l_flow_nats")], rel=1e-6)
    assert json.loads((out / "config.json").read_text())["flow_loss_unit"] == "nats"


def test_evaluation_encodes_whole_sentences(tiny_bert_dir, data_dir, tmp_path):
    """Training truncates to --max-length; the STS-dev evaluation (and the checkpoint's encode)
    reads whole sentences: the best/ encoder keeps the model's limit, and a sentence longer than
    --max-length gets another vector than its truncation."""
    from bertcf import SentenceEncoder

    out = tmp_path / "mirror"
    run_quiet(base_args(tiny_bert_dir, data_dir, out, steps=1, eval_every=1, max_length=8))
    encoder = SentenceEncoder.from_pretrained(out / "best")
    assert encoder.max_length == 64 and json.loads((out / "config.json").read_text())["eval_max_length"] == 64
    long = " ".join(PRETRAIN_WORDS[:30])
    assert encoder.tokenize([long])["input_ids"].shape[1] > 8
    assert not torch.allclose(encoder.encode(long), encoder.encode(long, max_length=8))
    # --eval-max-length caps it.
    run_quiet(base_args(tiny_bert_dir, data_dir, tmp_path / "capped", steps=1, eval_every=1, eval_max_length=16))
    assert SentenceEncoder.from_pretrained(tmp_path / "capped" / "best").max_length == 16


# ---- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["missing-corpus", "empty-corpus", "short-corpus", "missing-sts-dev", "empty-sts-dev",
                                  "unknown-method", "flow-method-for-mirror", "batch-size-1", "span-p-0",
                                  "span-p-1.5", "missing-model", "select-on-mlm-heldout-for-mirror"])
def test_bad_input_is_one_line_and_status_2(case, tiny_bert_dir, data_dir, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "sts-dev.csv").write_bytes((data_dir / "sts-dev.csv").read_bytes())
    (data / "corpus.txt").write_bytes((data_dir / "corpus.txt").read_bytes())
    flags, needle = {}, ""
    if case == "missing-corpus":
        flags, needle = {"corpus": data / "nope.txt"}, "nope.txt"
    elif case == "empty-corpus":
        (data / "corpus.txt").write_text("")
        needle = "empty"
    elif case == "short-corpus":
        (data / "corpus.txt").write_text("too short\n\nfour words only here\n")
        needle = "corpus"
    elif case == "missing-sts-dev":
        (data / "sts-dev.csv").unlink()
        needle = "sts-dev.csv"
    elif case == "empty-sts-dev":
        (data / "sts-dev.csv").write_text("")
        needle = "sts-dev.csv"
    elif case == "unknown-method":
        flags, needle = {"method": "bogus"}, "--method"
    elif case == "flow-method-for-mirror":
        flags, needle = {"method": "flow"}, "--method"
    elif case == "batch-size-1":
        flags, needle = {"batch_size": 1}, "--batch-size"
    elif case == "span-p-0":
        flags, needle = {"span_p": 0}, "--span-p"
    elif case == "span-p-1.5":
        flags, needle = {"span_p": 1.5}, "--span-p"
    elif case == "missing-model":
        flags, needle = {"model": tmp_path / "no-such-bert"}, "no-such-bert"
    elif case == "select-on-mlm-heldout-for-mirror":
        flags, needle = {"select_on": "mlm-heldout"}, "--select-on mlm-heldout is for --method mlm"
    out = tmp_path / "run"
    assert exit_status(base_args(tiny_bert_dir, data, out, **flags)) == 2
    assert_one_error_line(capsys, needle)
    assert not (out / "last").exists() and not (out / "metrics.jsonl").exists()


def test_init_from_a_run_directory_without_best_is_one_clear_line(mirror_run, tiny_bert_dir, data_dir, tmp_path,
                                                                   capsys):
    # A run stopped before its first evaluation: settings, TensorBoard and last/, but no best/.
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    for name in ("config.json", "metrics.jsonl"):
        (stopped / name).write_bytes((mirror_run[0] / name).read_bytes())
    (stopped / "tb").mkdir()
    out = tmp_path / "run"
    argv = base_args(tiny_bert_dir, data_dir, out, steps=1, stage="joint", init=stopped, model=None)
    assert exit_status(argv) == 2
    assert_one_error_line(capsys, str(stopped), "best/")
    assert not (out / "last").exists() and not (out / "metrics.jsonl").exists()


def test_config_only_model_without_tokenizer_names_vocab(tiny_bert_dir, vocab_path, data_dir, tmp_path, capsys):
    """--model DIR with only a config.json: one line naming --vocab FILE; with it, the run starts."""
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    shutil.copy(tiny_bert_dir / "config.json", config_only)
    argv = base_args(config_only, data_dir, tmp_path / "run", steps=1)
    assert exit_status(argv) == 2
    assert_one_error_line(capsys, f"{config_only} has no tokenizer files", "give one with --vocab FILE")
    summary, _ = run_quiet(argv + ["--vocab", str(vocab_path)])
    assert summary["step"] == 1


def test_span_p_one_is_accepted(tiny_bert_dir, data_dir, tmp_path):
    summary, _ = run_quiet(base_args(tiny_bert_dir, data_dir, tmp_path / "p1", steps=1, span_p=1.0))
    assert summary["step"] == 1


# ---- non-finite loss and Ctrl-C ----------------------------------------------------------------------
def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tiny_bert_dir, data_dir, tmp_path, monkeypatch,
                                                              capsys):
    """The 5th step's loss is NaN (injected); checkpoints are every 2 steps, logging every 10:
    the run stops at the next checkpoint with a message naming step 5, and last/ is step 4's."""
    from bertcf.objectives import mirror

    calls = {"n": 0}

    class NaNAtStep5(mirror.InfoNCE):
        def forward(self, a, b):
            calls["n"] += 1
            loss = super().forward(a, b)
            return loss * float("nan") if calls["n"] >= 5 else loss
    monkeypatch.setattr(mirror, "InfoNCE", NaNAtStep5)
    out = tmp_path / "nan"
    assert run_main(pretrain.run, base_args(tiny_bert_dir, data_dir, out, steps=8, eval_every=2, log_every=10)) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    errors = [l for l in captured.err.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and "step 5" in errors[0] and "nan" in errors[0], captured.err
    assert calls["n"] == 6  # stopped at the checkpoint after step 5, not at the end
    state = training_state(out)
    assert state["step"] == 4
    for ckpt in ("last", "best"):
        weights = tensors(out / ckpt / "model.safetensors")
        assert all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())
    assert all(torch.isfinite(v).all() for v in state["modules"]["encoder"].values() if v.is_floating_point())
    assert [m["step"] for m in metrics_lines(out)] == [0, 2, 4]


def interrupt_after(monkeypatch, n_steps: int, times: int = 1, signum=signal.SIGINT):
    """Send ``signum`` to this process during step ``n_steps`` (from the span sampler, called once a step)."""
    from bertcf.objectives import mirror

    calls = {"n": 0}
    real = mirror.span_mask

    def hook(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n_steps:
            for _ in range(times):
                os.kill(os.getpid(), signum)
        return real(*args, **kwargs)
    monkeypatch.setattr(mirror, "span_mask", hook)
    return calls


def test_ctrl_c_writes_last_and_resumes(mirror_reference, tiny_bert_dir, data_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "interrupted"
    handler = signal.getsignal(signal.SIGINT)
    calls = interrupt_after(monkeypatch, 2)
    summary, _ = run_quiet(base_args(tiny_bert_dir, data_dir, out))
    assert summary["interrupted"] and summary["step"] == 2 and calls["n"] == 2
    assert signal.getsignal(signal.SIGINT) is handler  # the previous handler is back
    assert "interrupted at step 2" in capsys.readouterr().err
    assert training_state(out)["step"] == 2
    assert (out / "last" / "model.safetensors").is_file()
    monkeypatch.undo()
    summary, _ = run_quiet(["--resume", "--out-dir", str(out)])  # --steps 6 from config.json
    assert summary["step"] == 6 and not summary["interrupted"]
    assert_same_tensors(tensors(out / "last" / "model.safetensors"),
                        tensors(mirror_reference / "last" / "model.safetensors"))


def test_second_ctrl_c_aborts_cleanly(tiny_bert_dir, data_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "aborted"
    interrupt_after(monkeypatch, 2, times=2)
    assert run_main(pretrain.run, base_args(tiny_bert_dir, data_dir, out)) == 130
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.err.strip().endswith("interrupted")


# ---- stopped, starved or torn ------------------------------------------------------------------
def test_sigterm_writes_last_and_resumes_bit_identically(mirror_reference, tiny_bert_dir, data_dir, tmp_path,
                                                          monkeypatch, capsys):
    """SIGTERM (a batch scheduler's notice before it preempts a job) as Ctrl-C: the step is finished,
    last/ written although no evaluation is due (--eval-every 3), exit status 143; --resume then
    reaches the uninterrupted run's weights bit for bit."""
    out = tmp_path / "terminated"
    handler = signal.getsignal(signal.SIGTERM)
    interrupt_after(monkeypatch, 2, signum=signal.SIGTERM)
    assert run_main(pretrain.run, base_args(tiny_bert_dir, data_dir, out)) == 143
    assert signal.getsignal(signal.SIGTERM) is handler
    err = capsys.readouterr().err
    assert f"stopped by SIGTERM at step 2; checkpoint in {out / 'last'}; continue with --resume" in err
    assert training_state(out)["step"] == 2 and not list(out.glob(".*"))
    monkeypatch.undo()
    summary, _ = run_quiet(["--resume", "--out-dir", str(out)])
    assert summary["step"] == 6 and not summary["interrupted"]
    assert_same_tensors(tensors(out / "last" / "model.safetensors"),
                        tensors(mirror_reference / "last" / "model.safetensors"))
    assert [m["step"] for m in metrics_lines(out)] == [0, 3, 6]


def test_a_second_signal_while_saving_waits_for_the_save(tiny_bert_dir, data_dir, tmp_path, monkeypatch):
    """The second signal arrives while last/ is being written: it is ignored, the checkpoint is whole."""
    out = tmp_path / "twice"
    interrupt_after(monkeypatch, 2, signum=signal.SIGTERM)
    real_save = torch.save

    def save_with_a_signal(obj, path, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's second notice, mid-save
        return real_save(obj, path, *args, **kwargs)
    monkeypatch.setattr(torch, "save", save_with_a_signal)
    assert run_main(pretrain.run, base_args(tiny_bert_dir, data_dir, out)) == 143
    assert training_state(out)["step"] == 2


def test_save_every_writes_last_without_evaluating(tiny_bert_dir, data_dir, tmp_path):
    out = tmp_path / "save-every"
    run_quiet(base_args(tiny_bert_dir, data_dir, out, eval_every=6, save_every=2))
    assert [m["step"] for m in metrics_lines(out)] == [0, 6]  # saving does not evaluate
    writes = tb_tags(out).Scalars("eval/sts_spearman")
    assert [w.step for w in writes] == [0, 6]
    assert training_state(out)["step"] == 6


@pytest.mark.slow  # starts run_pretrain.py and stops it
def test_a_sigterm_subprocess_stops_with_143_and_continues(tiny_bert_dir, data_dir, tmp_path):
    """A real SIGTERM to a running run_pretrain.py: exit 143, one line saying where the checkpoint
    is, last/ at the step it stopped; --resume goes on from there."""
    import subprocess
    import sys
    import time

    out = tmp_path / "sub"
    argv = [sys.executable, str(REPO / "run_pretrain.py")] + base_args(tiny_bert_dir, data_dir, out, steps=100_000,
                                                                        eval_every=100_000, save_every=5)
    with open(tmp_path / "log", "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            deadline = time.time() + 120
            while not (out / "last" / runs.STATE_FILE).is_file() and proc.poll() is None and time.time() < deadline:
                time.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=120) == 143
        finally:
            if proc.poll() is None:
                proc.kill()
    text = (tmp_path / "log").read_text()
    step = training_state(out)["step"]
    assert 5 <= step < 100_000 and f"stopped by SIGTERM at step {step}; checkpoint in" in text
    assert "Traceback" not in text and not list(out.glob(".*"))
    summary, _ = run_quiet(["--resume", "--out-dir", str(out), "--steps", str(step + 2)])
    assert summary["step"] == step + 2 and not summary["interrupted"]


@pytest.mark.parametrize("failure", ["ENOSPC", "torch"])
def test_a_full_disk_while_saving_is_one_line_and_keeps_the_checkpoint(failure, tiny_bert_dir, data_dir, tmp_path,
                                                                       monkeypatch, capsys):
    """The second last/ (step 6) cannot be written: one line naming it, exit 2, the temporary
    directory gone, last/ (step 3) and best/ untouched."""
    import errno

    out = tmp_path / "full"
    real_save, calls = torch.save, {"n": 0}

    def full_disk(obj, path, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            if failure == "ENOSPC":
                raise OSError(errno.ENOSPC, "No space left on device")
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4480 vs 4374")
        return real_save(obj, path, *args, **kwargs)
    monkeypatch.setattr(torch, "save", full_disk)
    assert run_main(pretrain.run, base_args(tiny_bert_dir, data_dir, out)) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    reason = "no space left on device" if failure == "ENOSPC" else "torch.save could not write"
    assert err.startswith(f"error: {reason}") and f"while writing {out / 'last'}" in err
    assert err.endswith("the previous checkpoint is intact")
    assert training_state(out)["step"] == 3 and not list(out.glob(".*"))
    assert (out / "best" / "model.safetensors").is_file()


def test_a_torn_metrics_line_is_dropped_on_resume(tiny_bert_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "torn"
    run_quiet(base_args(tiny_bert_dir, data_dir, out))
    path = out / "metrics.jsonl"
    path.write_bytes(path.read_bytes()[:-15])  # a kill or a power cut during the last append
    summary, _ = run_quiet(["--resume", "--out-dir", str(out), "--steps", "9"])
    assert summary["step"] == 9
    assert "metrics.jsonl: its last line was cut off" in capsys.readouterr().err
    assert [m["step"] for m in metrics_lines(out)] == [0, 3, 9]  # clean JSON again


def test_a_torn_metrics_line_before_the_last_is_an_error(tiny_bert_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "damaged"
    run_quiet(base_args(tiny_bert_dir, data_dir, out))
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1][:20]] + lines[2:]) + "\n")
    capsys.readouterr()
    assert run_main(pretrain.run, ["--resume", "--out-dir", str(out), "--steps", "9"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{path} line 2 is not a metrics record" in err


# ---- progress in a log file ----------------------------------------------------------------------
@pytest.mark.slow  # starts run_pretrain.py for 60 steps
def test_a_run_logged_to_a_file_writes_plain_lines(tiny_bert_dir, data_dir, tmp_path):
    """stderr in a file (nohup, a scheduler, > log 2>&1): no carriage returns, one line at each of the
    7 evaluations and at each tenth of the 60 steps, and a line's numbers are the run's."""
    import subprocess
    import sys

    out = tmp_path / "logged"
    argv = [sys.executable, str(REPO / "run_pretrain.py")] + base_args(tiny_bert_dir, data_dir, out, steps=60,
                                                                        eval_every=10)
    with open(tmp_path / "log", "w") as log:
        assert subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=log, cwd=REPO, timeout=300).returncode == 0
    text = (tmp_path / "log").read_text()
    assert "\r" not in text
    lines = text.splitlines()
    evals = [l for l in lines if ", eval sts_spearman " in l]
    marks = [l for l in lines if re.search(r"step \d+/60 \(\d+%\)", l)]
    assert len(evals) == 7 and len(marks) == 10
    assert len(lines) <= len(evals) + len(marks) + 2, lines  # and at most a note or two
    last = metrics_lines(out)[-1]
    assert evals[-1].startswith(f"logged: step 60/60, eval sts_spearman {last['sts_spearman']:.4f} (best ")


def test_the_bar_shows_the_newest_evaluation():
    """On a terminal the bar's last state is the last evaluation's, not the one before it."""
    from bertcf.utils.progress import Progress

    progress = Progress("bar", "run", total=20)
    progress.loss(0.5)
    progress.evaluated(10, "mean_dev", 0.4363, 0.4363, 10)
    progress.evaluated(20, "mean_dev", 0.6732, 0.6732, 20)
    assert progress.bar.postfix == "loss=0.5000, mean_dev=0.6732"
    progress.close()


def test_the_closing_line_handles_missing_scores(tmp_path):
    line = closing_line({"first": 0.12345, "best": 0.5, "best_step": 250}, "STS dev Spearman", tmp_path)
    assert line == f"STS dev Spearman: step 0 0.1235, best 0.5000 at step 250; best checkpoint: {tmp_path / 'best'}"
    line = closing_line({"first": float("nan"), "best": float("-inf"), "best_step": None}, "STS", tmp_path)
    assert line == "STS: step 0 n/a; no best checkpoint written"
    line = closing_line({"first": 0.0, "best": 0.25, "best_step": 4}, SELECTION_LABEL["mlm-heldout"], tmp_path)
    assert line.startswith("held-out masked-token accuracy: step 0 0.0000, best 0.2500 at step 4;")
    # --select-on last: no score, best/ is the last evaluation
    line = closing_line({"first": None, "best": None, "best_step": 6}, "", tmp_path)
    assert line == f"best checkpoint (the last evaluation, step 6): {tmp_path / 'best'}"
    # with the run's device, the peak memory so far (utils.memory): the process's resident set on the CPU
    line = closing_line({"first": 0.1, "best": 0.5, "best_step": 4}, "STS", tmp_path, "cpu")
    said = re.fullmatch(rf"STS: .*; best checkpoint: {re.escape(str(tmp_path / 'best'))}; peak memory ([\d,]+) MiB "
                        rf"resident", line)
    assert said and int(said.group(1).replace(",", "")) == pytest.approx(peak_memory_mb("cpu")["peak_rss_mb"], abs=2)


# ---- torchrun: a data-parallel run is one process's run on the global batch -------------------------
def start_torchrun(argv, cwd, log, nproc=2):
    """Start ``python -m torch.distributed.run --standalone --nproc_per_node N run_pretrain.py ARGV``
    (gloo on the CPU) in its own process group, stdout and stderr to the file ``log``."""
    import subprocess

    cmd, env = torchrun(REPO / "run_pretrain.py", *argv, nproc=nproc)
    with open(log, "w") as f:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.slow
def test_torchrun_equals_one_process_on_the_global_batch(tiny_bert_dir, data_dir, tmp_path):
    """run_pretrain.py under torchrun, 2 gloo processes of 4 sentences each, against one process on
    the same 8-sentence batches (dropout 0), for the mirror stage (also with --mini-batch-size 3, the
    gradient cache, against one process without it) and the joint stage with
    --unfreeze-encoder (DDP over encoder and flow): the same weights, one run directory (rank 0's;
    without --out-dir every rank would name its own), one metrics.jsonl line per evaluation, one
    final line. The launches run side by side (most of their time is starting Python)."""
    flags = dict(steps=4, eval_every=2, batch_size=8, dropout=0, lr=1e-3)
    stages = {"mirror": {}, "joint": dict(stage="joint", unfreeze_encoder=True), "mirror-cached": dict(mini_batch_size=3)}
    launched = {}
    try:
        for name, extra in stages.items():
            work = tmp_path / name / "ddp"
            work.mkdir(parents=True)
            argv = base_args(tiny_bert_dir, data_dir, None, **flags, **extra)  # no --out-dir
            launched[name] = (work, start_torchrun(argv, work, tmp_path / name / "log"))
        for name, extra in stages.items():  # the single-process references meanwhile (no cache)
            extra = {k: v for k, v in extra.items() if k != "mini_batch_size"}
            run_quiet(base_args(tiny_bert_dir, data_dir, tmp_path / name / "single", **flags, **extra))
        for name, (work, proc) in launched.items():
            proc.wait(timeout=180)
    finally:
        for _, proc in launched.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    start = tensors(Path(tiny_bert_dir) / "model.safetensors")
    for name, (work, proc) in launched.items():
        log = (tmp_path / name / "log").read_text()
        assert proc.returncode == 0, log[-4000:]
        single = tmp_path / name / "single"
        assert [p.name for p in work.iterdir()] == ["runs"]
        runs = list((work / "runs").iterdir())
        assert len(runs) == 1, runs
        run = runs[0]
        assert log.count("STS dev Spearman:") == 1 and str(Path("runs") / run.name / "best") in log

        # The logged training loss is the global batch's (averaged over the ranks), not rank 0's share.
        logged = [(e.step, e.value) for e in tb_tags(run).Scalars("train/loss")]
        expected = [(e.step, e.value) for e in tb_tags(single).Scalars("train/loss")]
        assert [s for s, _ in logged] == [s for s, _ in expected] == [1, 2, 3, 4]
        for (_, ours), (_, theirs) in zip(logged, expected):
            assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-5)  # float32 sums in another order
        lines, reference = metrics_lines(run), metrics_lines(single)
        assert [m["step"] for m in lines] == [m["step"] for m in reference] == [0, 2, 4]
        for ours, theirs in zip(lines, reference):
            assert ours["sts_pearson"] == pytest.approx(theirs["sts_pearson"], abs=1e-4)
        assert training_state(run)["step"] == 4
        for weights in ["model.safetensors"] + (["flow.safetensors"] if name == "joint" else []):
            ddp, one = tensors(run / "last" / weights), tensors(single / "last" / weights)
            assert ddp.keys() == one.keys()
            for k in one:
                # A key bias gets a zero gradient in exact arithmetic (softmax ignores a shift of
                # every score): its gradient is float noise, which Adam turns into steps of ~lr.
                atol = flags["steps"] * flags["lr"] if k.endswith("attention.self.key.bias") else 1e-5
                torch.testing.assert_close(ddp[k].double(), one[k].double(), rtol=0, atol=atol,
                                           msg=f"{name} {weights}: {k}")
        # The encoder moved, so the comparison compares something.
        key = "encoder.layer.0.output.dense.weight"
        assert not torch.equal(start[key], tensors(run / "last" / "model.safetensors")[key])


@pytest.mark.slow
def test_torchrun_ctrl_c_stops_every_rank_at_one_step_and_resumes(tiny_bert_dir, data_dir, tmp_path):
    """Ctrl-C on torchrun, which forwards SIGINT to every rank: the ranks agree on the step to stop
    at (the next logging interval), rank 0 saves last/, every rank exits cleanly, and the run
    continues with --resume."""
    import time

    out, log, log_every = tmp_path / "run", tmp_path / "log", 7
    argv = base_args(tiny_bert_dir, data_dir, out, steps=10**6, eval_every=10**6, log_every=log_every, batch_size=8,
                     progress="bar")  # the bar in the log file shows every step
    proc = start_torchrun(argv, tmp_path, log)
    try:
        deadline = time.monotonic() + 120
        # Wait for rank 0's progress bar to pass step 2: a step needs every rank's gradients, so
        # every rank is inside the training loop (and has its SIGINT handler) by then.
        while max(map(int, re.findall(r"(\d+)/1000000", log.read_text())), default=0) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    stopped = [int(m) for m in re.findall(r"interrupted at step (\d+)", text)]
    assert len(stopped) == 1, text[-4000:]  # rank 0 says it, once
    step = stopped[0]
    assert step > 0 and step % log_every == 0
    assert training_state(out)["step"] == step
    # Both workers returned normally: neither died in a collective nor stopped on its own.
    assert "Traceback" not in text.split("interrupted at step")[0], text[-4000:]
    assert not re.search(r"exitcode\s*:\s*[1-9]|DistBackendError|Connection closed", text), text[-4000:]
    summary, _ = run_quiet(["--resume", "--out-dir", str(out), "--steps", str(step + 2)])
    assert summary["step"] == step + 2 and not summary["interrupted"]


def test_adamw_is_fused_and_skips_decay_on_1d_parameters():
    from bertcf import training

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = training.make_optimizer(model.parameters(), 1e-3, 0.01, "cpu")
    assert opt.defaults["fused"] is True  # one kernel, not a loop over the parameters
    decay = {p: g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert decay[model[0].weight] == 0.01
    assert decay[model[0].bias] == decay[model[1].weight] == decay[model[1].bias] == 0.0
    with pytest.raises(UsageError, match="nothing to train"):
        training.make_optimizer(model.requires_grad_(False).parameters(), 1e-3, 0.01, "cpu")


def test_select_on_stsb_dev_reads_senteval_dev(tiny_bert_dir, data_dir, tmp_path, capsys):
    """--select-on stsb-dev scores SentEval's STS-B dev (here: the CS224N dev pairs with their gold
    scores reversed, so the Spearman flips sign), and a missing one is one line and status 2."""
    from bertcf.data import senteval
    rows = [line.split("\t") for line in (Path(data_dir) / "sts-dev.csv").read_text().splitlines()[1:]]
    stsb = tmp_path / "SentEval" / senteval.STSB_FILES["dev"]
    stsb.parent.mkdir(parents=True)
    stsb.write_text("".join(f"g\tf\t2012\t{i}\t{5 - float(r[4])}\t{r[2]}\t{r[3]}\n" for i, r in enumerate(rows)))
    run_quiet(base_args(tiny_bert_dir, data_dir, tmp_path / "a", steps=1, eval_every=1))
    run_quiet(base_args(tiny_bert_dir, data_dir, tmp_path / "b", steps=1, eval_every=1,
                        select_on="stsb-dev", senteval_dir=tmp_path / "SentEval"))
    first = [metrics_lines(tmp_path / run)[0]["sts_spearman"] for run in ("a", "b")]
    assert first[0] == pytest.approx(-first[1], abs=1e-6) and abs(first[0]) > 0.01
    capsys.readouterr()
    assert run_main(pretrain.run, base_args(tiny_bert_dir, data_dir, tmp_path / "d", steps=1,
                                             select_on="stsb-dev")) == 2
    err = capsys.readouterr().err.strip()
    assert "sts-dev.csv not found" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv, message", [
    (["--method", "mirror", "--momentum", "0.9"], "--momentum is a setting of bsl, not of mirror"),
    (["--method", "ct", "--deletion-ratio", "0.5"], "--deletion-ratio is a setting of tsdae, not of ct"),
    (["--method", "bsl", "--temperature", "0.1"],
     "--temperature is a setting of mirror, simcse, --stage joint, simcse-sup, not of bsl"),
    (["--method", "mirror", "--unfreeze-encoder"], "--unfreeze-encoder is a setting of --stage joint, not of mirror"),
    (["--stage", "flow", "--span-cap", "3"], "--span-cap is a setting of mirror, simcse, bsl, --stage joint, not of "
                                             "--stage flow"),
    (["--stage", "whiten", "--flow-blocks", "2"], "--flow-blocks is a setting of --stage joint, --stage flow, not of "
                                                  "--stage whiten"),
    (["--stage", "supervised", "--method", "cosent", "--mlm-probability", "0.2"],
     "--mlm-probability is a setting of mlm, not of cosent"),
])
def test_a_setting_of_another_method_is_refused_in_one_line(argv, message, capsys):
    """Every family of settings the run's objective does not take is checked at once: one that is
    set is refused, not ignored."""
    with pytest.raises(UsageError, match=re.escape(message)):
        pretrain_config.parse(argv)
    assert run_main(pretrain.run, argv + ["--out-dir", "unused"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"


def test_the_command_builds_the_encoder_its_objective_needs(tiny_bert_dir, tmp_path, capsys):
    """An --init checkpoint's flow and linear head are dropped by the command's encoder
    construction for an objective that trains the encoder itself (the objective would refuse
    them); the joint stage keeps the flow it trains; --pooling cls-mlp builds a [CLS] encoder."""
    import torch.nn as nn

    from bertcf import SentenceEncoder
    from bertcf.models.flow import Glow
    from bertcf.training.pretraining import load_encoder

    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    encoder.flow, encoder.dense = Glow(encoder.dim, num_blocks=1), nn.Linear(encoder.dim, 8)
    encoder.save_pretrained(tmp_path / "init")
    mirror, _ = load_encoder(pretrain_config.parse(["--init", str(tmp_path / "init"), "--pooling", "cls-mlp"]))
    assert mirror.flow is None and mirror.dense is None and mirror.pooling == "cls"
    assert "note: the encoder's linear head (32 -> 8, e.g. a whitening map) is dropped" in capsys.readouterr().err
    joint, _ = load_encoder(pretrain_config.parse(["--stage", "joint", "--init", str(tmp_path / "init")]))
    assert joint.flow is not None and joint.dense is None
