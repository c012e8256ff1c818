"""One task fine-tuned by an independent implementation, written as a stage-3 run directory so that
``python -m bertcf.multitask.compare`` reads it beside ours (docs/RESULTS.md, "Stage 3 at
convergence").

- ``--task sst`` / ``--task qqp``: transformers' ``BertForSequenceClassification`` (the pooled
  [CLS], dropout, a linear layer; QQP's two questions read together) trained with transformers'
  own ``Trainer``: the way a user fine-tunes one task with the ecosystem.
- ``--task sts``: sentence-transformers' ``CosineSimilarityLoss`` (the cosine of the two mean-pooled
  vectors regressed on the score / 5) trained with its ``SentenceTransformerTrainer``, as its STS
  training example does.

The settings are stage 3's where both have them: AdamW, a constant learning rate without warm-up,
weight decay 0.01, no gradient clipping, the batch size, the steps, the max length (a pair: both
sentences within it, longest first, as ``--pair-encoding cross``), an evaluation every
``--eval-every`` steps on the same ``--max-eval-examples`` dev rows stage 3 draws
(``bertcf.multitask.data.eval_sample``), the best of those kept, then every dev row predicted.

Writes OUT/config.json (the task's declaration, as stage 3 records it), OUT/metrics.jsonl (the
evaluations), OUT/predictions/ (stage 3's file format) and, last, OUT/metrics.json.
Needs accelerate (``pip install -e ".[references]"``).
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset

from bertcf.data.tasks import READERS
from bertcf.multitask.data import eval_sample
from bertcf.multitask.evaluation import PREDICTION_HEADERS, format_prediction, prediction_file, task_metric
from bertcf.multitask.tasks import builtin_tasks
from bertcf.utils.files import write_json_atomic, write_text_atomic


def rows(task, split):
    return [r for r in READERS[task.reader](task.file(split), labeled=True) if r.label is not None]


def hf_classifier(task, options, train, dev, dev_all):
    from transformers import (AutoTokenizer, BertForSequenceClassification, DataCollatorWithPadding, Trainer,
                              TrainingArguments)
    tokenizer = AutoTokenizer.from_pretrained(options.model)

    def dataset(examples):
        if task.pair:
            texts = {"text": [r.sentence1 for r in examples], "text_pair": [r.sentence2 for r in examples]}
        else:
            texts = {"text": [r.sentence for r in examples]}
        encoded = tokenizer(**texts, truncation="longest_first", max_length=options.max_length)
        return Dataset.from_dict({**encoded, "labels": [int(r.label) for r in examples]})

    model = BertForSequenceClassification.from_pretrained(options.model, num_labels=task.num_classes)
    args = TrainingArguments(**common_arguments(options), metric_for_best_model="accuracy")
    trainer = Trainer(model=model, args=args, train_dataset=dataset(train), eval_dataset=dataset(dev),
                      data_collator=DataCollatorWithPadding(tokenizer), processing_class=tokenizer,
                      compute_metrics=lambda p: {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())})
    trainer.train()
    curve = [(e["step"], e["eval_accuracy"]) for e in trainer.state.log_history if "eval_accuracy" in e]
    predicted = trainer.predict(dataset(dev_all)).predictions.argmax(-1)
    return curve, predicted.tolist(), trainer.state.best_global_step


def st_cosine(task, options, train, dev, dev_all):
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments, losses)
    from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator, SimilarityFunction
    model = SentenceTransformer(options.model, device="cpu")
    model.max_seq_length = options.max_length
    scale = task.label_range[1]
    train_set = Dataset.from_dict({"sentence1": [r.sentence1 for r in train], "sentence2": [r.sentence2 for r in train],
                                   "score": [r.label / scale for r in train]})
    evaluator = EmbeddingSimilarityEvaluator([r.sentence1 for r in dev], [r.sentence2 for r in dev],
                                             [r.label / scale for r in dev], main_similarity=SimilarityFunction.COSINE,
                                             name="dev")
    args = SentenceTransformerTrainingArguments(**common_arguments(options), metric_for_best_model="eval_dev_pearson_cosine")
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train_set,
                                         loss=losses.CosineSimilarityLoss(model), evaluator=evaluator)
    trainer.train()
    curve = [(e["step"], e["eval_dev_pearson_cosine"]) for e in trainer.state.log_history
             if "eval_dev_pearson_cosine" in e]
    u, v = (model.encode([getattr(r, s) for r in dev_all], batch_size=128, convert_to_tensor=True, normalize_embeddings=True)
            for s in ("sentence1", "sentence2"))
    return curve, ((u * v).sum(-1) * scale).tolist(), trainer.state.best_global_step


def common_arguments(options) -> dict:
    return dict(output_dir=str(Path(options.out) / "trainer"), max_steps=options.steps,
                per_device_train_batch_size=options.batch_size, per_device_eval_batch_size=128,
                learning_rate=options.lr, weight_decay=options.weight_decay, lr_scheduler_type="constant",
                warmup_steps=0, max_grad_norm=0.0, seed=options.seed, data_seed=options.seed, eval_strategy="steps",
                eval_steps=options.eval_every, eval_on_start=True, save_strategy="steps", save_steps=options.eval_every,
                save_total_limit=1, save_only_model=True, load_best_model_at_end=True, greater_is_better=True,
                logging_steps=options.eval_every, report_to="none", use_cpu=True, dataloader_num_workers=0,
                disable_tqdm=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=("sst", "qqp", "sts"), required=True)
    parser.add_argument("--model", required=True, help="a Hugging Face BERT directory (with sentence-transformers' files for sts)")
    parser.add_argument("--data-dir", required=True, help="the CS224N files")
    parser.add_argument("--out", required=True, help="the run directory to write")
    parser.add_argument("--seed", type=int, default=11711)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--eval-every", type=int, required=True)
    parser.add_argument("--max-eval-examples", type=int, default=None)
    options = parser.parse_args()
    out = Path(options.out)
    if (out / "metrics.json").exists():
        raise SystemExit(f"{out} is finished already (metrics.json)")
    out.mkdir(parents=True, exist_ok=True)
    task = builtin_tasks(options.data_dir)[options.task]
    train, dev_all = rows(task, "train"), rows(task, "dev")
    dev = [dev_all[i] for i in eval_sample(len(dev_all), options.max_eval_examples)]
    write_json_atomic(out / "config.json", {"declared_tasks": [task.to_dict()], "reference": vars(options)})
    started = time.time()
    fit = st_cosine if task.regression else hf_classifier
    curve, predicted, best_step = fit(task, options, train, dev, dev_all)
    write_text_atomic(out / "metrics.jsonl", "".join(json.dumps({"step": s, task.metric_key: v}) + "\n" for s, v in curve))
    from torch.utils.tensorboard import SummaryWriter
    with SummaryWriter(str(out / "tb")) as writer:  # beside stage 3's own eval/ curves in one TensorBoard
        for step, value in curve:
            writer.add_scalar(f"eval/{task.metric_key}", value, step)
    lines = [f"id \t {PREDICTION_HEADERS[task.name]} \n"] + [f"{r.id} , {format_prediction(task, v)} \n" for r, v in zip(dev_all, predicted)]
    write_text_atomic(out / "predictions" / prediction_file(task.name, "dev"), "".join(lines))
    shutil.rmtree(out / "trainer", ignore_errors=True)  # the Trainer's checkpoints: the predictions are what is kept
    value = task_metric(task, np.asarray(predicted), [r.label for r in dev_all])
    write_json_atomic(out / "metrics.json", {task.metric_key: value, "step": best_step,
                                             "train_seconds": round(time.time() - started, 1)})
    print(f"{out}: {task.metric_key} {value:.4f} (best step {best_step})")


if __name__ == "__main__":
    main()
