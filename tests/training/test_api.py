"""The Python API: the README's training example runs as printed (its model, data and length
swapped for a tiny BERT and a few steps) and gives the weights of the command it names, bit for
bit; objectives are built from keyword arguments, checked as their flags are."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertcf import objectives
from bertcf.commands import pretrain
from bertcf.config.train import TrainConfig
from bertcf.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


def readme_example() -> tuple[str, str]:
    """The README's Python training example and the command it says it equals."""
    section = (REPO / "README.md").read_text().split("## Train from Python", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    command = re.search(r"```\n(python run_pretrain.py [^\n]*)\n```", section).group(1)
    return code, command


def test_the_readme_example_is_short_and_names_its_command():
    code, command = readme_example()
    assert len(code.strip().splitlines()) < 15
    assert "Trainer(" in code and ".fit()" in code and command.startswith("python run_pretrain.py")


def test_the_readme_example_gives_the_commands_weights_bit_for_bit(tiny_bert_dir, tiny_data_dir, tmp_path):
    """Both in this process, one after the other: the example with a tiny BERT, the test data and 6
    steps, and the command it names with the same."""
    (tiny_data_dir / "wiki1m_for_simcse.txt").write_text(
        "\n".join(f"the man number {i} plays a red guitar in the park today" for i in range(24)) + "\n")
    code, command = readme_example()
    small = "steps=6, batch_size=4, eval_every=3, device='cpu', precision='fp32', progress='none'"
    code = (code.replace('"bert-base-uncased"', repr(str(tiny_bert_dir))).replace('"data/', f'"{tiny_data_dir}/')
            .replace('out_dir="runs/', f'out_dir="{tmp_path}/python/').replace("steps=10_000, batch_size=16", small))
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, "README.md", "exec"), {})
        argv = command.split()[2:] + ["--model", str(tiny_bert_dir), "--data-dir", str(tiny_data_dir), "--steps",
                                      "6", "--batch-size", "4", "--eval-every", "3", "--device", "cpu",
                                      "--precision", "fp32", "--progress", "none"]
        argv[argv.index("--out-dir") + 1] = str(tmp_path / "command" / Path(argv[argv.index("--out-dir") + 1]).name)
        pretrain.run(argv)
    python_run, command_run = next((tmp_path / "python").iterdir()), next((tmp_path / "command").iterdir())
    for checkpoint in ("best", "last"):
        ours, theirs = (load_file(str(run / checkpoint / "model.safetensors")) for run in (python_run, command_run))
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours), checkpoint
    lines = [(run / "metrics.jsonl").read_text().splitlines() for run in (python_run, command_run)]
    assert lines[0] == lines[1]


def test_objectives_take_keyword_settings_checked_as_their_flags(tiny_bert_dir):
    from bertcf import SentenceEncoder

    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    objective = objectives.SimCSE(encoder, temperature=0.1, negatives="simcse")
    assert (objective.info_nce.temperature, objective.info_nce.negatives, objective.span_cap) == (0.1, "simcse", 0)
    assert objective.description() | {"temperature": 0.1} == objective.description()
    with pytest.raises(UsageError, match="temperature must be positive, not -1"):
        objectives.SimCSE(encoder, temperature=-1)
    with pytest.raises(UsageError, match="negatives must be one of report, simcse, ntxent"):
        objectives.Mirror(encoder, negatives="all")
    with pytest.raises(UsageError, match="SimCSE has no setting temprature"):
        objectives.SimCSE(encoder, temprature=0.1)
    with pytest.raises(UsageError, match="steps must be at least 1, not 0"):
        TrainConfig(steps=0)
    with pytest.raises(UsageError, match="lr_schedule must be one of constant, linear"):
        TrainConfig(lr_schedule="cosine")


