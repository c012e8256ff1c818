"""The evaluation command: SentEval's STS and transfer tasks on a sentence encoder, and word
similarity (``--tasks lexical``), a table on stdout and the scores as JSON (the tasks and how they
are scored: ``bertcf.evaluation.senteval`` and ``bertcf.evaluation.lexical``).

    python -m bertcf.evaluate --encoder runs/<run> --senteval-dir data/SentEval [--tasks sts,transfer,lexical]
                              [--mode test|dev|fasttest] [--lexical-dir DIR] [--json FILE]
"""
from __future__ import annotations

import sys

from .cli import AT_LEAST_1, ArgumentParser, run_main
from .evaluation.evaluators import PAIR_FEATURES
from .evaluation.lexical import POOLINGS as LEXICAL_POOLINGS
from .evaluation.lexical import word_similarity_evaluators
from .evaluation.senteval import (
    MODES,
    evaluate,
    format_table,
    parse_tasks,
    split_lexical,
)
from .models.encoder import POOLINGS
from .utils import environment, progress
from .utils.files import write_json_atomic
from .utils.precision import resolve_device, resolve_precision


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m bertcf.evaluate",
                                description="SentEval's STS and transfer tasks, and word similarity, on a "
                                            "sentence encoder.")
    p.add_argument("--encoder", required=True, help="checkpoint, run directory or Hugging Face BERT name/directory")
    p.add_argument("--vocab", default=None, help="vocab.txt for a checkpoint directory without tokenizer files")
    p.add_argument("--pooling", choices=POOLINGS, default=None,
                   help="the sentence vector (default: the checkpoint's, mean for a plain BERT): mean, cls, or "
                        "first-last-avg, the average of the first and the last layer's token means (BERT-flow's, "
                        "BERT-whitening's)")
    p.add_argument("--senteval-dir", default="data/SentEval",
                   help="SentEval's data/downstream/ layout (see data/README.md)")
    p.add_argument("--tasks", default="sts",
                   help="comma-separated: sts, transfer, lexical (word similarity, --lexical-dir), or task names")
    p.add_argument("--lexical-dir", default="data/lexical",
                   help="--tasks lexical: every .txt/.tsv file here is a word-similarity task (SimLex-999's layout, "
                        "or word1<TAB>word2<TAB>score)")
    p.add_argument("--lexical-pooling", choices=LEXICAL_POOLINGS, default=None,
                   help="--tasks lexical: the word vector, [CLS] or the mean of the word's tokens (default: the "
                        "encoder's pooling)")
    p.add_argument("--mode", choices=MODES, default="test",
                   help="test; dev (STS-B dev + SICK-R trial); fasttest (5 folds, fixed probe strength)")
    p.add_argument("--mrpc-features", choices=PAIR_FEATURES, default="senteval",
                   help="the MRPC probe's features of a pair (u, v): senteval = [|u-v|, u*v], as SentEval "
                        "and the published tables; full = [u, v, |u-v|, u*v]")
    p.add_argument("--batch-size", type=AT_LEAST_1, default=64, help="sentences encoded at once")
    p.add_argument("--max-length", type=AT_LEAST_1, default=None,
                   help="tokens per sentence (default: whole sentences, up to the model's maximum)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    p.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default=None,
                   help="autocast precision (default: bf16 on a GPU that supports it, else fp32)")
    p.add_argument("--json", default=None,
                   help="write the results to this JSON file (with \"environment\": versions, device, CPU, command)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars (there are none either when stderr is not a terminal)")
    return p


def main(argv=None) -> dict:
    from .models.encoder import SentenceEncoder

    args = build_parser().parse_args(argv)
    senteval_tasks, lexical = split_lexical(args.tasks)  # bad flags and data before the model loads
    if senteval_tasks or not lexical:
        parse_tasks(senteval_tasks)
    if lexical:
        word_similarity_evaluators(args.lexical_dir)
    device = resolve_device(args.device)
    encoder = SentenceEncoder.from_pretrained(args.encoder, pooling=args.pooling, vocab=args.vocab).to(device)
    encoder.precision = resolve_precision(args.precision, device)
    result = evaluate(encoder, args.senteval_dir, args.tasks, args.mode, args.batch_size, args.max_length,
                      show_progress_bar=not args.no_progress and progress.resolve("auto") == "bar",
                      mrpc_features=args.mrpc_features, lexical_dir=args.lexical_dir,
                      lexical_pooling=args.lexical_pooling)
    result["encoder"] = str(args.encoder)
    result["environment"] = environment.collect(device, encoder.precision)  # what the scores were computed with
    print(format_table(result))
    if args.json:
        write_json_atomic(args.json, result)
    return result


def cli(argv=None) -> int:
    return run_main(main, argv)


if __name__ == "__main__":
    sys.exit(cli())
