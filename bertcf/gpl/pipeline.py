"""GPL, Generative Pseudo Labeling (Wang et al. 2022, "GPL: Generative Pseudo Labeling for
Unsupervised Domain Adaptation of Dense Retrieval", NAACL): a bi-encoder adapted to a domain from
its passages alone, in four steps, each one's output kept in OUT (``run``):

    OUT/gpl.json         the settings each step's output was made with
    OUT/queries/         1. queries a seq2seq generator writes for the passages (GenQ, ``data.genq``),
                            in BEIR's layout; absent when --queries gives them
    OUT/negatives-N.tsv  2. for each (query, positive) pair, negatives mined by the N-th retriever
                            (``data.negatives.mine``), as (anchor, positive, negative) rows
    OUT/margins.tsv      3. every distinct row of step 2 with the cross-encoder's margin
                            CE(q, pos) - CE(q, neg) (``CrossEncoder.margins``)
    OUT/model/           4. MarginMSE training of the encoder on them: run_pretrain.py's run directory
                            (--stage supervised --method margin-mse; ``objectives.margin_mse``)

A step whose output is there is skipped (its files are written atomically, so one that is there is
whole), and the training continues from its last checkpoint (``--resume``), so the same command
run again finishes what an interrupted one began. An output made with other settings than the
command's (gpl.json), or one whose input is missing, stops the command before anything runs.

GPL's own pipeline (``gpl.train``) differs in one respect: it draws each training tuple's negative
at random from the union of the retrievers' top 50 as it labels them, tuple by tuple, for
steps x batch tuples; here each retriever draws --num-negatives of its top --range-max (50) per
pair once (``Mining(sampling="random")``), and every distinct row is labelled once: the same
distribution of negatives, a finite file the training then samples from."""
from __future__ import annotations

import json
import sys
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from minbert import CheckpointError

from .. import runs
from ..config import pretrain as pretrain_config
from ..config.pretrain import PretrainConfig
from ..data import genq
from ..data.negatives import beir_pairs, mine_and_write, read_query_pairs, read_triplets, write_margins
from ..errors import UsageError
from ..models.cross_encoder import is_cross_encoder, load_cross_encoder
from ..models.encoder import SentenceEncoder
from ..training import pretraining
from ..utils.files import write_json_atomic
from ..utils.hub import is_local, load_failure
from ..utils.precision import resolve_device
from .config import GPLConfig

RECORD = "gpl.json"
QUERY_SETTINGS = ("corpus", "generator", "queries_per_passage", "top_p", "top_k", "query_max_length",
                  "generation_batch_size", "seed")
NEGATIVE_SETTINGS = ("queries", "corpus", "num_negatives", "range_max", "sampling", "seed")
MARGIN_SETTINGS = ("cross_encoder", "ce_max_length")
#: Step 4's run_pretrain.py settings: TRAIN_FLAGS are what OUT/model was made with (gpl.json),
#: RUN_FLAGS where and how it runs (given again when it continues).
TRAIN_FLAGS = ("steps", "batch_size", "lr", "warmup_steps", "lr_schedule", "max_length", "eval_every", "margin_score",
               "select_on", "data_dir", "seed")
RUN_FLAGS = ("progress", "device", "precision")
TRAIN_SETTINGS = ("encoder", *TRAIN_FLAGS, "train_args")


@dataclass
class Step:
    """One step: its ``name`` (the key of gpl.json), its ``output``, the ``settings`` it is made
    with, and ``make()``, which writes the output and returns what to record beside them."""

    name: str
    output: Path
    settings: dict
    make: Callable[[], dict]
    done: Callable[[], bool] | None = None

    def is_done(self) -> bool:
        return self.done() if self.done is not None else self.output.exists()


def pick(config: GPLConfig, names) -> dict:
    return {n: getattr(config, n) for n in names}


