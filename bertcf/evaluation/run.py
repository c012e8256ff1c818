"""One evaluation of an encoder, as ``python -m bertcf.evaluate`` runs it (``run``): SentEval's STS
and transfer tasks, word similarity and retrieval, from an ``EvaluateConfig``; a table on stdout
and the scores as JSON."""
from __future__ import annotations

import torch

from ..data import beir
from ..errors import UsageError
from ..models.cross_encoder import CrossEncoder
from ..models.encoder import SentenceEncoder
from ..utils import environment, progress
from ..utils.files import write_json_atomic
from ..utils.precision import resolve_device, resolve_precision
from .lexical import word_similarity_evaluators
from .retrieval import evaluate_retrieval, format_retrieval, model_score
from .senteval import evaluate, format_table, parse_tasks, split_keyword, split_lexical


def run(config) -> dict:
    """The tasks of ``config`` on its encoder: the results (with the environment they were computed
    in), printed as a table and written to ``config.json`` when given. Bad tasks and data are found
    before the model loads."""
    tasks, retrieval = split_keyword(config.tasks, "retrieval")
    rest, lexical = split_lexical(tasks)
    if rest or not (lexical or retrieval):
        parse_tasks(rest)
    if lexical:
        word_similarity_evaluators(config.lexical_dir)
    if retrieval and not config.retrieval_dir:
        raise UsageError("--tasks retrieval needs --retrieval-dir DIR (a set in BEIR's layout)")
    retrieval_set = beir.load(config.retrieval_dir) if retrieval else None
    if config.rerank and not retrieval:
        raise UsageError("--rerank reranks retrieval's lists: add retrieval to --tasks")
    if lexical and config.mode == "dev":
        raise UsageError("--mode dev: the word-similarity sets have no dev split; score lexical in --mode test")
    torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    encoder = SentenceEncoder.from_pretrained(config.encoder, pooling=config.pooling, vocab=config.vocab).to(device)
    encoder.precision = resolve_precision(config.precision, device)
    if config.truncate_dim and config.truncate_dim > encoder.output_dim:
        raise UsageError(f"--truncate-dim {config.truncate_dim}: the encoder's vectors have {encoder.output_dim} "
                         f"dimensions")
    encoder.truncate_dim = config.truncate_dim  # every task encodes through encode(): scored at that width
    reranker = None
    if config.rerank:  # loaded before any encoding: a name that cannot be loaded stops the run at once
        reranker = CrossEncoder.from_pretrained(config.rerank).to(device)
        reranker.precision = encoder.precision
    show = not config.no_progress and progress.resolve("auto") == "bar"
    result = evaluate(encoder, config.senteval_dir, tasks, config.mode, config.batch_size, config.max_length,
                      show_progress_bar=show, mrpc_features=config.mrpc_features, probe=config.probe,
                      threads=config.threads, lexical_dir=config.lexical_dir,
                      lexical_pooling=config.lexical_pooling) if tasks else {}
    if retrieval:
        result["retrieval"] = evaluate_retrieval(encoder, retrieval_set, str(config.retrieval_dir),
                                                 config.retrieval_score or model_score(config.encoder),
                                                 config.batch_size, show_progress_bar=show, reranker=reranker,
                                                 rerank_top=config.rerank_top)
        if reranker is not None:
            result["retrieval"]["rerank"] = str(config.rerank)
    result["encoder"] = str(config.encoder)
    result["truncate_dim"] = config.truncate_dim
    result["environment"] = environment.collect(device, encoder.precision)  # what the scores were computed with
    print("\n".join(([format_table(result)] if tasks else []) + ([format_retrieval(result["retrieval"])]
                                                                  if retrieval else [])))
    if config.json:
        write_json_atomic(config.json, result)
    return result
