"""The stages of ``run_pretrain.py`` from a resolved ``PretrainConfig`` (``run``): the data the
run reads (fetched when missing), the encoder, the objective of its stage and method, the
evaluation that picks best/, and the ``Trainer``; ``--stage whiten`` fits in closed form instead
(``training.whiten``). Every stage and method also runs data-parallel under ``torchrun
--nproc_per_node N`` (--batch-size stays the global batch; see ``train``)."""
from __future__ import annotations

import sys
from pathlib import Path

from .. import objectives, runs
from ..config.pretrain import SELECTION, SELECTION_LABEL, PretrainConfig, reads_corpus, run_objectives
from ..config.train import default_batch_sampler
from ..data.corpus import CORPUS_SETTINGS, load_corpus
from ..data.download import WIKI1M_NAME, fetch_missing
from ..data.examples import Examples
from ..data.senteval import STSB_FILES, read_stsb
from ..data.tasks import TASK_FILES, TASKS, read_sts, task_file
from ..errors import DataError, UsageError
from ..evaluation.metrics import STSDevEvaluator
from ..models.encoder import SentenceEncoder
from ..models.peft import PeftSettings, make_adapters
from ..utils.distributed import dist_info, run_distributed
from ..utils.files import save_dir_atomic
from . import whiten
from .loop import closing_line, set_seed
from .sampler import check_distinct
from .trainer import Trainer


def run(config: PretrainConfig) -> dict:
    """The run of ``config``, in the run directory it names (held for this process: one run per
    directory)."""
    with runs.hold(config.out_dir):  # one run per directory, from before anything is written
        fetch_data(config)
        return run_distributed(train_whiten if config.stage == "whiten" else train, config)


def fetch_data(config: PretrainConfig) -> None:
    """The files this run reads from --data-dir by default (Wiki1M unless --corpus or
    --corpus-from-tasks, the task train files for the latter, the evaluation's: ``dev_files``),
    downloaded when missing; when that fails, the line a missing file has always given, with why
    it was not downloaded."""
    reads = reads_corpus(config)
    default_corpus = reads and not any(getattr(config, f) for f in CORPUS_SETTINGS)
    names = ([WIKI1M_NAME] if default_corpus else []) \
        + ([TASK_FILES[t, "train"] for t in TASKS] if config.corpus_from_tasks and reads else []) \
        + dev_files(config.select_on)
    fetch_files(Path(config.data_dir), names, default_corpus)


def dev_files(select_on: str) -> list[str]:
    """The file of --data-dir every evaluation scores, whatever picks best/: CS224N STS dev (none
    with --select-on stsb-dev, which scores SentEval's STS-B dev instead)."""
    return [] if select_on == "stsb-dev" else [TASK_FILES["sts", "dev"]]


def fetch_files(data: Path, names: list[str], default_corpus: bool = False) -> None:
    """``names`` in ``data``, downloaded when missing; a DataError naming the missing ones and why
    they were not downloaded."""
    why = fetch_missing(data, names)
    if why is None:
        return
    if default_corpus and not (data / WIKI1M_NAME).is_file():
        raise UsageError(f"no corpus: give --corpus FILE or --corpus-from-tasks ({data / WIKI1M_NAME} not found; "
                         f"{why})")
    missing = ", ".join(str(data / n) for n in names if not (data / n).is_file())
    raise DataError(f"{missing} not found ({why})")


def part_config(config: PretrainConfig, stage: str, method: str, file: str) -> PretrainConfig:
    """The settings of one part of --stage mix: its stage and method, its file as its data; a simcse
    part's views without a span (``SIMCSE_VIEWS``: the span settings are a mirror part's)."""
    data = {"corpus": file} if stage == "mirror" else {"train_file": [file]}
    views = objectives.SIMCSE_VIEWS if method == "simcse" else {}
    return config.replace(stage=stage, method=method, mix=None, **data, **views)


def load_examples(config: PretrainConfig, rank: int = 0) -> tuple[Examples | dict, PretrainConfig]:
    """What the run trains on: the corpus, or a supervised method's examples (from --train-file, or
    the corpus with a teacher's vectors), or for --stage mix each part's (name -> examples); and the
    config with what reading them settled (``PretrainConfig.with_data``: a preset's steps, a word list)."""
    if config.stage == "mix":
        data = {name: load_examples(part_config(config, stage, method, file), rank)[0]
                for name, stage, method, file in config.mix_parts()}
        return data, config.with_data(sum(map(len, data.values())))
    word_list = None

    def corpus():
        nonlocal word_list
        sentences, word_list = load_corpus(config)
        return sentences

    if config.stage == "supervised":
        examples = objectives.SUPERVISED[config.method].read_examples(config, corpus)
        if rank == 0:
            print(f"note: training on {examples.what}", file=sys.stderr)
    else:
        sentences = corpus()
        examples = Examples([sentences], what=f"{len(sentences):,} corpus sentences")
    return examples, config.with_data(len(examples), word_list)


