"""``run_pretrain.py``'s settings (``PretrainConfig``), resolved once by ``parse``: the flags (with
--resume, the run's config.json), a --preset's values, the data of an --init run, the stage's
defaults (method, lr, out dir) and the checks that need more than one flag, all before any data is
read (but "one corpus": which corpus flags name files is checked where the corpus is read,
``data.corpus``). After it a run's config changes only through two named steps: ``with_data`` (a
preset measured in epochs gets its steps once the corpus is counted) and ``with_model`` (the
evaluation's length, the model's limit); a --stage mix run gives each part its own config
(``training.pretraining.part_config``). ``config.json`` is ``to_dict()`` of the final object."""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, fields
from pathlib import Path

from .. import cli, runs
from ..errors import UsageError
from ..models.encoder import POOLINGS
from ..models.peft import PeftSettings
from ..objectives import METHODS as OBJECTIVE_METHODS
from ..objectives import FAMILIES as OBJECTIVE_FAMILIES
from ..objectives import MINI_BATCH_METHODS, SIMCSE_VIEWS, SUPERVISED, methods_taking, objective_class
from ..objectives.presets import PRESETS
from ..objectives.settings import (
    BSLSettings,
    CoSENTSettings,
    CTSettings,
    FlowSettings,
    InfoNCESettings,
    JointLossSettings,
    MarginMSESettings,
    MatryoshkaSettings,
    MemorySettings,
    MLMSettings,
    SpanSettings,
    TSDAESettings,
)
from ..settings import Settings, derived, option, redefault
from ..utils.distributed import launch_world_size
from ..data.corpus import CORPUS_SETTINGS
from .data import CorpusConfig, DataConfig, TrainFilesConfig
from .model import ModelConfig
from .train import TrainConfig

WHITEN_METHOD = "whitening"  # --stage whiten's one method
#: --whiten-on -> what the whitening is fitted on (``training.whiten`` reads the sets).
WHITEN_ON = {
    "corpus": "the pretraining corpus (--corpus, --corpus-from-tasks or DATA_DIR/wiki1m_for_simcse.txt; "
              "--max-sentences caps it)",
    "sts-dev": "the CS224N STS dev sentences, both of every pair: the paper's target variant for the report's metric",
    "stsb": "SentEval's STS-B train, dev and test sentences: the paper's target set for STS-B",
    "stsb-test": "SentEval's STS-B test sentences",
    "senteval-sts": "the sentences of every SentEval STS test set present (STS12-16, STS-B, SICK-R)",
}
#: --mix-sampling: which part of a mixture each step trains (``training.sampler.TaskSampler``'s one-part modes).
MIX_SAMPLINGS = ("proportional", "round-robin")
STAGES = tuple(OBJECTIVE_METHODS) + ("whiten", "mix")
METHODS = OBJECTIVE_METHODS | {"whiten": (WHITEN_METHOD,), "mix": ("mix",)}
STAGE_LR = {"mirror": 1e-4, "joint": 3e-4, "flow": 3e-4, "supervised": 2e-5, "mix": 1e-4}  # whiten: no optimiser
#: The methods a mixture's part may be: a corpus's (--stage mirror) or a labelled file's (--stage supervised).
MIX_METHODS = {m: "mirror" for m in OBJECTIVE_METHODS["mirror"]} | {
    m: "supervised" for m in OBJECTIVE_METHODS["supervised"] if m != "distill"}
#: --select-on -> the evaluation's metric that picks best/.
SELECTION = {"cs224n-sts": "sts_spearman", "stsb-dev": "sts_spearman", "mlm-heldout": "mlm_heldout_accuracy",
             "last": "last_step"}
SELECTION_LABEL = {"cs224n-sts": "STS dev Spearman", "stsb-dev": "STS-B dev Spearman",
                   "mlm-heldout": "held-out masked-token accuracy"}  # last: no score (loop.closing_line)
