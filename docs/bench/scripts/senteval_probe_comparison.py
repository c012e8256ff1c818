"""Our SentEval probe (``--probe senteval``) against SentEval itself, on the same cached vectors.

SentEval is not part of this project: get its code and give its path. At commit 5d6dc11 it needs a
GPU; three one-line edits run it on the CPU (nothing else changes):

    mkdir /tmp/senteval-5d6dc11 && cd /tmp/senteval-5d6dc11
    git clone https://github.com/facebookresearch/SentEval && cd SentEval && git checkout 5d6dc11
    sed -i -e 's/\\.cuda()/.cpu()/g' -e "s/torch.device('cuda')/torch.device('cpu')/" senteval/tools/classifier.py
    sed -i 's/getargspec/getfullargspec/' senteval/utils.py      # inspect.getargspec is gone since Python 3.11

Then (``--vectors``: where the encoder's vectors of every sentence of the tasks are cached, as
vectors.npy and sentences.json; encoded once, read again on later runs):

    PYTHONPATH=. python docs/bench/scripts/senteval_probe_comparison.py --senteval-src /tmp/senteval-5d6dc11/SentEval \\
        --encoder /work/minilm --senteval-dir ../shared/data/senteval --vectors /tmp/minilm-vectors \\
        --tasks TREC,MRPC,CR,MPQA,SST2 --modes fasttest,test --json comparison.json

For each mode and task it runs SentEval's own task code (its readers, its sort, its classifier)
with a batcher that looks the vectors up, then our evaluator on the same vectors, and prints every
figure (acc, devacc, MRPC's F1) side by side with the difference and both wall times. The exit
status is 1 when a figure differs by more than --tolerance points (default 0.3).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bertcf.evaluation.senteval import build_evaluator

#: SentEval's README: the prototyping ("fasttest") and the default config.
PARAMS = {
    "fasttest": {"usepytorch": True, "kfold": 5,
                 "classifier": {"nhid": 0, "optim": "rmsprop", "batch_size": 128, "tenacity": 3, "epoch_size": 2}},
    "test": {"usepytorch": True, "kfold": 10,
             "classifier": {"nhid": 0, "optim": "adam", "batch_size": 64, "tenacity": 5, "epoch_size": 4}},
}


def cached_vectors(args, tasks) -> tuple[np.ndarray, dict[str, int]]:
    """The encoder's vectors of every sentence of ``tasks`` (float32), encoded as bertcf.evaluate
    encodes them (whole sentences), cached in --vectors."""
    sentences = list(dict.fromkeys(s for t in tasks for s in build_evaluator(args.senteval_dir, t).sentences()))
    folder = Path(args.vectors)
    if (folder / "sentences.json").is_file() and json.loads((folder / "sentences.json").read_text()) == sentences:
        vectors = np.load(folder / "vectors.npy")
    else:
        from bertcf.models.encoder import SentenceEncoder
        encoder = SentenceEncoder.from_pretrained(args.encoder)
        started = time.perf_counter()
        vectors = encoder.encode(sentences, batch_size=64, max_length=encoder.bert.config.max_position_embeddings,
                                 show_progress_bar=sys.stderr.isatty()).numpy()
        print(f"encoded {len(sentences)} sentences in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "vectors.npy", vectors)
        (folder / "sentences.json").write_text(json.dumps(sentences))
    return vectors, {s: i for i, s in enumerate(sentences)}


def run_senteval(args, task: str, mode: str, vectors, row) -> tuple[dict, float]:
    """SentEval's own evaluation of ``task``, its batcher looking our vectors up."""
    sys.path.insert(0, str(Path(args.senteval_src).resolve()))
    import senteval

    def batcher(params, batch):
        return np.stack([vectors[row[" ".join(words)]] for words in batch])

    with tempfile.TemporaryDirectory() as root:  # SentEval reads TASK_PATH/downstream/<task>
        (Path(root) / "downstream").symlink_to(Path(args.senteval_dir).resolve())
        params = {"task_path": root, "seed": 1111, **PARAMS[mode]}
        started = time.perf_counter()
        result = senteval.engine.SE(params, batcher).eval([task])[task]
        return result, time.perf_counter() - started


def run_ours(args, task: str, mode: str, vectors, row) -> tuple[dict, float]:
    evaluator = build_evaluator(args.senteval_dir, task, mode, probe="senteval")
    table = torch.from_numpy(vectors)
    started = time.perf_counter()
    result = evaluator(lambda batch: table[[row[s] for s in batch]])
    return result, time.perf_counter() - started


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--senteval-src", required=True, help="SentEval's repository (the folder holding senteval/)")
    p.add_argument("--encoder", default="/work/minilm")
    p.add_argument("--senteval-dir", default="../shared/data/senteval", help="SentEval's data/downstream/ layout")
    p.add_argument("--vectors", required=True, help="folder of the cached vectors (written on the first run)")
    p.add_argument("--tasks", default="TREC,MRPC,CR,MPQA,SST2")
    p.add_argument("--modes", default="fasttest,test")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--tolerance", type=float, default=0.3, help="largest difference allowed, in points")
    p.add_argument("--json", default=None, help="write every figure to this file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    vectors, row = cached_vectors(args, tasks)
    rows, worst = [], 0.0
    print(f"{'mode':9} {'task':5} {'figure':7} {'SentEval':>9} {'ours':>9} {'diff':>6}   seconds (SentEval, ours)")
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        for task in tasks:
            theirs, their_time = run_senteval(args, task, mode, vectors, row)
            ours, our_time = run_ours(args, task, mode, vectors, row)
            for figure, key in (("acc", "accuracy"), ("devacc", "devacc"), ("f1", "f1")):
                if figure not in theirs:
                    continue
                a, b = float(theirs[figure]), float(ours[key])
                worst = max(worst, abs(a - b))
                rows.append({"mode": mode, "task": task, "figure": figure, "senteval": a, "ours": b,
                             "senteval_seconds": their_time, "ours_seconds": our_time})
                print(f"{mode:9} {task:5} {figure:7} {a:9.2f} {b:9.2f} {b - a:+6.2f}   {their_time:.1f}, {our_time:.1f}",
                      flush=True)
    print(f"largest difference: {worst:.2f} points (tolerance {args.tolerance})")
    if args.json:
        Path(args.json).write_text(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                                               "rows": rows}, indent=2) + "\n")
    return 1 if worst > args.tolerance else 0


if __name__ == "__main__":
    sys.exit(main())