def load_encoder(config: PretrainConfig) -> tuple[SentenceEncoder, PretrainConfig]:
    """The encoder to start from (--init, a run directory or checkpoint, or --model), built as the
    run's objectives need it (they check it and change nothing of it): [CLS] pooling under
    SimCSE's MLP, no flow unless the method trains one, no linear head unless the method trains it
    (a note says it is dropped); evaluating (and later encoding) whole sentences up to
    --eval-max-length in the run's precision. Also the config with that length resolved to the
    model's limit (``PretrainConfig.with_model``)."""
    source = runs.resolve_encoder_path(config.init) if config.init else config.model
    pooling = "cls" if config.pooling == "cls-mlp" else config.pooling  # the MLP is the objective's (training only)
    encoder = SentenceEncoder.from_pretrained(source, pooling=pooling, vocab=config.vocab,
                                              hidden_dropout_prob=config.dropout,
                                              attention_probs_dropout_prob=config.dropout)
    classes = run_objectives(config)  # none for --stage whiten, which fits the head itself
    if classes and not all(cls.uses_flow for cls in classes):
        encoder.flow = None
    if classes and encoder.dense is not None and not all(cls.uses_dense for cls in classes):
        if dist_info()[0] == 0:
            print(f"note: the encoder's linear head ({encoder.dim} -> {encoder.dense.out_features}, e.g. a whitening "
                  f"map) is dropped: this stage changes the vectors it was fitted on", file=sys.stderr)
        encoder.dense = None
    if config.peft:  # BERT's weights frozen, adapters trained (models/peft.py; houlsby: models/bottleneck.py)
        encoder.adapters = make_adapters(encoder.bert, PeftSettings(**PeftSettings.pick(config)))
    config = config.with_model(encoder.bert.config.max_position_embeddings)
    encoder.max_length = config.eval_max_length
    encoder.precision = config.precision  # evaluation (encode) in the run's precision
    return encoder, config


def build_objective(config: PretrainConfig, encoder, examples) -> objectives.Objective:
    """The objective of the run's stage and method on ``encoder``, from its settings: the fields of
    its families (``Objective.SETTINGS``), what the run's own settings give it (SimCSE's MLP for
    --pooling cls-mlp, the training length, the checkpoint of MLM's head) and what its examples
    size (a supervised head); for --stage mix, a ``Mixture`` of each part's."""
    if config.stage == "mix":
        return objectives.Mixture({name: build_objective(part_config(config, stage, method, file), encoder,
                                                         examples[name])
                                   for name, stage, method, file in config.mix_parts()})
    cls = objectives.objective_class(config.stage, config.method)
    run_settings = {"mlp": config.pooling == "cls-mlp", "max_length": config.max_length,
                    "checkpoint": config.init or config.model}
    kwargs = {name: getattr(config, name) for name in cls.setting_names()}
    kwargs |= {k: v for k, v in run_settings.items() if k in cls.RUN_SETTINGS}
    if config.stage == "supervised":
        kwargs |= cls.from_examples(examples)
    return cls(encoder, mini_batch_size=config.mini_batch_size, **kwargs)


def dev_pairs(config: PretrainConfig):
    """The pairs of the evaluation that picks best/ (--select-on)."""
    return (read_stsb(Path(config.senteval_dir or Path(config.data_dir) / "SentEval") / STSB_FILES["dev"])
            if config.select_on == "stsb-dev" else read_sts(task_file(config.data_dir, "sts", "dev")))


def train(config: PretrainConfig, device) -> dict:
    """The run of ``config`` on ``device``. Under torchrun every rank runs this: each draws the same
    global batch, the objective draws its views of all of it and encodes this rank's rows, and it
    is DistributedDataParallel, so an update equals one process's on the global batch; rank 0
    alone evaluates, logs and writes the run directory (``Trainer``)."""
    rank, _ = dist_info()
    set_seed(config.seed)
    examples, config = load_examples(config, rank)
    check_batches(config, examples)
    pairs = dev_pairs(config)
    encoder, config = load_encoder(config)
    objective = build_objective(config, encoder, examples)
    # The dev pairs' first sentences are the held-out sentences of an objective's own metrics
    # (MLM's accuracy): no training corpus here holds them.
    trainer = Trainer(objective, examples, config, STSDevEvaluator(pairs), metric=SELECTION[config.select_on],
                      heldout=[p.sentence1 for p in pairs], record=config.to_dict(), mix_sampling=config.mix_sampling)
    summary = trainer.fit(device)
    if rank == 0:
        run_dir = Path(trainer.config.out_dir)
        if config.merge and not summary["interrupted"]:  # best/ read with its adapter merged, written plain
            save_dir_atomic(run_dir / "merged", SentenceEncoder.from_pretrained(run_dir / "best").save_pretrained)
        print(closing_line(summary, SELECTION_LABEL.get(config.select_on, ""), run_dir, device))
    return summary


def check_batches(config: PretrainConfig, examples) -> None:
    """Data that --batch-sampler no-duplicates (given, or the method's default: the Trainer's own
    choice) cannot make a batch from is refused now, before the run writes anything: the sampler
    would meet it at step 1, after the step-0 evaluation has written best/ and config.json, and the
    corrected command would then find a run in --out-dir."""
    parts = ({name: (objectives.objective_class(stage, method), examples[name], f"--mix part {name}")
              for name, stage, method, _ in config.mix_parts()} if config.stage == "mix" else
             {"corpus": (objectives.objective_class(config.stage, config.method), examples, "the data")})
    for cls, data, what in parts.values():
        if (config.batch_sampler or default_batch_sampler(cls.no_duplicates)) == "no-duplicates":
            check_distinct(list(zip(*data.columns)), config.batch_size, what)


def train_whiten(config: PretrainConfig, device) -> dict:
    """--stage whiten on ``device``, in one process (``training.whiten``: no training loop)."""
    if dist_info()[0] != 0:  # under torchrun, rank 0 fits alone
        return {}
    if config.whiten_on == "corpus":
        sentences, word_list = load_corpus(config)
        config = config.with_data(len(sentences), word_list)
    else:
        sentences = whiten.target_sentences(config.whiten_on, config.data_dir,
                                            config.senteval_dir or Path(config.data_dir) / "SentEval")
    evaluator = STSDevEvaluator(dev_pairs(config))
    encoder, config = load_encoder(config)
    summary = whiten.run(config, encoder.to(device), sentences, evaluator, SELECTION[config.select_on])
    print(whiten.final_line(summary, config.out_dir, SELECTION_LABEL[config.select_on]))
    return summary
