"""The self-supervised stages behind ``run_pretrain.py``: the corpus, an objective
(``bertcf.objectives``) and the Trainer.

- ``--stage mirror``: pretraining of the encoder: ``--method mirror`` (Mirror-BERT: dropout +
  token-span masking), ``simcse`` (dropout only), or ``bsl|ct|tsdae|mlm``.
- ``--stage joint``: the encoder frozen (unless ``--unfreeze-encoder``), a Glow flow learned on
  L = lambda * L_mirror(F(x)) + L_flow (BERT-CF), L_flow in bits per dimension by default
  (``--flow-loss-unit``). ``--method simcse`` gives SimCSE-joint.
- ``--stage flow``: the flow alone on L_flow (MinBERT-flow / Mirror-flow).
- ``--stage supervised``: the encoder trained on labelled data (``--train-file``) or by a teacher:
  ``--method sbert-softmax|sbert-cosine`` (Sentence-BERT), ``simcse-sup`` (supervised SimCSE),
  ``distill`` (knowledge distillation, ``--teacher``); the objective reads its examples.
- ``--stage whiten``: BERT-whitening, a linear head fitted in closed form on the encoder's vectors
  (``--whiten-on``, ``--whiten-dim``): no training loop (``bertcf.training.whiten``).

Every stage evaluates unsupervised STS-dev Spearman on whole sentences (``--eval-max-length``)
and keeps the best checkpoint. Every stage and method also runs data-parallel under
``torchrun --nproc_per_node N`` (``--batch-size`` stays the global batch; see ``train``).
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

from minbert import pad_batch
from minbert.model import load_state_dict_file

from . import cli, objectives, runs, training
from .data.download import WIKI1M_NAME, fetch_missing
from .data.senteval import STSB_FILES, read_stsb
from .data.tasks import TASK_FILES, TASKS, read_corpus, read_sts, task_file, task_sentences
from .data.words import read_word_list, top_words
from .errors import DataError, UsageError
from .evaluation.metrics import STSDevEvaluator
from .models.encoder import SentenceEncoder
from .objectives import presets
from .runs import resolve_encoder_path, run_settings
from .training import whiten
from .utils.distributed import dist_info, launch_world_size, run_distributed, wrap_ddp
from .utils.files import recover_dir

STAGES = tuple(objectives.METHODS) + ("whiten",)
METHODS = objectives.METHODS | {"whiten": (whiten.METHOD,)}
STAGE_LR = {"mirror": 1e-4, "joint": 3e-4, "flow": 3e-4, "supervised": 2e-5}  # whiten has no optimiser
#: --select-on -> the evaluation's metric that picks best/.
SELECTION = {"cs224n-sts": "sts_spearman", "stsb-dev": "sts_spearman", "mlm-heldout": "mlm_heldout_accuracy",
             "last": "last_step"}
SELECTION_LABEL = {"cs224n-sts": "STS dev Spearman", "stsb-dev": "STS-B dev Spearman",
                   "mlm-heldout": "held-out masked-token accuracy"}  # --select-on last has a line of its own
HELDOUT_SENTENCES = 512
#: What a run given to --init passes on to this one, unless the command line gives it: its data.
RUN_DATA = ("data_dir", "corpus", "corpus_from_tasks", "min_words", "max_sentences", "senteval_dir")


def build_parser() -> cli.ArgumentParser:
    p = cli.ArgumentParser(prog="run_pretrain.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--stage", choices=STAGES, default="mirror",
                   help="the report's stages: mirror pretrains the encoder (by --method), joint learns a flow "
                        "on it by BERT-CF's loss, flow a flow by L_flow alone; supervised trains the encoder on "
                        "labelled pairs or by a teacher (not the report's); whiten fits BERT-whitening (Su et al. "
                        "2021) in closed form, without training")
    p.add_argument("--method", default=None,
                   help="mirror (default) or simcse for --stage mirror|joint, or bsl, ct, tsdae, mlm for "
                        "--stage mirror; flow for --stage flow; sbert-softmax (default), sbert-cosine, simcse-sup "
                        "or distill for --stage supervised; whitening for --stage whiten")
    p.add_argument("--preset", choices=tuple(presets.PRESETS), default=None,
                   help="a method as its authors published it (loss variant, pooling, augmentation, temperature, "
                        "batch, lr, length, one epoch of the corpus); flags given here win; README lists what "
                        "each sets")
    g = p.add_argument_group("corpus")
    g.add_argument("--corpus", default=None, help="text file, one sentence per line "
                   "(default: DATA_DIR/wiki1m_for_simcse.txt when present)")
    g.add_argument("--corpus-from-tasks", action="store_true",
                   help="use the unlabeled sentences of the SST/QQP/STS training files in --data-dir")
    g.add_argument("--corpus-words", type=cli.checked(int, lambda v: v >= 2, "at least 2"), default=None,
                   help="a lexical corpus: the N most frequent English words (wordfreq), one a row, as "
                        "Mirror-BERT's word encoder (--preset mirror-bert-lexical: 10,000); --min-words does not apply")
    g.add_argument("--corpus-words-file", default=None,
                   help="a lexical corpus: one word or phrase per line (blank lines skipped, repeats kept once); "
                        "--min-words does not apply")
    g.add_argument("--min-words", type=int, default=6, help="drop corpus sentences with fewer words")
    g.add_argument("--max-sentences", type=int, default=None, help="use at most this many corpus sentences (or words)")
    g = p.add_argument_group("encoder")
    g.add_argument("--dropout", type=cli.PROBABILITY, default=0.1, help="encoder dropout (hidden and attention)")
    g.add_argument("--pooling", choices=("mean", "cls", "cls-mlp", "first-last-avg"), default="mean",
                   help="the sentence vector: the mean of the last layer over tokens, or [CLS]'s; cls-mlp "
                        "(SimCSE): an MLP over [CLS] in training, [CLS] without it in evaluation and the "
                        "checkpoint; first-last-avg (BERT-flow, BERT-whitening): the average of the first and "
                        "the last transformer layer's token means")
    g.add_argument("--vocab", default=None, help="vocab.txt for a checkpoint directory without tokenizer files")
    g.add_argument("--eval-max-length", type=cli.checked(int, lambda v: v >= 2, "at least 2"), default=None,
                   help="tokens per sentence in the STS-dev evaluation (default: the model's "
                        "max_position_embeddings, i.e. whole sentences, as SentEval); --max-length is for training")
    g = p.add_argument_group("model selection")
    g.add_argument("--select-on", choices=tuple(SELECTION), default="cs224n-sts",
                   help="what picks best/: CS224N STS dev Spearman (the report's), SentEval's STS-B dev Spearman, "
                        "(--method mlm) the held-out masked-token accuracy, for an MLM base whose STS falls as it "
                        "learns, or last: the last evaluation (the run's end, as Mirror-BERT's released code keeps)")
    g.add_argument("--senteval-dir", default=None, help="SentEval's data (default DATA_DIR/SentEval; data/README.md)")
    objectives.add_args(p)
    g = p.add_argument_group("whitening (--stage whiten)")
    g.add_argument("--whiten-on", choices=tuple(whiten.WHITEN_ON), default="corpus",
                   help="the sentences whose vectors the whitening is fitted on: " + "; ".join(
                       f"{k}, {v}" for k, v in whiten.WHITEN_ON.items()))
    g.add_argument("--whiten-dim", type=cli.AT_LEAST_1, default=None,
                   help="keep the first k whitened directions, those of largest variance (default: all; at most "
                        "the covariance's rank)")
    stage_lr = ", ".join(f"{lr:g} {stage}" for stage, lr in STAGE_LR.items())
    cli.add_common_args(p, lr=None, steps=10_000, batch_size=16, eval_every=250, max_length=32,
                        helps={"lr": f"AdamW's learning rate (default, by --stage: {stage_lr})"})
    return p


def check_args(args) -> None:
    world = launch_world_size()
    if args.batch_size % world:  # every rank stops here, before any data is read or collective run
        raise UsageError(f"--batch-size {args.batch_size} (the global batch) is not divisible by the {world} "
                         f"processes")
    methods = METHODS[args.stage]
    args.method = args.method or methods[0]
    if args.method not in methods:
        raise UsageError(f"--method {args.method!r} is not a method of --stage {args.stage} "
                         f"(choose from {', '.join(methods)})")
    if args.method == "simcse":
        args.span_cap = 0
    if args.lr is None:
        args.lr = STAGE_LR.get(args.stage)
    if args.batch_size < 2:
        raise UsageError(f"--batch-size must be at least 2 for contrastive learning, not {args.batch_size}")
    if args.select_on == "mlm-heldout" and args.method != "mlm":
        raise UsageError("--select-on mlm-heldout is for --method mlm")
    if args.stage != "whiten" and (args.whiten_dim is not None or args.whiten_on != "corpus"):
        raise UsageError("--whiten-on and --whiten-dim are for --stage whiten")
    if args.stage == "whiten":
        if args.select_on == "last":
            raise UsageError("--select-on last is for training stages: --stage whiten has one evaluation")
        if args.mini_batch_size:
            raise UsageError("--mini-batch-size is for the training stages: --stage whiten has no batches")
        args.steps = 0  # config.json says what ran: no optimiser step
    objectives.check_args(args)
    if args.out_dir is None:
        args.out_dir = runs.default_out_dir(args.stage, args.method)


def load_words(args) -> list[str]:
    """A lexical corpus (--corpus-words N or --corpus-words-file), one word or phrase a row; the
    word list's source is recorded in ``args.word_list`` (config.json)."""
    if args.corpus_words:
        words, args.word_list = top_words(args.corpus_words)
    else:
        words, args.word_list = read_word_list(args.corpus_words_file), str(args.corpus_words_file)
    print(f"note: corpus: {len(words)} words or phrases from {args.word_list}", file=sys.stderr)
    return words