#: The poolings of training: the encoder's, and SimCSE's MLP over [CLS] (the objective's, in training only).
TRAINING_POOLINGS = POOLINGS + ("cls-mlp",)
#: What a run given to --init passes on to this one, unless the command line gives it: its data.
RUN_DATA = ("data_dir", "corpus", "corpus_from_tasks", "min_words", "max_sentences", "senteval_dir")


@dataclass(frozen=True)
class StageConfig(Settings):
    stage: str = option("mirror", "the report's stages: mirror pretrains the encoder (by --method), joint learns a "
                                  "flow on it by BERT-CF's loss, flow a flow by L_flow alone; supervised trains the "
                                  "encoder on labelled pairs or by a teacher (not the report's); whiten fits "
                                  "BERT-whitening (Su et al. 2021) in closed form, without training; mix trains the "
                                  "encoder on several (method, data) parts at once (--mix)", choices=STAGES)
    method: str | None = option(None, "mirror (default) or simcse for --stage mirror|joint, or bsl, ct, tsdae, mlm for "
                                      "--stage mirror; flow for --stage flow; sbert-softmax (default), sbert-cosine, "
                                      "simcse-sup, distill, cosent, angle or margin-mse for --stage supervised; "
                                      "whitening for --stage whiten")
    preset: str | None = option(None, "a method as its authors published it (loss variant, pooling, augmentation, "
                                      "temperature, batch, lr, length, one epoch of the corpus); flags given here "
                                      "win; docs/pretraining.md lists what each sets", choices=tuple(PRESETS))


@dataclass(frozen=True)
class SelectionConfig(Settings):
    """What picks best/, and the evaluation that scores it."""

    GROUP = "model selection"
    select_on: str = option("cs224n-sts", "what picks best/: CS224N STS dev Spearman (the report's), SentEval's STS-B "
                                          "dev Spearman, (--method mlm) the held-out masked-token accuracy, for an MLM "
                                          "base whose STS falls as it learns, or last: the last evaluation (the run's "
                                          "end, as Mirror-BERT's released code keeps)", choices=tuple(SELECTION))
    senteval_dir: str | None = option(None, "SentEval's data (default DATA_DIR/SentEval; data/README.md)")
    eval_max_length: int | None = option(None, "tokens per sentence in the STS-dev evaluation (default: the model's "
                                               "max_position_embeddings, i.e. whole sentences, as SentEval); "
                                               "--max-length is for training", type=cli.AT_LEAST_2)


@dataclass(frozen=True)
class MixConfig(Settings):
    """--stage mix: several (objective, data) parts on one encoder, one part's batch a step."""

    GROUP = "mixture (--stage mix)"
    mix: list[str] | None = option(None, "the parts, each METHOD=FILE: a --stage mirror method and its corpus (one "
                                         "sentence a line), or a --stage supervised method (not distill) and its "
                                         "--train-file; e.g. simcse=data/wiki1m_for_simcse.txt simcse-sup=data/snli.jsonl",
                                   nargs="+", metavar="METHOD=FILE")
    mix_sampling: str = option("proportional", "which part each step trains: proportional, a seeded draw weighted by "
                                               "the parts' sizes, or round-robin, each in turn", choices=MIX_SAMPLINGS)

    def mix_parts(self) -> list[tuple[str, str, str, str]]:
        """(name, stage, method, file) of each part; a method given twice is named method-2, ..."""
        parts, seen = [], {}
        for entry in self.mix or ():
            method, sep, file = entry.partition("=")
            if not sep or not file or method not in MIX_METHODS:
                raise UsageError(f"--mix {entry}: give METHOD=FILE, METHOD one of {', '.join(MIX_METHODS)}")
            seen[method] = seen.get(method, 0) + 1
            parts.append((method if seen[method] == 1 else f"{method}-{seen[method]}", MIX_METHODS[method], method,
                          file))
        return parts


