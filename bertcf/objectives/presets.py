"""The pretraining methods as their authors published them: ``run_pretrain.py --preset NAME``.

BERT-CF's report changes the methods it builds on (one-sided InfoNCE with 2b - 1 candidates, token
spans, mean pooling, batch 16), and its settings stay the defaults. A preset sets instead what a
method's paper and released code use: the loss variant, pooling, augmentation, temperature,
batch, learning rate, length, and the length of the run (one epoch of the corpus becomes
``--steps``). A flag given on the command line wins over the preset (``bertcf.config.pretrain``
applies it). ``config.json`` records the preset (``preset``) and every value it set
(``preset_values``); ``--resume`` continues with them.
"""
from __future__ import annotations

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
    # The supervised methods (--stage supervised): give the data with --train-file.
    Preset("sbert-nli", "Reimers & Gurevych 2019 (Sentence-BERT, EMNLP), section 4; sentence-transformers' "
                        "training_nli.py",
           dict(stage="supervised", method="sbert-softmax", pooling="mean", batch_size=16, lr=2e-5, max_length=128,
                dropout=0.1, weight_decay=0.01, lr_schedule="linear"),
           epochs=1, warmup=0.1,
           differs="SBERT trains on SNLI + MultiNLI train (942k pairs) and keeps the checkpoint best on STS-B dev "
                   "(--select-on stsb-dev); the data is the user's --train-file"),
    Preset("sbert-sts", "Reimers & Gurevych 2019 (Sentence-BERT, EMNLP), section 4.2; sentence-transformers' "
                        "training_stsbenchmark.py",
           dict(stage="supervised", method="sbert-cosine", pooling="mean", batch_size=16, lr=2e-5, max_length=128,
                dropout=0.1, weight_decay=0.01, lr_schedule="linear"),
           epochs=4, warmup=0.1,
           differs="SBERT regresses on STS-B train (5,749 pairs); the default --train-file is CS224N's STS train "
                   "split, which holds STS-B test pairs, so STS-B test is no held-out set after it"),
    Preset("simcse-sup", "Gao et al. 2021 (SimCSE, EMNLP), supervised; princeton-nlp/SimCSE run_sup_example.sh",
           dict(stage="supervised", method="simcse-sup", negatives="simcse", pooling="cls-mlp", temperature=0.05,
                batch_size=512, lr=5e-5, max_length=32, dropout=0.1, weight_decay=0.0, lr_schedule="linear",
                eval_every=125),
           epochs=3,
           differs="SimCSE keeps its MLP over [CLS] at test time (its supervised checkpoints carry it as BERT's "
                   "pooler), ours drops it as for unsupervised SimCSE; SimCSE trains on 275,601 SNLI + MultiNLI "
                   "triples and keeps the checkpoint best on STS-B dev (--select-on stsb-dev); batch 512 in one "
                   "process is SimCSE's 4 GPUs x 128 with the candidates gathered (the same loss), and needs the "
                   "memory of 1,536 sentences a step"),
)}
