"""The evaluation command: SentEval's STS and transfer tasks, word similarity (``--tasks
lexical``) and retrieval on a BEIR-layout set, on a sentence encoder; a table on stdout and the
scores as JSON (the tasks and how they are scored: ``bertcf.evaluation.senteval``,
``bertcf.evaluation.lexical`` and ``bertcf.evaluation.retrieval``).

    python -m bertcf.evaluate --encoder runs/<run> [--pooling P] --senteval-dir data/SentEval [--tasks sts,transfer,lexical]
                              [--mode test|dev|fasttest] [--probe senteval|sklearn] [--threads N] [--lexical-dir DIR]
                              [--lexical-pooling cls|mean] [--json FILE]
    python -m bertcf.evaluate --encoder runs/<run> --tasks retrieval --retrieval-dir DIR [--retrieval-score cos|dot]
"""
from __future__ import annotations

import sys

from .cli import AT_LEAST_1, ArgumentParser, run_main
from .data import beir
from .errors import UsageError
from .evaluation.evaluators import PAIR_FEATURES
from .evaluation.lexical import POOLINGS as LEXICAL_POOLINGS
from .evaluation.lexical import word_similarity_evaluators
from .evaluation.probe import usable_cores
from .evaluation.retrieval import SCORES, evaluate_retrieval, format_retrieval, model_score
from .evaluation.senteval import MODES, PROBES, evaluate, format_table, parse_tasks, split_keyword, split_lexical
from .models.encoder import POOLINGS
from .utils import environment, progress
from .utils.files import write_json_atomic
from .utils.precision import resolve_device, resolve_precision


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m bertcf.evaluate",
                       description="SentEval's STS and transfer tasks, word similarity, and retrieval on a set in "
                                   "BEIR's layout, on a sentence encoder.")
    p.add_argument("--encoder", required=True, help="checkpoint, run directory or Hugging Face BERT name/directory")
    p.add_argument("--vocab", default=None, help="vocab.txt for a checkpoint directory without tokenizer files")
    p.add_argument("--pooling", choices=POOLINGS, default=None,
                   help="the sentence vector (default: the checkpoint's, mean for a plain BERT): mean, cls, or "
                        "first-last-avg, the average of the first and the last layer's token means (BERT-flow's, "
                        "BERT-whitening's)")
    p.add_argument("--senteval-dir", default="data/SentEval",
                   help="SentEval's data/downstream/ layout (see data/README.md)")
    p.add_argument("--tasks", default="sts",
                   help="comma-separated: sts, transfer, SentEval task names, lexical (word similarity, needs "
                        "--lexical-dir), retrieval (needs --retrieval-dir)")
    p.add_argument("--lexical-dir", default="data/lexical",
                   help="--tasks lexical: every .txt/.tsv file here is a word-similarity task (SimLex-999's layout, "
                        "or word1<TAB>word2<TAB>score)")
    p.add_argument("--lexical-pooling", choices=LEXICAL_POOLINGS, default=None,
                   help="--tasks lexical: the word vector, [CLS] or the mean of the word's tokens (default: the "
                        "encoder's pooling)")
    p.add_argument("--mode", choices=MODES, default="test",
                   help="test; dev (STS-B dev + SICK-R trial); fasttest (SentEval's prototyping settings: 5 folds; "
                        "with --probe sklearn a fixed C)")
    p.add_argument("--probe", choices=PROBES, default="senteval",
                   help="the transfer tasks' classifier: senteval = SentEval's PyTorch probe (usepytorch=True, as the "
                        "published tables); sklearn = scikit-learn's logistic regression (usepytorch=False)")
    p.add_argument("--threads", type=AT_LEAST_1, default=None,
                   help="torch threads (set explicitly) and the processes that train the transfer tasks' probes "
                        "(default: the cores this process may use)")
    p.add_argument("--mrpc-features", choices=PAIR_FEATURES, default="senteval",
                   help="the MRPC probe's features of a pair (u, v): senteval = [|u-v|, u*v], as SentEval "
                        "and the published tables; full = [u, v, |u-v|, u*v]")
    p.add_argument("--retrieval-dir", default=None,
                   help="a set in BEIR's layout (corpus.jsonl, queries.jsonl, qrels/test.tsv) for --tasks retrieval")
    p.add_argument("--retrieval-score", choices=SCORES, default=None,
                   help="retrieval's score: cos or dot (default: the model's sentence-transformers "
                        "similarity_fn_name, else cos; the same for an encoder that normalises its vectors)")
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
    import torch

    from .models.encoder import SentenceEncoder

    args = build_parser().parse_args(argv)
    tasks, retrieval = split_keyword(args.tasks, "retrieval")  # bad flags and data before the model loads
    rest, lexical = split_lexical(tasks)
    if rest or not (lexical or retrieval):
        parse_tasks(rest)
    if lexical:
        word_similarity_evaluators(args.lexical_dir)
    if retrieval and not args.retrieval_dir:
        raise UsageError("--tasks retrieval needs --retrieval-dir DIR (a set in BEIR's layout)")
    retrieval_set = beir.load(args.retrieval_dir) if retrieval else None
    if lexical and args.mode == "dev":
        raise UsageError("--mode dev: the word-similarity sets have no dev split; score lexical in --mode test")
    args.threads = args.threads or usable_cores()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    encoder = SentenceEncoder.from_pretrained(args.encoder, pooling=args.pooling, vocab=args.vocab).to(device)
    encoder.precision = resolve_precision(args.precision, device)
    show = not args.no_progress and progress.resolve("auto") == "bar"
    result = evaluate(encoder, args.senteval_dir, tasks, args.mode, args.batch_size, args.max_length,
                      show_progress_bar=show, mrpc_features=args.mrpc_features, probe=args.probe,
                      threads=args.threads, lexical_dir=args.lexical_dir,
                      lexical_pooling=args.lexical_pooling) if tasks else {}
    if retrieval:
        result["retrieval"] = evaluate_retrieval(encoder, retrieval_set, str(args.retrieval_dir),
                                                 args.retrieval_score or model_score(args.encoder), args.batch_size,
                                                 show_progress_bar=show)
    result["encoder"] = str(args.encoder)
    result["environment"] = environment.collect(device, encoder.precision)  # what the scores were computed with
    print("\n".join(([format_table(result)] if tasks else []) + ([format_retrieval(result["retrieval"])]
                                                                  if retrieval else [])))
    if args.json:
        write_json_atomic(args.json, result)
    return result


def cli(argv=None) -> int:
    return run_main(main, argv)


if __name__ == "__main__":
    sys.exit(cli())
