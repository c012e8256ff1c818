"""The pretraining methods as their authors published them: ``run_pretrain.py --preset NAME``.

BERT-CF's report changes the methods it builds on (one-sided InfoNCE with 2b - 1 candidates, token
spans, mean pooling, batch 16), and its settings stay the defaults. A preset sets instead what a
method's paper and released code use: the loss variant, pooling, augmentation, temperature,
batch, learning rate, length, and the length of the run (one epoch of the corpus becomes
``--steps``). A flag given on the command line wins over the preset. ``config.json`` records
the preset (``preset``) and every value it set (``preset_values``); ``--resume`` continues with them.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Preset:
    """One method as published. ``values``: run_pretrain.py settings (argparse dests) -> value;
    ``epochs``: the run's length in passes over the corpus (sets --steps); ``warmup``: the share of
    the steps of linear warm-up (sets --warmup-steps); ``source``: where the values come from;
    ``differs``: what still differs from the publication."""

    name: str
    source: str
    values: dict = field(default_factory=dict)
    epochs: float | None = None
    warmup: float | None = None
    differs: str = ""


PRESETS = {p.name: p for p in (
    Preset("simcse-unsup", "Gao et al. 2021 (SimCSE, EMNLP); princeton-nlp/SimCSE run_unsup_example.sh",
           dict(stage="mirror", method="simcse", negatives="simcse", pooling="cls-mlp", temperature=0.05,
                batch_size=64, lr=3e-5, max_length=32, dropout=0.1, weight_decay=0.0, lr_schedule="linear",
                eval_every=250),
           epochs=1,
           differs="SimCSE trains on Wiki1M (give --corpus) and picks its checkpoint on STS-B dev "
                   "(--select-on stsb-dev); AdamW without weight decay stands for Hugging Face's Trainer"),
    Preset("mirror-bert", "Liu et al. 2021 (Mirror-BERT, EMNLP); cambridgeltl/mirror-bert "
                          "mirror_sentence_bert.sh",
           dict(stage="mirror", method="mirror", span_unit="char", span_chars=5, negatives="ntxent",
                temperature=0.04, batch_size=200, lr=2e-5, max_length=50, dropout=0.1, pooling="mean",
                max_sentences=10_000),
           epochs=1,
           differs="Mirror-BERT's 'mean' pooling averages over the padding too, ours over the real tokens; its "
                   "span replaces the first occurrence of the drawn 5 characters, ours the drawn position; its "
                   "10k sentences are a sample of STS-B train, ours the corpus's first 10k"),
    Preset("mirror-bert-lexical", "Liu et al. 2021 (Mirror-BERT, EMNLP), section 3 and its training details; "
                                  "cambridgeltl/mirror-bert mirror_word_bert.sh",
           dict(stage="mirror", method="mirror", span_cap=0, negatives="ntxent", temperature=0.2, batch_size=200,
                lr=2e-5, max_length=25, dropout=0.1, pooling="cls", corpus_words=10_000, select_on="last"),
           epochs=2,
           differs="Mirror-BERT's 10k words are its own list of the most frequent English words, ours wordfreq's "
                   "(--corpus-words 10000); its data loader drops the last partial batch, ours wraps around; the "
                   "checkpoint kept is the run's end (--select-on last), as its script saves"),
    Preset("bsl", "Zhang et al. 2021 (BSL, ACL), section 4",
           dict(stage="mirror", method="bsl", batch_size=64, lr=5e-4, momentum=0.999, predictor_k=8,
                weight_decay=0.0, pooling="mean"),
           epochs=1,
           differs="BSL's views are back-translations; ours are token-span masking with dropout (the paper's "
                   "alternatives, section 4.4)"),
    Preset("ct", "Carlsson et al. 2021 (Contrastive Tension, ICLR); sentence-transformers' CT example "
                 "(train_stsb_ct.py)",
           dict(stage="mirror", method="ct", batch_size=16, ct_negatives=7, lr=1e-5, weight_decay=0.0,
                max_length=75, pooling="mean"),
           epochs=1,
           differs="the example optimises with RMSprop, ours with AdamW; our loss is the mean over the pairs "
                   "where sentence-transformers' sums them (the lr is not rescaled)"),
    Preset("tsdae", "Wang et al. 2021 (TSDAE, Findings of EMNLP); sentence-transformers' TSDAE example "
                    "(train_stsb_tsdae.py)",
           dict(stage="mirror", method="tsdae", batch_size=8, lr=3e-5, deletion_ratio=0.6, pooling="cls",
                max_length=75, weight_decay=0.0, lr_schedule="linear"),
           epochs=1, warmup=0.1,
           differs="we delete word pieces, TSDAE words"),
)}


#: run_pretrain.py's corpus flags (dests), one of which gives the corpus: any one on the command line
#: replaces a corpus the preset sets.
CORPUS_FLAGS = ("corpus", "corpus_from_tasks", "corpus_words", "corpus_words_file")


def apply(args, given: set[str]) -> None:
    """Set ``args``'s settings from its ``args.preset`` (if any) where the command line did not give
    them (``given``: their dests); records what it set in ``args.preset_values``."""
    args.preset_values = {}
    if not args.preset:
        return
    preset = PRESETS[args.preset]
    corpus_given = bool(given & set(CORPUS_FLAGS))  # a corpus on the command line replaces the preset's
    values = {k: v for k, v in preset.values.items() if k not in given and not (corpus_given and k in CORPUS_FLAGS)}
    vars(args).update(values)
    args.preset_values = values
    args.preset_epochs = preset.epochs if "steps" not in given else None
    args.preset_warmup = preset.warmup if "warmup_steps" not in given else None
    shown = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in values.items())
    print(f"note: --preset {preset.name} ({preset.source}): {shown}", file=sys.stderr)


def set_length(args, sentences: int) -> None:
    """--steps (and --warmup-steps) of a preset measured in epochs, once the corpus is read."""
    if getattr(args, "preset_epochs", None):
        args.steps = max(1, math.ceil(args.preset_epochs * sentences / args.batch_size))
        args.preset_values["steps"] = args.steps
    if getattr(args, "preset_warmup", None):
        args.warmup_steps = max(1, round(args.preset_warmup * args.steps))
        args.preset_values["warmup_steps"] = args.warmup_steps
