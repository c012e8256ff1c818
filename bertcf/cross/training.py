"""Training a cross-encoder (``python -m bertcf.cross train``) from a resolved ``CrossConfig``.

The pairs of ``--train-file`` (CS224N STS or QQP files, or NLI: ``data.pairs``) are tokenised once,
jointly (``[CLS] a [SEP] b [SEP]`` with token types); each step draws ``--batch-size`` of them
(a seeded order, every epoch reshuffled) and minimises, as sentence-transformers' CrossEncoder
trains them:

- ``--head regression`` (one logit z): binary cross-entropy with logits against the label scaled
  to [0, 1] (STS score / 5; QQP duplicate 1, not 0): -(y log s(z) + (1 - y) log(1 - s(z)));
- ``--head classification`` (a logit per class): cross-entropy against the class.

Every --eval-every steps the selection set is scored (CS224N STS dev Spearman or QQP dev accuracy,
``cross.evaluation``) and the best checkpoint kept as ``best/``, a Hugging Face
BertForSequenceClassification directory; at the end best/ is scored on the pair sets of ``--sets``
(default every one whose file is there), into ``metrics.json``, each with its progress and the time
left (``--progress``). The loop, ``last/`` and --resume are ``TrainingLoop``'s.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import runs
from ..data.pairs import CLASSES, SCALE, read_pairs
from ..data.tasks import task_file
from ..errors import UsageError
from ..models.cross_encoder import CrossEncoder, pad_pairs
from ..models.model_card import write_cross_encoder_card
from ..training.loop import TrainingLoop, closing_line, set_seed
from ..training.sampler import EpochSampler
from ..utils.distributed import dist_info, local_rows, run_distributed, wrap_ddp
from ..utils.files import write_json_atomic
from .evaluation import PairSetEvaluator, evaluate_pair_sets, format_pair_table, pair_set_paths, read_pair_set

EVAL_BATCH = 128  # pairs scored at once in evaluation, at least (no gradients: larger than a training batch)


def run(config) -> dict:
    """The run of ``config`` in its directory (held: one run per directory)."""
    with runs.hold(config.out_dir):
        return run_distributed(train, config)


def training_pairs(config):
    """(the pairs, their targets [n]: float in [0, 1] for regression, long classes for
    classification, the number of labels); a file kind the head cannot learn is a UsageError."""
    files = config.train_file or [str(task_file(config.data_dir, "sts", "train"))]
    pairs = read_pairs(files)
    n = min(len(pairs), config.max_train_examples or len(pairs))
    labels = pairs.labels[:n]
    if config.head == "regression":
        if pairs.kind not in SCALE:
            raise UsageError(f"{', '.join(pairs.sources)}: NLI labels are classes; train on them with --head "
                             f"classification")
        return pairs, torch.tensor(labels, dtype=torch.float32) / SCALE[pairs.kind], 1
    if not CLASSES[pairs.kind]:
        raise UsageError(f"{', '.join(pairs.sources)}: STS scores are graded, not classes; train on them with --head "
                         f"regression")
    return pairs, torch.tensor(labels, dtype=torch.long), len(CLASSES[pairs.kind])


def selection(config, kind: str, num_labels: int):
    """(the resolved --select-on, its evaluator or None for last): the selection set is read now,
    so a missing file stops the run before the model loads."""
    select_on = config.select_on or {"qqp": "qqp-dev", "nli": "last"}.get(kind, "sts-dev")
    if select_on == "last":
        return select_on, None
    if num_labels > 2:  # refused here, before the model loads
        raise UsageError(f"--select-on {select_on} scores a pair's similarity, which a classifier of {num_labels} "
                         f"classes does not give: use --select-on last")
    path = pair_set_paths(config.data_dir, config.sts_dev, config.qqp_dev, config.senteval_dir)[select_on]
    pairs = read_pair_set(select_on, path)[:config.max_eval_examples]
    return select_on, PairSetEvaluator(select_on, pairs, max(config.batch_size, EVAL_BATCH), config.progress)


def final_sets(config) -> dict:
    """{name: file} of the pair sets best/ is scored on at the end: those of --sets, whose files must be
    there (checked before training, so a wrong one does not wait for the run's end), else every one
    whose file is there."""
    paths = pair_set_paths(config.data_dir, config.sts_dev, config.qqp_dev, config.senteval_dir)
    names = config.set_names(none_allowed=True)
    if names is None:
        return {name: path for name, path in paths.items() if path.is_file()}
    missing = [f"{name} ({paths[name]})" for name in names if not paths[name].is_file()]
    if missing:
        raise UsageError(f"--sets: no file for {', '.join(missing)}: set --data-dir, --sts-dev, --qqp-dev or "
                         f"--senteval-dir, or leave the set out")
    return {name: paths[name] for name in names}


def load_model(config, num_labels: int) -> CrossEncoder:
    """The cross-encoder to train, its fresh classifier drawn from the seeded generator."""
    model = CrossEncoder.from_pretrained(config.model, num_labels=num_labels, max_length=config.max_length,
                                         vocab=config.vocab, hidden_dropout_prob=config.dropout,
                                         attention_probs_dropout_prob=config.dropout)
    model.precision = config.precision
    return model


def train(config, device) -> dict:
    pairs, targets, num_labels = training_pairs(config)
    select_on, evaluator = selection(config, pairs.kind, num_labels)
    final_sets(config)  # a --sets without its file stops the run now
    config = config.replace(select_on=select_on, train_file=pairs.sources)  # what config.json records
    set_seed(config.seed)
    model = load_model(config, num_labels).to(device)
    if config.compile:
        model.bert.compile_layers()
    ids, types = model.tokenize(list(zip(pairs.sentence1, pairs.sentence2))[:len(targets)])
    sampler = EpochSampler(len(ids), seed=config.seed)
    rank, world = dist_info()
    step_model = wrap_ddp(model, device)
    rows_here = local_rows(config.batch_size, rank, world)

    def step_fn(step):
        rows = sampler.next(config.batch_size)[rows_here]
        input_ids, token_types, mask = pad_pairs([ids[i] for i in rows], [types[i] for i in rows],
                                                 model.tokenizer.pad_token_id)
        logits = step_model(input_ids.to(device, non_blocking=True), mask.to(device, non_blocking=True),
                            token_types.to(device, non_blocking=True), num_tokens=int(mask.sum()))
        y = targets[rows].to(device, non_blocking=True)
        loss = (F.binary_cross_entropy_with_logits(logits[:, 0], y) if num_labels == 1
                else F.cross_entropy(logits, y))
        return loss, {}

    def evaluate(step):
        return evaluator(model) if evaluator is not None else {"last_step": step}

    run = runs.Run(config.out_dir, config.to_dict(), resume=config.resume)
    loop = TrainingLoop(config, run, {"model": model}, model.parameters(), {"pairs": sampler},
                        metric=evaluator.main_metric if evaluator else "last_step", save_model=model.save_pretrained,
                        evaluate=evaluate, items_per_step=config.batch_size, card=write_cross_encoder_card)
    if config.resume:
        loop.resume()
    return loop.fit(step_fn, finish=lambda summary: finish(config, summary, run.dir, device))


def finish(config, summary: dict, run_dir: Path, device) -> dict:
    """After training: best/ scored on the pair sets of --sets (default every one whose file is
    there), into metrics.json (the loop calls it only after a run that was not stopped)."""
    best = CrossEncoder.from_pretrained(run_dir / "best", vocab=config.vocab).to(device)
    best.precision = config.precision
    sets = {name: read_pair_set(name, path) for name, path in final_sets(config).items()}
    if best.num_labels > 2:
        print(f"note: a {best.num_labels}-class cross-encoder gives no similarity score: no pair sets scored",
              file=sys.stderr)
        sets = {}
    metrics = evaluate_pair_sets(best, sets, max(config.batch_size, EVAL_BATCH), config.progress) | {
        "checkpoint": str(run_dir / "best"), "step": summary["best_step"]}
    write_json_atomic(run_dir / "metrics.json", metrics)
    summary["metrics"] = metrics
    print(closing_line(summary, f"{config.select_on} (during training)", run_dir, device))
    print(format_pair_table(metrics) or "no pair set found to score")
    print(f"metrics in {run_dir / 'metrics.json'}")
    return summary