class Pipeline:
    """The steps of ``config`` in OUT (``steps``), run in order by ``run``."""

    def __init__(self, config: GPLConfig):
        self.config = config
        self.out = Path(config.out)
        self.record = read_record(self.out / RECORD)
        self.show = config.progress  # each step's progress: a bar on a terminal, plain lines in a log
        self.device = resolve_device(config.device)
        self._pairs = None

    def retrievers(self) -> list[str]:
        return list(self.config.retriever or [self.config.encoder])

    def steps(self) -> list[Step]:
        c, out = self.config, self.out
        steps = [] if c.queries else [Step("queries", out / "queries", pick(c, QUERY_SETTINGS), self.generate)]
        for i, retriever in enumerate(self.retrievers(), start=1):
            steps.append(Step(f"negatives-{i}", out / f"negatives-{i}.tsv",
                              pick(c, NEGATIVE_SETTINGS) | {"retriever": retriever},
                              lambda i=i, r=retriever: self.mine(r, out / f"negatives-{i}.tsv", i)))
        steps.append(Step("margins", out / "margins.tsv", pick(c, MARGIN_SETTINGS) | {"retrievers": self.retrievers()},
                          self.label))
        steps.append(Step("model", out / "model", pick(c, TRAIN_SETTINGS), self.train,
                          done=lambda: self.record.get("model", {}).get("done") is True and (out / "model").is_dir()))
        return steps

    def check(self, steps: list[Step]) -> None:
        """Refuse, before anything runs, an output made with other settings, and one whose input is missing."""
        for step in steps:
            made = self.record.get(step.name, {})
            changed = [k for k, v in step.settings.items() if step.output.exists() and k in made and made[k] != v]
            if changed:
                shown = ", ".join(f"{k} {made[k]!r} (now {step.settings[k]!r})" for k in changed)
                raise UsageError(f"{step.output} was made with {shown}: remove it and the outputs after it, or choose "
                                 f"another --out")
        for i, step in enumerate(steps):
            later = [s.output for s in steps[i + 1:] if s.output.exists()]
            if not step.is_done() and later:
                raise UsageError(f"{later[0]} is there but {step.output}, which it is made from, is not: remove "
                                 f"{', '.join(map(str, later))} too, or choose another --out")

    def run(self) -> dict:
        steps = self.steps()
        self.check(steps)
        if not steps[-1].is_done():  # step 4's settings and its evaluation file: checked now, not after steps 1-3
            train_config(self.config, self.out)
            pretraining.fetch_files(Path(self.config.data_dir), pretraining.dev_files(self.config.select_on))
        if not next(s for s in steps if s.name == "margins").is_done() and is_local(self.config.cross_encoder):
            check_cross_encoder(self.config.cross_encoder)  # now, not after the hours of steps 1 and 2
        results = {}
        for number, step in enumerate(steps, start=1):
            label = f"GPL step {number}/{len(steps)} ({step.name})"
            if step.is_done():
                print(f"{label}: {step.output} is there; skipped")
                continue
            result = step.make()
            results[step.name] = result
            self.record[step.name] = step.settings | result
            write_json_atomic(self.out / RECORD, self.record)
            if result.get("interrupted"):
                print(f"{label}: interrupted; run the same command again to continue", file=sys.stderr)
                return results | {"signal": result.get("signal")}
            print(f"{label}: {step.output}: {result.get('what', 'done')}")
        return results

    # ---- the steps ---------------------------------------------------------------------------------
    def generate(self) -> dict:
        """1: GenQ on --corpus into OUT/queries."""
        made = genq.generate_set(self.config.corpus, self.out / "queries", self.config.generator,
                                 self.config.generation(), self.device, self.show)
        return {"what": f"{made['queries']} queries for {made['passages']} passages",
                "queries_written": made["queries"]}

    def pairs(self) -> tuple[list[str], list[str], list[str]]:
        """(queries, positives, corpus): the generated or given queries, each with a positive, and the
        passages that the negatives are mined from (--corpus, else the queries' set's corpus)."""
        if self._pairs is None:
            c = self.config
            source = Path(c.queries) if c.queries else self.out / "queries"
            if source.is_dir():
                queries, positives, corpus = beir_pairs(source, "train")
            else:
                (queries, positives), corpus = read_query_pairs(source), []
            corpus = list(genq.read_passages(c.corpus).values()) if c.corpus else corpus
            self._pairs = queries, positives, corpus
        return self._pairs

    def mine(self, retriever: str, path: Path, number: int) -> dict:
        """2: the ``number``-th retriever's negatives for every (query, positive) pair, drawn with a
        seed of its own (GPL's retrievers draw independently)."""
        encoder = SentenceEncoder.from_pretrained(retriever).to(self.device).eval()
        mining = dataclasses.replace(self.config.mining(), seed=self.config.seed + number - 1)
        made = mine_and_write(path, encoder, *self.pairs(), mining, self.config.encode_batch_size, self.show)
        return {"what": f"{made['rows']} (query, positive, negative) rows for {made['pairs']} pairs by {retriever}",
                "rows": made["rows"]}

    def label(self) -> dict:
        """3: the cross-encoder's margin of every distinct row of step 2."""
        rows = list(dict.fromkeys(r for i in range(len(self.retrievers()))
                                  for r in read_triplets(self.out / f"negatives-{i + 1}.tsv")))
        model = load_cross_encoder(self.config.cross_encoder, "--cross-encoder", self.device,
                                   self.config.ce_max_length, self.config.precision or "fp32")
        labelled = model.margins(rows, self.config.ce_batch_size, self.show)
        write_margins(self.out / "margins.tsv", labelled)
        mean = sum(m for *_, m in labelled) / len(labelled)
        return {"what": f"{len(labelled)} rows, mean margin {mean:.4f}", "rows": len(labelled)}

    def train(self) -> dict:
        """4: MarginMSE on the margins, in OUT/model (continued from its last checkpoint when it has one)."""
        summary = pretraining.run(train_config(self.config, self.out))
        done = not summary.get("interrupted")
        what = f"step {summary['step']}; the adapted encoder: {self.out / 'model' / 'best'}"
        return {"done": done, "interrupted": not done, "signal": summary.get("signal"), "what": what}