@dataclass(frozen=True)
class WhitenConfig(Settings):
    GROUP = "whitening (--stage whiten)"
    whiten_on: str = option("corpus", "the sentences whose vectors the whitening is fitted on: " + "; ".join(
        f"{k}, {v}" for k, v in WHITEN_ON.items()), choices=tuple(WHITEN_ON))
    whiten_dim: int | None = option(None, "keep the first k whitened directions, those of largest variance (default: "
                                          "all; at most the covariance's rank)", type=cli.AT_LEAST_1)


STAGE_LR_HELP = ", ".join(f"{lr:g} {stage}" for stage, lr in STAGE_LR.items())


@dataclass(frozen=True)
class PretrainConfig(PeftSettings, MixConfig, WhitenConfig, MLMSettings, TSDAESettings, CTSettings, BSLSettings, JointLossSettings, FlowSettings,
                     MatryoshkaSettings, MarginMSESettings, CoSENTSettings, TrainFilesConfig, MemorySettings, InfoNCESettings, SpanSettings,
                     SelectionConfig, TrainConfig, ModelConfig, CorpusConfig, DataConfig, StageConfig):
    """Every setting of a ``run_pretrain.py`` run (the bases, one per concern, in --help's order
    reversed)."""

    lr: float | None = redefault(TrainConfig, "lr", None, help=f"AdamW's learning rate (default, by --stage: "
                                                              f"{STAGE_LR_HELP})")
    pooling: str = redefault(ModelConfig, "pooling", "mean", choices=TRAINING_POOLINGS, group="encoder",
                             help="the sentence vector: the mean of the last layer over tokens, or [CLS]'s; cls-mlp "
                                  "(SimCSE): an MLP over [CLS] in training, [CLS] without it in evaluation and the "
                                  "checkpoint; first-last-avg (BERT-flow, BERT-whitening): the average of the first "
                                  "and the last transformer layer's token means")
    mini_batch_size: int | None = redefault(MemorySettings, "mini_batch_size", group=f"memory ({MINI_BATCH_METHODS})")
    command: str | None = derived(help="the command line that started the run")
    preset_values: dict = derived(default_factory=dict, help="what --preset set (flags given on the command line win)")
    preset_epochs: float | None = derived(help="the preset's length in passes over the data (sets steps)")
    preset_warmup: float | None = derived(help="the preset's share of warm-up steps")
    word_list: str | None = derived(help="where a lexical corpus's words come from")

    def with_data(self, examples: int, word_list: str | None = None) -> PretrainConfig:
        """The config once the data is read (``examples`` of them): a preset measured in epochs gets
        its --steps (and --warmup-steps); a lexical corpus records its word list."""
        changes, values = {"word_list": word_list}, dict(self.preset_values)
        if self.preset_epochs and not self.resume:
            changes["steps"] = values["steps"] = max(1, math.ceil(self.preset_epochs * examples / self.batch_size))
        if self.preset_warmup and not self.resume:
            steps = changes.get("steps", self.steps)
            changes["warmup_steps"] = values["warmup_steps"] = max(1, round(self.preset_warmup * steps))
        return self.replace(**changes, preset_values=values)

    def with_model(self, max_positions: int) -> PretrainConfig:
        """The config for an encoder of ``max_positions`` tokens: --eval-max-length at most that
        (whole sentences when not given), as config.json records it."""
        return self.replace(eval_max_length=min(self.eval_max_length or max_positions, max_positions))


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(prog="run_pretrain.py", description="The self-supervised and supervised stages of "
                                "BERT-CF: pretraining of the encoder, the flow, whitening.")
    PretrainConfig.add_arguments(parser)
    return parser


def parse(argv=None) -> PretrainConfig:
    """The run of ``argv``, resolved (see the module's docstring)."""
    parser = build_parser()
    config = PretrainConfig(**vars(cli.parse_args(parser, argv, upgrade=upgrade_saved)))
    return resolve(config, cli.given_flags(parser, argv), cli.command_line("run_pretrain.py", argv))