def test_an_objective_trains_the_encoder_it_is_given_unchanged(tiny_bert_dir):
    """What a method needs of the encoder (no flow, no linear head, [CLS] under SimCSE's MLP) is
    checked and refused in one line, not changed behind the caller's back; Matryoshka's widths
    are checked, and recorded by the Trainer, not set on the encoder by the objective."""
    import torch.nn as nn

    from bertcf import SentenceEncoder
    from bertcf.models.flow import Glow

    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    encoder.flow = Glow(encoder.dim, num_blocks=1)
    with pytest.raises(UsageError, match="Mirror trains the encoder itself, not a flow on it"):
        objectives.Mirror(encoder)
    assert encoder.flow is not None
    objectives.Joint(encoder)  # the joint stage trains the flow: it keeps it
    encoder.flow, encoder.dense = None, nn.Linear(encoder.dim, 8)
    with pytest.raises(UsageError, match="SimCSE changes the vectors the encoder's linear head .* was fitted on"):
        objectives.SimCSE(encoder)
    assert encoder.dense is not None
    encoder.dense = None
    with pytest.raises(UsageError, match="needs an encoder that pools cls, not mean"):
        objectives.SimCSE(encoder, mlp=True)
    assert encoder.pooling == "mean"
    objectives.SimCSE(encoder, matryoshka_dims=(32, 16))
    assert encoder.matryoshka_dims is None


def test_simcse_records_the_span_it_runs_and_refuses_another(tiny_bert_dir):
    """SimCSE's views have no span: its description says span_cap 0 (what runs), a span asked of
    it from Python or on the command line is refused rather than overridden, and config.json
    records what ran."""
    from bertcf import SentenceEncoder
    from bertcf.config.pretrain import parse

    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    assert objectives.SimCSE(encoder).description()["span_cap"] == 0
    with pytest.raises(UsageError, match="SimCSE's two views differ by dropout alone: span_cap must be 0, not 3"):
        objectives.SimCSE(encoder, span_cap=3)
    with pytest.raises(UsageError, match="span_unit must be 'token', not 'char'"):
        objectives.SimCSE(encoder, span_unit="char")
    assert (parse(["--method", "simcse"]).span_cap, parse(["--stage", "joint", "--method", "simcse"]).span_cap) == (0, 0)
    for argv in (["--method", "simcse", "--span-cap", "3"], ["--stage", "joint", "--method", "simcse", "--span-cap", "5"]):
        with pytest.raises(UsageError, match="--span-cap .*: --method simcse's two views differ by dropout alone"):
            parse(argv)


def test_the_trainer_keeps_a_resolved_config_and_records_what_it_resolves(tiny_bert_dir, tmp_path):
    """The defaults of device, out_dir and the batch sampler are taken in one place
    (``TrainConfig.resolved``): a command's config reaches the Trainer resolved and is kept as it
    is; a Python user's gets them there, and config.json records the sampler that runs."""
    from bertcf import SentenceEncoder, Trainer
    from bertcf.config.pretrain import parse

    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    command = parse(["--stage", "supervised", "--method", "simcse-sup", "--train-file", "x.tsv", "--out-dir",
                     str(tmp_path / "command")])
    assert command.batch_sampler == "no-duplicates" and command.device is not None
    assert Trainer(objectives.SupervisedSimCSE(encoder), [], command).config is command
    trainer = Trainer(objectives.SupervisedSimCSE(encoder), [], TrainConfig(out_dir=str(tmp_path / "python")))
    assert trainer.config.batch_sampler == trainer.record["batch_sampler"] == "no-duplicates"
    assert trainer.config.device is not None and trainer.config.precision is not None
    assert Trainer(objectives.Mirror(encoder), [], TrainConfig()).config.out_dir.startswith("runs/train-mirror-")
    # the settings as keywords, as MultitaskTrainer takes them: the same config as TrainConfig's
    by_keywords = Trainer(objectives.Mirror(encoder), [], steps=3, lr=2e-5, out_dir=str(tmp_path / "k")).config
    assert by_keywords == Trainer(objectives.Mirror(encoder), [],
                                  TrainConfig(steps=3, lr=2e-5, out_dir=str(tmp_path / "k"))).config
    assert (by_keywords.steps, by_keywords.lr) == (3, 2e-5)
    over = Trainer(objectives.Mirror(encoder), [], TrainConfig(steps=3, out_dir=str(tmp_path / "o")), steps=5).config
    assert over.steps == 5
