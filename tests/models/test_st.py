"""Checkpoints and the ecosystem: sentence-transformers loads what this project writes (flow
included) and this project reads sentence-transformers directories; the model card; file modes;
corrupt or missing checkpoint files as one line and exit status 2."""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import stat

import pytest
import torch
from helpers import ST_SENTENCES as SENTENCES
from helpers import multitask_argv, standalone_vectors

from bertcf import SentenceEncoder
from bertcf.commands import pretrain
from bertcf.multitask import command as multitask
from bertcf.cli import run_main
from bertcf.models.flow import Glow
from minbert import CheckpointError


def sentence_transformer(path):
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(path), device="cpu", trust_remote_code=True)


def assert_same_vectors(path, tol=1e-5):
    ours = SentenceEncoder.from_pretrained(path).encode(SENTENCES)
    theirs = torch.tensor(sentence_transformer(path).encode(SENTENCES))
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() < tol


def with_flow(tiny_bert_dir, pooling="mean"):
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir, pooling=pooling)
    torch.manual_seed(0)
    encoder.flow = Glow(encoder.dim, num_blocks=2)
    with torch.no_grad():
        encoder.flow.train()(torch.randn(32, encoder.dim))
        for p in encoder.flow.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return encoder.eval()


@pytest.mark.parametrize("pooling", ["mean", "cls"])
@pytest.mark.parametrize("flow", [False, True])
def test_sentence_transformers_loads_our_checkpoint(tiny_bert_dir, tmp_path, pooling, flow):
    encoder = with_flow(tiny_bert_dir, pooling) if flow else SentenceEncoder.from_pretrained(tiny_bert_dir,
                                                                                             pooling=pooling)
    encoder.max_length = 12  # shorter than the last sentence: both must truncate alike
    encoder.save_pretrained(tmp_path / "ckpt")
    modules = json.loads((tmp_path / "ckpt" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling"] + (["Flow"] if flow else [])
    assert json.loads((tmp_path / "ckpt" / "sentence_bert_config.json").read_text())["max_seq_length"] == 12
    assert_same_vectors(tmp_path / "ckpt")
    if flow:  # F(x), not f(x)
        plain = SentenceEncoder.from_pretrained(tiny_bert_dir, pooling=pooling)
        plain.max_length = 12
        assert not torch.allclose(plain.encode(SENTENCES), SentenceEncoder.from_pretrained(tmp_path / "ckpt").encode(
            SENTENCES), atol=1e-3)


def test_a_flow_checkpoint_never_loads_silently_without_the_flow(tiny_bert_dir, tmp_path):
    """sentence-transformers refuses the flow module unless told to run its code: an error, not f(x)."""
    from sentence_transformers import SentenceTransformer

    with_flow(tiny_bert_dir).save_pretrained(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="bertcf_st\\.Flow"):
        SentenceTransformer(str(tmp_path / "ckpt"), device="cpu")


def test_we_read_a_sentence_transformers_directory(tiny_bert_dir, tmp_path):
    """Pooling, max_seq_length and Normalize of a directory sentence-transformers wrote."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    for pooling, normalize in (("cls", True), ("mean", False)):
        transformer = Transformer(str(tiny_bert_dir), max_seq_length=10)
        modules = [transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling)]
        model = SentenceTransformer(modules=modules + ([Normalize()] if normalize else []), device="cpu")
        out = tmp_path / f"st-{pooling}"
        model.save(str(out))
        encoder = SentenceEncoder.from_pretrained(out)
        assert (encoder.pooling, encoder.max_length, encoder.normalize) == (pooling, 10, normalize)
        theirs = torch.tensor(model.encode(SENTENCES))
        assert (encoder.encode(SENTENCES) - theirs).abs().max().item() < 1e-5


def test_a_module_we_cannot_represent_is_a_clear_error(tiny_bert_dir, tmp_path):
    SentenceEncoder.from_pretrained(tiny_bert_dir).save_pretrained(tmp_path / "ckpt")
    modules = json.loads((tmp_path / "ckpt" / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (tmp_path / "ckpt" / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "ckpt" / "2_Dense").mkdir()
    dense_config = {"in_features": 32, "out_features": 8, "bias": True}  # no activation: sentence-transformers' Tanh
    for activation in (None, "torch.nn.modules.activation.Tanh"):
        config = dense_config | ({"activation_function": activation} if activation else {})
        (tmp_path / "ckpt" / "2_Dense" / "config.json").write_text(json.dumps(config))
        with pytest.raises(CheckpointError, match="Dense with activation torch.nn.modules.activation.Tanh"):
            SentenceEncoder.from_pretrained(tmp_path / "ckpt")
    modules[2]["type"] = "sentence_transformers.models.LayerNorm"
    (tmp_path / "ckpt" / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(CheckpointError, match="sentence_transformers.models.LayerNorm"):
        SentenceEncoder.from_pretrained(tmp_path / "ckpt")
    modules[2] = {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
    modules.append({"idx": 3, "name": "3", "path": "3_Flow", "type": "bertcf.st.Flow"})
    (tmp_path / "ckpt" / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(CheckpointError, match="after Normalize"):
        SentenceEncoder.from_pretrained(tmp_path / "ckpt")
    modules.pop()
    (tmp_path / "ckpt" / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    modules.pop()
    (tmp_path / "ckpt" / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(CheckpointError, match="pooling_mode_max_tokens"):
        SentenceEncoder.from_pretrained(tmp_path / "ckpt")


def with_dense(tiny_bert_dir, out_features=24, flow=False, bias=True):
    """The tiny encoder with a random linear head (after a flow when ``flow``)."""
    encoder = with_flow(tiny_bert_dir) if flow else SentenceEncoder.from_pretrained(tiny_bert_dir).eval()
    torch.manual_seed(1)
    encoder.dense = torch.nn.Linear(encoder.dim, out_features, bias=bias)
    return encoder


@pytest.mark.parametrize("flow", [False, True])
def test_a_linear_head_is_a_standard_dense_module_both_ways(tiny_bert_dir, tmp_path, flow):
    """The head is written as sentence-transformers' Dense (identity activation, linear.weight /
    linear.bias), which it loads as its own module; we read it back bit for bit."""
    from safetensors.torch import load_file
    from sentence_transformers.base.modules import Dense

    encoder = with_dense(tiny_bert_dir, flow=flow)
    encoder.save_pretrained(tmp_path / "ckpt")
    modules = json.loads((tmp_path / "ckpt" / "modules.json").read_text())
    assert [m["type"] for m in modules][-1] == "sentence_transformers.models.Dense"
    dense_dir = tmp_path / "ckpt" / modules[-1]["path"]
    assert json.loads((dense_dir / "config.json").read_text()) == {
        "in_features": 32, "out_features": 24, "bias": True, "activation_function": "torch.nn.modules.linear.Identity",
        "module_input_name": "sentence_embedding", "module_output_name": "sentence_embedding"}
    tensors = load_file(str(dense_dir / "model.safetensors"))
    assert torch.equal(tensors["linear.weight"], encoder.dense.weight) and torch.equal(tensors["linear.bias"],
                                                                                       encoder.dense.bias)
    theirs = Dense.load(str(dense_dir))  # sentence-transformers' own loader, no remote code
    assert isinstance(theirs.activation_function, torch.nn.Identity)
    assert torch.equal(theirs.linear.weight, encoder.dense.weight)
    loaded = SentenceEncoder.from_pretrained(tmp_path / "ckpt")
    assert torch.equal(loaded.dense.weight, encoder.dense.weight) and loaded.output_dim == 24
    assert torch.equal(loaded.encode(SENTENCES), encoder.encode(SENTENCES))
    plain = encoder.encode(SENTENCES) if not flow else None
    encoder.dense = None
    without = encoder.encode(SENTENCES)
    assert without.shape[1] == 32 and (plain is None or plain.shape[1] == 24)
    assert_same_vectors(tmp_path / "ckpt")  # sentence-transformers' vectors = ours, within 1e-5


def test_a_dense_sentence_transformers_wrote_is_read(tiny_bert_dir, tmp_path):
    """A model sentence-transformers built and saved with Dense(identity, no bias): its vectors here."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    transformer = Transformer(str(tiny_bert_dir), max_seq_length=12)
    torch.manual_seed(0)
    dense = Dense(32, 8, bias=False, activation_function=torch.nn.Identity())
    model = SentenceTransformer(modules=[transformer, Pooling(32, pooling_mode="mean"), dense], device="cpu")
    model.save(str(tmp_path / "st"))
    encoder = SentenceEncoder.from_pretrained(tmp_path / "st")
    assert encoder.dense.bias is None and encoder.output_dim == 8
    assert (encoder.encode(SENTENCES) - torch.tensor(model.encode(SENTENCES))).abs().max().item() < 1e-5


def test_a_linear_head_in_fine_tuning_and_pretraining(tiny_bert_dir, tmp_path):
    """The multitask heads read the head's output (its width) and the checkpoint keeps it; a
    pretraining objective, which trains the vectors the head was fitted on, refuses it (the
    command drops it when it builds the encoder: tests/training/test_pretrain.py)."""
    from bertcf.multitask import MultitaskModel, builtin_tasks
    from bertcf.errors import UsageError
    from bertcf.objectives import Mirror

    model = MultitaskModel(with_dense(tiny_bert_dir, out_features=12), list(builtin_tasks().values()), proj_dim=8).eval()
    assert model.sst_head[1].in_features == 12 and model.qqp_head[1].in_features == 12
    batch = model.encoder.tokenize(SENTENCES[:2])
    ids, mask = batch["input_ids"], batch["attention_mask"]
    out = model(ids, mask, {"sst": 2})
    assert out["sst"].shape == (2, 5)
    model.save_pretrained(tmp_path / "mt")
    again = MultitaskModel.from_pretrained(tmp_path / "mt").eval()
    assert torch.equal(again.encoder.dense.weight, model.encoder.dense.weight)
    assert torch.allclose(again(ids, mask, {"sst": 2})["sst"], out["sst"], atol=1e-6)
    encoder = with_dense(tiny_bert_dir)
    with pytest.raises(UsageError, match="Mirror changes the vectors the encoder's linear head"):
        Mirror(encoder)
    assert encoder.dense is not None


def test_real_minilm_agrees_in_its_own_layout(real_bert_dir):
    """The real all-MiniLM-L6-v2 as published (mean pooling, max_seq_length 256, Normalize)."""
    encoder = SentenceEncoder.from_pretrained(real_bert_dir)
    assert (encoder.pooling, encoder.max_length, encoder.normalize) == ("mean", 256, True)
    assert_same_vectors(real_bert_dir)


# ---- checkpoints written by training runs ----------------------------------------------------------

def pretrain_argv(bert, data, out, *more):
    return ["--model", str(bert), "--data-dir", str(data), "--corpus-from-tasks", "--out-dir", str(out),
            "--steps", "2", "--batch-size", "4", "--max-length", "16", "--eval-every", "1", "--device", "cpu",
            "--precision", "fp32", *more]


def quiet(main, argv):
    with contextlib.redirect_stdout(io.StringIO()):
        return main(argv)


def test_run_checkpoints_load_both_ways_with_card_and_modes(tiny_bert_dir, tiny_data_dir, tmp_path):
    mirror = tmp_path / "mirror"
    quiet(pretrain.run, pretrain_argv(tiny_bert_dir, tiny_data_dir, mirror))
    joint = tmp_path / "joint"
    quiet(pretrain.run, pretrain_argv(tiny_bert_dir, tiny_data_dir, joint, "--stage", "joint", "--init",
                                       str(mirror)))
    tuned = tmp_path / "tuned"
    quiet(multitask.run, multitask_argv(joint, tiny_data_dir, tuned, 2, eval_every=1, log_every=None, qqp_batch_size=4,
                                        proj_dim=8, max_length=16, lr=None, max_train_examples=None))
    for checkpoint in (mirror / "best", mirror / "last", joint / "best", joint / "last", tuned / "best"):
        assert_same_vectors(checkpoint)
        for name in ("model.safetensors", "config.json", "modules.json") + (("flow.safetensors",) if "joint" in str(
                checkpoint) or "tuned" in str(checkpoint) else ()):
            mode = stat.S_IMODE(os.stat(checkpoint / name).st_mode)
            assert mode == 0o666 & ~current_umask(), (checkpoint / name, oct(mode))
    card = (joint / "best" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: sentence-transformers\n")
    assert "run_pretrain.py" in card and "--stage joint" in card and "stage `joint`, method `mirror`" in card
    best = json.loads((joint / "metrics.jsonl").read_text().splitlines()[-1])  # the run's last evaluation
    assert "sts_spearman = " in card and "trust_remote_code=True" in card and best["step"] == 2
    assert "multitask fine-tuning" in (tuned / "best" / "README.md").read_text()


def test_model_card_names_a_hub_base_only_and_says_what_a_user_without_bertcf_needs(tmp_path):
    from bertcf.models.model_card import model_card

    run = tmp_path / "run"  # a local run whose base came from the hub
    (run / "best").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"model": "bert-base-uncased", "stage": "mirror"}))
    from_hub = model_card({"stage": "joint", "method": "mirror", "init": str(run / "best")}, "sts_spearman", 0.5, 3,
                          flow=True)
    assert "\nbase_model: bert-base-uncased\n" in from_hub and "trust_remote_code=True" in from_hub
    assert "BERT-CF is not needed" in from_hub and "bertcf_st.py" in from_hub
    local = model_card({"stage": "mirror", "method": "mirror", "model": str(tmp_path)}, "sts_spearman", 0.5, 3)
    assert "base_model:" not in local and "trust_remote_code" not in local and "No custom code" in local
    assert "## Evaluation" not in local
    stsb = model_card({"stage": "mirror", "method": "mirror", "select_on": "stsb-dev"}, "sts_spearman", 0.8123, 7)
    assert "SentEval STS-B dev Spearman ×100: 81.23 at step 7" in stsb


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---- a checkpoint shared with someone who has not installed BERT-CF ---------------------------------
@pytest.mark.slow
def test_a_joint_checkpoint_loads_where_bertcf_is_not_installed(finished_run, tiny_bert_dir, tmp_path):
    """The checkpoint carries its flow module's code: sentence-transformers alone gives encode()'s
    vectors; a checkpoint without a flow needs no remote code at all."""
    best = finished_run[0] / "best"
    assert {"bertcf_st.py", "flow.py"} <= {p.name for p in best.iterdir()}
    assert json.loads((best / "modules.json").read_text())[2]["type"] == "bertcf_st.Flow"
    plain = tmp_path / "plain"
    SentenceEncoder.from_pretrained(tiny_bert_dir).save_pretrained(plain)
    assert not (plain / "bertcf_st.py").exists() and not (plain / "flow.py").exists()
    with_flow_vectors, plain_vectors = standalone_vectors((best, True), (plain, False))
    assert (with_flow_vectors - SentenceEncoder.from_pretrained(best).encode(SENTENCES)).abs().max().item() < 1e-5
    assert (plain_vectors - SentenceEncoder.from_pretrained(plain).encode(SENTENCES)).abs().max().item() < 1e-5