def resolve(config: PretrainConfig, given: set[str], command: str | None = None) -> PretrainConfig:
    """``config`` (its fields as a caller set them; ``given``: the names it set, which a preset or an
    --init run does not override) resolved as ``parse`` resolves a command line: what another
    command that runs a pretraining stage (GPL's training step) calls with the config it builds.
    ``command``: the command line config.json records."""
    config = config.replace(**(saved_preset(config) if config.resume else preset_values(config, given)))
    config = config.replace(**data_from_init(config, given), command=command)
    check_world(config)
    config = config.replace(**stage_defaults(config, given | set(config.preset_values)))
    check(config)
    classes = run_objectives(config)
    return config.resolved((config.stage, config.method), classes[0].no_duplicates if len(classes) == 1 else None)


def resumed(run_dir, command: str | None = None, /, **changes) -> PretrainConfig:
    """--resume from Python, as ``run_pretrain.py --resume --out-dir RUN_DIR`` resolves it: the run
    in ``run_dir`` with the settings it was started with (its config.json's flags), ``changes``
    (where and how it runs now: device, progress, ...) over them."""
    flags = {f.name for f in fields(PretrainConfig) if f.metadata.get("cli")}
    saved = {k: v for k, v in upgrade_saved(cli.saved_settings(run_dir)).items() if k in flags}
    config = PretrainConfig(**saved | changes | {"out_dir": str(run_dir), "resume": True})
    return resolve(config, set(changes) | {"out_dir", "resume"}, command)


def upgrade_saved(saved: dict) -> dict:
    """--resume of a run written before a setting existed: the behaviour it ran with then (every
    run drew its batches at random before --batch-sampler)."""
    return {"batch_sampler": "random"} | saved


def saved_preset(config: PretrainConfig) -> dict:
    """--resume: the run goes on with what its preset set (its config.json), not the preset anew."""
    saved = json.loads((Path(config.out_dir) / "config.json").read_text())
    return {"preset_values": saved.get("preset_values", {})}


def preset_values(config: PretrainConfig, given: set[str]) -> dict:
    """The settings ``config.preset`` sets where the command line (``given``: the settings it gave)
    does not, and what it records of them; a note on stderr says what it set."""
    if not config.preset:
        return {}
    preset = PRESETS[config.preset]
    corpus_given = bool(given & set(CORPUS_SETTINGS))  # a corpus on the command line replaces the preset's
    values = {k: v for k, v in preset.values.items() if k not in given and not (corpus_given and k in CORPUS_SETTINGS)}
    shown = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in values.items())
    print(f"note: --preset {preset.name} ({preset.source}): {shown}", file=sys.stderr)
    return values | {"preset_values": values, "preset_epochs": preset.epochs if "steps" not in given else None,
                     "preset_warmup": preset.warmup if "warmup_steps" not in given else None}


def data_from_init(config: PretrainConfig, given: set[str]) -> dict:
    """With --init RUN (a run directory or its best/ checkpoint), RUN's data settings (RUN_DATA, from
    its config.json) where the command line gives none, so the README's stage-2 command needs none;
    --corpus or --corpus-from-tasks keeps both of RUN's out. Says on stderr what it took."""
    found = runs.run_settings(config.init) if config.init and not config.resume else None
    if found is None:
        return {}
    run_dir, settings = found
    missing = set(RUN_DATA) - given
    if not {"corpus", "corpus_from_tasks"} <= missing or config.corpus_words or config.corpus_words_file:
        missing -= {"corpus", "corpus_from_tasks"}
    taken = {k: settings[k] for k in RUN_DATA
             if k in missing and k in settings and settings[k] != default(k)}
    if taken:
        flags = " ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in taken.items())
        print(f"note: --init {run_dir}: its data, as no flag here gives them: {flags}", file=sys.stderr)
    return taken