def fetch_data(args) -> None:
    """The files this run reads from --data-dir by default (Wiki1M unless --corpus or
    --corpus-from-tasks, the task train files for the latter, the CS224N STS dev file to select
    on), downloaded when missing; when that fails, the line a missing file has always given, with
    why it was not downloaded."""
    data = Path(args.data_dir)
    reads = args.whiten_on == "corpus" if args.stage == "whiten" else objectives.reads_corpus(args)
    default_corpus = reads and not any(getattr(args, f, None) for f in presets.CORPUS_FLAGS)
    names = ([WIKI1M_NAME] if default_corpus else []) \
        + ([TASK_FILES[t, "train"] for t in TASKS] if args.corpus_from_tasks and reads else []) \
        + ([TASK_FILES["sts", "dev"]] if args.select_on == "cs224n-sts" else [])
    why = fetch_missing(data, names)
    if why is None:
        return
    if default_corpus and not (data / WIKI1M_NAME).is_file():
        raise UsageError(f"no corpus: give --corpus FILE or --corpus-from-tasks ({data / WIKI1M_NAME} not found; "
                         f"{why})")
    missing = ", ".join(str(data / n) for n in names if not (data / n).is_file())
    raise DataError(f"{missing} not found ({why})")


def load_corpus(args) -> list[str]:
    given = [f"--{f.replace('_', '-')}" for f in presets.CORPUS_FLAGS if getattr(args, f, None)]
    if len(given) > 1:
        raise UsageError(f"give one corpus, not {' and '.join(given)} together")
    if args.corpus_words or args.corpus_words_file:
        sentences = load_words(args)
    elif args.corpus_from_tasks:
        sentences = task_sentences(args.data_dir)
        sentences = [s for s in sentences if len(s.split()) >= args.min_words]
    else:
        corpus = args.corpus or Path(args.data_dir) / "wiki1m_for_simcse.txt"
        if args.corpus is None and not Path(corpus).is_file():
            raise UsageError(f"no corpus: give --corpus FILE, --corpus-from-tasks or --corpus-words N ({corpus} "
                             f"not found)")
        sentences = read_corpus(corpus, min_words=args.min_words)
    if args.max_sentences:
        sentences = sentences[:args.max_sentences]
    if len(sentences) < 2:
        raise UsageError(f"the corpus has {len(sentences)} usable sentence(s); contrastive learning needs at least 2")
    return sentences