def check_cross_encoder(name) -> None:
    """``load_cross_encoder``'s check without loading the weights: a plain BERT or sentence encoder
    (no classification head; transformers would start one at random, whose margins are noise), or a
    checkpoint that is not there, is one line. Step 3 checks a hub name when it loads it: checking it
    here would need the hub before step 1."""
    try:
        if not is_cross_encoder(name):
            raise UsageError(f"--cross-encoder {name} is not a cross-encoder (a ...ForSequenceClassification "
                             f"checkpoint, as python -m bertcf.cross train writes)")
    except CheckpointError as error:
        raise load_failure("--cross-encoder", name, error) from None


def train_config(config: GPLConfig, out: Path) -> PretrainConfig:
    """Step 4's pretraining run, its config built from GPL's settings (and the run_pretrain.py
    flags after --, parsed once by ``parse``) and resolved as run_pretrain.py resolves its own:
    continued (--resume) where OUT/model has a checkpoint to continue from."""
    model_dir, margins = out / "model", out / "margins.tsv"
    run = {name: getattr(config, name) for name in RUN_FLAGS if getattr(config, name) is not None}
    if (model_dir / "last" / runs.STATE_FILE).is_file():
        return pretrain_config.resumed(model_dir, config.command, **run)
    if (model_dir / "last").exists() or (model_dir / "metrics.jsonl").exists():
        raise UsageError(f"{model_dir} holds a run that stopped before its first checkpoint: remove it and run the "
                         f"command again")
    settings = {"stage": "supervised", "method": "margin-mse", "train_file": [str(margins)], "out_dir": str(model_dir),
                "model": config.encoder} | {name: getattr(config, name) for name in TRAIN_FLAGS
                                            if getattr(config, name) is not None} | run | config.train_settings
    return pretrain_config.resolve(PretrainConfig(**settings), set(settings), config.command)


def read_record(path: Path) -> dict:
    """gpl.json: what each step's output was made with ({} before the first step)."""
    if not path.is_file():
        return {}
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UsageError(f"{path} (the settings of the steps in it) is not a readable JSON file: restore it, or choose "
                         f"another --out") from None
    return record if isinstance(record, dict) else {}


def run(config: GPLConfig) -> dict:
    """The steps of ``config`` that OUT does not hold yet, holding OUT (one process at a time)."""
    with runs.hold(config.out):
        return Pipeline(config).run()