def check_world(config: PretrainConfig) -> None:
    world = launch_world_size()
    if config.batch_size % world:  # every rank stops here, before any data is read or collective run
        raise UsageError(f"--batch-size {config.batch_size} (the global batch) is not divisible by the {world} "
                         f"processes")


def stage_defaults(config: PretrainConfig, given: set[str]) -> dict:
    """The stage's defaults: its first method, its learning rate; simcse's views have no span (a
    span given for it is refused: ``given``, the settings the caller set); the whitening stage has
    no optimiser step (config.json says what ran)."""
    methods = METHODS[config.stage]
    method = config.method or methods[0]
    if method not in methods:
        raise UsageError(f"--method {method!r} is not a method of --stage {config.stage} "
                         f"(choose from {', '.join(methods)})")
    changes = {"method": method, "lr": STAGE_LR.get(config.stage) if config.lr is None else config.lr}
    if method == "simcse":  # --stage mirror's SimCSE objective and --stage joint's SimCSE-joint alike
        for name, value in SIMCSE_VIEWS.items():
            if name in given and getattr(config, name) != value:
                raise UsageError(f"--{name.replace('_', '-')} {getattr(config, name)}: --method simcse's two views "
                                 f"differ by dropout alone (--span-cap 0, token views); --method mirror masks a span")
        changes |= SIMCSE_VIEWS
    return changes


def default(name: str):
    """The value of setting ``name`` when nothing sets it."""
    return PretrainConfig.__dataclass_fields__[name].default


def run_objectives(config: PretrainConfig) -> list:
    """The objective classes the run trains: its method's, each --mix part's, none for --stage whiten."""
    if config.stage == "whiten":
        return []
    if config.stage == "mix":
        return [objective_class(stage, method) for _, stage, method, _ in config.mix_parts()]
    return [objective_class(config.stage, config.method)]


def check_families(config: PretrainConfig) -> None:
    """A setting of a family (``objectives.settings``) that no objective of the run takes, set
    anyway (a flag, a preset, a value from Python), is refused: the run would go on without it."""
    classes = run_objectives(config)
    taken = {family for cls in classes for family in cls.SETTINGS}
    for family in OBJECTIVE_FAMILIES:
        given = [name for name in family.names() if family not in taken and getattr(config, name) != default(name)]
        if given:
            this = (f"--stage {config.stage}" if config.stage in ("whiten", "joint", "flow") else
                    f"--stage mix's parts ({', '.join(p[2] for p in config.mix_parts())})" if config.stage == "mix"
                    else config.method)
            raise UsageError(f"--{given[0].replace('_', '-')} is a setting of {', '.join(methods_taking(family))}, "
                             f"not of {this}")


def check(config: PretrainConfig) -> None:
    """What the fields' own checks cannot see: settings that belong to other stages or methods."""
    if config.batch_size < 2:
        raise UsageError(f"--batch-size must be at least 2 for contrastive learning, not {config.batch_size}")
    if config.select_on == "mlm-heldout" and config.method != "mlm":
        raise UsageError("--select-on mlm-heldout is for --method mlm")
    if config.stage != "whiten" and (config.whiten_dim is not None or config.whiten_on != "corpus"):
        raise UsageError("--whiten-on and --whiten-dim are for --stage whiten")
    if config.stage == "whiten":
        if config.select_on == "last":
            raise UsageError("--select-on last is for training stages: --stage whiten has one evaluation")
        if config.mini_batch_size:
            raise UsageError("--mini-batch-size is for the training stages: --stage whiten has no batches")
    check_mix(config)
    check_families(config)
    check_peft(config)
    cls = objective_class(config.stage, config.method) if config.stage not in ("whiten", "mix") else None
    if config.mini_batch_size and cls is not None and not cls.mini_batches:
        raise UsageError(f"--mini-batch-size is for the objectives that compare a batch's sentence vectors "
                         f"({MINI_BATCH_METHODS}); --method {config.method}'s loss is a sum over each sentence's "
                         f"tokens, whose memory a cache of sentence vectors would not bound")
    if config.pooling == "cls-mlp" and (config.stage, config.method) not in (
            ("mirror", "mirror"), ("mirror", "simcse"), ("supervised", "simcse-sup")):
        raise UsageError("--pooling cls-mlp (SimCSE's training head) is for --stage mirror --method mirror|simcse and "
                         "--stage supervised --method simcse-sup")
    check_supervised(config)