def load_examples(args, rank: int = 0) -> objectives.Examples:
    """What the run trains on: the corpus, or a supervised method's examples (``objectives.read_examples``);
    a preset measured in epochs gets its --steps from their number."""
    examples = objectives.read_examples(args, lambda: load_corpus(args))
    if rank == 0 and args.stage == "supervised":
        print(f"note: training on {examples.what}", file=sys.stderr)
    if not args.resume:
        presets.set_length(args, len(examples))
    return examples


class GeneratorState:
    """Makes a torch.Generator's state part of a checkpoint (for the span sampler)."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def state_dict(self):
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state):
        self.generator.set_state(state["state"])


def load_encoder(args) -> SentenceEncoder:
    """The encoder to start from: --init (a run directory or checkpoint) or --model. Its
    ``max_length`` (what evaluation and a later ``encode`` of the checkpoint use) is
    --eval-max-length, resolved here to the model's limit when not given, so config.json records it."""
    source = resolve_encoder_path(args.init) if args.init else args.model
    pooling = "cls" if args.pooling == "cls-mlp" else args.pooling  # the MLP is the objective's (training only)
    encoder = SentenceEncoder.from_pretrained(source, pooling=pooling, vocab=args.vocab,
                                              hidden_dropout_prob=args.dropout,
                                              attention_probs_dropout_prob=args.dropout)
    limit = encoder.bert.config.max_position_embeddings
    args.eval_max_length = min(args.eval_max_length or limit, limit)
    encoder.max_length = args.eval_max_length
    encoder.precision = args.precision  # evaluation (encode) in the run's precision
    return encoder