@pytest.mark.slow
def test_a_linear_head_loads_where_bertcf_is_not_installed(tiny_bert_dir, tmp_path):
    """A checkpoint with a linear head and no flow is plain sentence-transformers (Transformer,
    Pooling, Dense): it loads without remote code where BERT-CF cannot be imported."""
    dense = tmp_path / "dense"
    with_dense(tiny_bert_dir).save_pretrained(dense)
    assert not (dense / "bertcf_st.py").exists()
    theirs, = standalone_vectors((dense, False))
    assert theirs.shape == (len(SENTENCES), 24)
    assert (theirs - SentenceEncoder.from_pretrained(dense).encode(SENTENCES)).abs().max().item() < 1e-5


@pytest.mark.slow
def test_an_old_flow_checkpoint_loads_and_upgrades_in_place(finished_run, tmp_path, capsys):
    """A checkpoint written before (modules.json naming bertcf.st.Flow, no code files) loads in this
    project; one command gives it the code, after which it loads without BERT-CF."""
    from bertcf.commands import st_format as st_format_command
    from bertcf.models import st_format

    old = tmp_path / "old"
    shutil.copytree(finished_run[0] / "best", old)
    for name in st_format.FLOW_CODE:
        (old / name).unlink()
    modules = json.loads((old / "modules.json").read_text())
    modules[2]["type"] = st_format.OLD_FLOW_MODULE
    (old / "modules.json").write_text(json.dumps(modules))
    ours = SentenceEncoder.from_pretrained(old).encode(SENTENCES)
    assert_same_vectors(old)  # in this project, as before
    assert st_format_command.main(["upgrade", str(old)]) == 0
    assert st_format_command.main(["upgrade", str(old)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{old}: upgraded",
                                                    f"{old}: nothing to upgrade (no flow, or already done)"]
    assert json.loads((old / "modules.json").read_text())[2]["type"] == st_format.FLOW_MODULE
    assert (standalone_vectors((old, True))[0] - ours).abs().max().item() < 1e-5


# ---- bad checkpoints: one line, exit status 2 -------------------------------------------------------

@pytest.fixture(scope="module")
def finished_run(tiny_bert_dir, tmp_path_factory):
    from helpers import write_cs224n_files

    data = write_cs224n_files(tmp_path_factory.mktemp("st-data"))
    out = tmp_path_factory.mktemp("st-runs") / "joint"
    quiet(pretrain.run, pretrain_argv(tiny_bert_dir, data, out, "--stage", "joint"))
    return out, data


def one_error_line(capsys, *needles):
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    lines = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, captured.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("name", ["model.safetensors", "flow.safetensors", "training_state.pt"])
def test_a_truncated_checkpoint_file_is_one_line(finished_run, tmp_path, capsys, name):
    out, data = finished_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    for checkpoint in ("last", "best"):
        target = copy / checkpoint / name
        if target.exists():
            data_bytes = target.read_bytes()
            target.unlink()  # hard-linked between best/ and last/: break the link first
            target.write_bytes(data_bytes[: len(data_bytes) // 2])
    capsys.readouterr()
    if name != "flow.safetensors":  # --resume takes the flow from training_state.pt, the frozen encoder from last/
        assert run_main(pretrain.run, ["--resume", "--out-dir", str(copy), "--steps", "3"]) == 2
        one_error_line(capsys, name)
    if name != "training_state.pt":
        assert run_main(multitask.run, ["--encoder", str(copy), "--data-dir", str(data), "--out-dir",
                                         str(tmp_path / "mt"), "--device", "cpu"]) == 2
        one_error_line(capsys, name)


def test_corrupt_heads_file_is_one_line(tiny_bert_dir, tmp_path, capsys):
    from helpers import write_cs224n_files

    data = write_cs224n_files(tmp_path / "data")
    out = tmp_path / "mt"
    quiet(multitask.run, ["--encoder", str(tiny_bert_dir), "--data-dir", str(data), "--out-dir", str(out),
                           "--steps", "1", "--eval-every", "1", "--proj-dim", "8", "--device", "cpu"])
    (out / "best" / "heads.safetensors").write_bytes(b"not a safetensors file")
    capsys.readouterr()
    assert run_main(multitask.run, ["--predict-only", "--checkpoint", str(out)]) == 2
    one_error_line(capsys, "heads.safetensors")


def test_resume_before_the_first_checkpoint_and_an_out_dir_that_is_a_file(tiny_bert_dir, tiny_data_dir, tmp_path,
                                                                          capsys):
    run = tmp_path / "early"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"stage": "mirror"}))
    assert run_main(pretrain.run, pretrain_argv(tiny_bert_dir, tiny_data_dir, run, "--resume")) == 2
    one_error_line(capsys, "never reached its first checkpoint", "without --resume")
    file = tmp_path / "a-file"
    file.write_text("x")
    assert run_main(pretrain.run, pretrain_argv(tiny_bert_dir, tiny_data_dir, file)) == 2
    one_error_line(capsys, "is a file, not a directory")