def check_peft(config: PretrainConfig) -> None:
    """--peft: not for the stages that train no encoder weight or all of it (whiten, flow, joint), nor
    for CT, whose second encoder is a copy trained whole."""
    parts = [p[1:3] for p in config.mix_parts()] if config.stage == "mix" else [(config.stage, config.method)]
    what = next((f"--stage {s}" if s in ("whiten", "flow", "joint") else f"--method {m}" for s, m in parts
                 if s in ("whiten", "flow", "joint") or m == "ct"), None)
    if config.peft and what:
        raise UsageError(f"--peft {config.peft} does not apply to {what}: it trains no adapter in the encoder")


def check_mix(config: PretrainConfig) -> None:
    """--mix belongs to --stage mix, which needs two or more parts and takes its data from them."""
    if config.stage != "mix":
        if config.mix:
            raise UsageError("--mix is for --stage mix")
        return
    if len(config.mix_parts()) < 2:
        raise UsageError("--stage mix needs --mix METHOD=FILE METHOD=FILE ... (two or more parts)")
    given = [f"--{f.replace('_', '-')}" for f in (*CORPUS_SETTINGS, "train_file", "preset") if getattr(config, f)]
    if given:
        raise UsageError(f"--stage mix takes each part's data from --mix, not {', '.join(given)}")


def check_supervised(config: PretrainConfig) -> None:
    """The supervised group's settings belong to their methods."""
    method = config.method if config.stage == "supervised" else None
    if config.train_file and method is None:
        raise UsageError("--train-file is for --stage supervised (its methods read labelled files)")
    if method in ("sbert-softmax", "simcse-sup") and not config.train_file:
        raise UsageError(f"--method {method} needs --train-file FILE [FILE ...] (NLI: SNLI/MultiNLI .jsonl or "
                         f".txt, or a premise<TAB>hypothesis<TAB>label TSV" + (", or a CS224N QQP file)"
                                                                                 if method == "sbert-softmax" else
                                                                                 "; or triplets, or (query, positive) "
                                                                                 "pairs: a TSV or a BEIR-layout set)"))
    if method == "margin-mse" and not config.train_file:
        raise UsageError("--method margin-mse needs --train-file FILE [FILE ...] (query<TAB>positive<TAB>negative<TAB>"
                         "margin rows under that header; python -m bertcf.gpl writes them)")
    if method == "distill" and not config.teacher:
        raise UsageError("--method distill needs --teacher DIR|NAME (the encoder to distil)")
    if method != "distill" and (config.teacher or config.teacher_cache):
        raise UsageError("--teacher and --teacher-cache are for --stage supervised --method distill")
    if method == "simcse-sup" and config.negatives == "ntxent":
        raise UsageError("--negatives ntxent (two views of one sentence) does not apply to simcse-sup: "
                         "choose report or simcse")


def reads_corpus(config: PretrainConfig) -> bool:
    """Whether the run reads the pretraining corpus: every method but the supervised ones that train
    on --train-file, and the whitening fitted on the corpus."""
    if config.stage == "whiten":
        return config.whiten_on == "corpus"
    if config.stage == "mix":
        return False  # each part names its own file
    return config.stage != "supervised" or SUPERVISED[config.method].reads_corpus(config)