def take_data_from_init(parser, argv, args) -> None:
    """With --init RUN (a run directory or its best/ checkpoint), RUN's data flags (RUN_DATA, from
    its config.json) where the command line ``argv`` gives none, so the README's stage-2 command
    needs none; --corpus or --corpus-from-tasks keeps both of RUN's out. Sets them in ``args``
    (parsed from ``argv``) and says on stderr what it took."""
    found = run_settings(args.init) if args.init and not args.resume else None
    if found is None:
        return
    run_dir, settings = found
    missing = set(RUN_DATA) - cli.given_flags(parser, argv)
    if not {"corpus", "corpus_from_tasks"} <= missing or args.corpus_words or args.corpus_words_file:
        missing -= {"corpus", "corpus_from_tasks"}
    taken = {k: settings[k] for k in RUN_DATA
             if k in missing and k in settings and settings[k] != parser.get_default(k)}
    if taken:
        vars(args).update(taken)
        flags = " ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in taken.items())
        print(f"note: --init {run_dir}: its data, as no flag here gives them: {flags}", file=sys.stderr)


def main(argv=None) -> dict:
    parser = build_parser()
    args = cli.parse_args(parser, argv)
    if args.resume:  # the run goes on with what its preset set (config.json has it), not the preset anew
        args.preset_values = json.loads((Path(args.out_dir) / "config.json").read_text()).get("preset_values", {})
    else:
        presets.apply(args, cli.given_flags(parser, argv))
    take_data_from_init(parser, argv, args)
    args.command = cli.command_line("run_pretrain.py", argv)
    check_args(args)
    with runs.hold(args.out_dir):  # one run per directory, from before anything is written
        fetch_data(args)
        return run_distributed(train_whiten if args.stage == "whiten" else train, args)


def dev_pairs(args):
    """The pairs of the evaluation that picks best/ (--select-on)."""
    return (read_stsb(Path(args.senteval_dir or Path(args.data_dir) / "SentEval") / STSB_FILES["dev"])
            if args.select_on == "stsb-dev" else read_sts(task_file(args.data_dir, "sts", "dev")))


def train_whiten(args, device) -> dict:
    """--stage whiten on ``device``, in one process (``bertcf.training.whiten``: no training loop)."""
    if dist_info()[0] != 0:  # under torchrun, rank 0 fits alone
        return {}
    sentences = load_corpus(args) if args.whiten_on == "corpus" else whiten.target_sentences(
        args.whiten_on, args.data_dir, args.senteval_dir or Path(args.data_dir) / "SentEval")
    evaluator = STSDevEvaluator(dev_pairs(args))
    summary = whiten.run(args, load_encoder(args).to(device), sentences, evaluator, SELECTION[args.select_on])
    print(whiten.final_line(summary, args.out_dir, SELECTION_LABEL[args.select_on]))
    return summary


def train(args, device) -> dict:
    """The run of ``args`` on ``device``. Under torchrun every rank runs this: each draws the same
    global batch, the objective draws its views of all of it and encodes this rank's rows, and it
    is DistributedDataParallel, so an update equals one process's on the global batch; rank 0
    alone evaluates, logs and writes the run directory (training.Trainer)."""
    rank, world = dist_info()
    if world > 1:  # the default --out-dir names the time: every rank takes rank 0's (for its messages)
        out_dir = [args.out_dir]
        torch.distributed.broadcast_object_list(out_dir, src=0)
        args.out_dir = out_dir[0]
    training.set_seed(args.seed)
    examples = load_examples(args, rank)
    pairs = dev_pairs(args)
    evaluator = STSDevEvaluator(pairs)
    encoder = load_encoder(args)
    generator = torch.Generator().manual_seed(args.seed)  # every random choice of the objective
    objective = objectives.build_objective(args.stage, args.method, encoder, args, generator, examples).to(device)

    tokenizer = encoder.tokenizer
    columns = [tokenizer(c, truncation=True, max_length=args.max_length)["input_ids"] for c in examples.columns]
    special_ids = torch.tensor(tokenizer.all_special_ids)
    sampler = training.EpochSampler(len(examples), seed=args.seed)
    if args.compile:  # minBERT layer by layer, in place, so evaluation runs compiled too
        encoder.bert.compile_layers()
    # What the step calls: under torchrun a DistributedDataParallel wrapper (gradients averaged
    # over ranks); in one process the objective itself, which evaluation and checkpoints use.
    step_objective = wrap_ddp(objective, device)

    def batch(ids_list):
        ids, mask = pad_batch(ids_list, tokenizer.pad_token_id)
        return ids, mask, torch.isin(ids, special_ids) | (mask == 0)

    def step_fn(step):
        # The global batch, padded as one process would pad it; every rank draws the same. Its
        # columns (pairs, triples) are stacked: column j in rows j*B .. (j+1)*B - 1.
        rows = sampler.next(args.batch_size)
        extra = {"texts": [examples.columns[0][i] for i in rows]} if objective.needs_text else {}
        if examples.labels is not None:
            extra["labels"] = examples.labels[torch.tensor(rows)]
        return step_objective(*batch([c[i] for c in columns for i in rows]), rank=rank, world=world, **extra)

    # Held-out sentences for the objective's own metrics (MLM's accuracy): the dev pairs' first
    # sentences, which no training corpus here holds.
    heldout = batch(tokenizer([p.sentence1 for p in pairs[:HELDOUT_SENTENCES]], truncation=True,
                              max_length=args.max_length)["input_ids"])

    def evaluate(step):  # rank 0 only (the Trainer); the other ranks wait at a barrier
        result = evaluator(encoder) | objective.heldout_metrics(*heldout)
        run.histogram(step, "eval/sts_dev_cosines", result.pop("cosines"))
        return result | ({"last_step": step} if args.select_on == "last" else {})  # the latest is the best

    run = runs.Run(args.out_dir, vars(args), resume=args.resume)

    def save_model(directory):
        """The encoder (and flow) checkpoint. A frozen encoder never changes during the run, so
        once a checkpoint of it exists its weights are hard-linked rather than written again at
        every evaluation (twice: last/ and best/)."""
        written = [d / "model.safetensors" for d in (run.dir / "last", run.dir / "best")]
        reuse = next((f for f in written if f.is_file()), None) if objective.encoder_frozen else None
        encoder.save_pretrained(directory, link_weights_from=reuse)

    optimizer = training.make_optimizer(objective.parameter_groups(), args.lr, args.weight_decay, device)
    scheduler = training.make_scheduler(optimizer, args.lr_schedule, args.warmup_steps, args.steps)
    trainer = training.Trainer(args, run, objective.checkpoint_modules(), optimizer, scheduler, {"corpus": sampler},
                               metric=SELECTION[args.select_on], save_model=save_model, evaluate=evaluate,
                               items_per_step=args.batch_size, extra_state={"span": GeneratorState(generator)})
    if args.resume:
        if objective.encoder_frozen:  # the encoder as this run used it, whatever --init holds now
            last = recover_dir(run.dir / "last")
            encoder.bert.load_hf_state_dict(load_state_dict_file(last / "model.safetensors"), source=str(last))
        trainer.resume()
    summary = trainer.fit(step_fn, after_step=objective.after_step)
    if rank == 0:
        print(final_line(summary, run.dir, SELECTION_LABEL[args.select_on]) if args.select_on != "last"
              else f"best checkpoint (the last evaluation, step {summary['best_step']}): {run.dir / 'best'}")
    return summary


def final_line(summary: dict, run_dir, label: str = "STS dev Spearman") -> str:
    """The closing line: the selection metric (``label``) at step 0 and at its best, and where the
    best checkpoint is."""
    def score(x):
        return "n/a" if x is None or not math.isfinite(x) else f"{x:.4f}"
    if summary["best_step"] is None:  # every evaluation gave nan (e.g. constant cosines)
        return f"{label}: step 0 {score(summary['first'])}; no best checkpoint written"
    return (f"{label}: step 0 {score(summary['first'])}, best {score(summary['best'])} at step "
            f"{summary['best_step']}; best checkpoint: {Path(run_dir) / 'best'}")


def command(argv=None) -> int:
    """``run_pretrain.py`` and ``bertcf-pretrain``: the command's exit status (bad input: one line, 2)."""
    return cli.run_main(main, argv)
