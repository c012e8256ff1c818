"""One evaluation of an encoder, as ``python -m bertcf.evaluate`` runs it (``run``): SentEval's STS
and transfer tasks, word similarity, retrieval, and mteb's evaluators on the same local files
(``mteb-sts``, ``mteb-retrieval``: :mod:`bertcf.evaluation.mteb_tasks`), from an ``EvaluateConfig``;
a table on stdout and the scores as JSON."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from ..backend import is_onnx_export, load_onnx
from ..cli import check_truncate_dim
from ..data import beir
from ..errors import UsageError
from ..models.cross_encoder import load_cross_encoder
from ..models.encoder import SentenceEncoder
from ..search.index import import_faiss, set_threads
from ..utils import environment, progress
from ..utils.files import write_json_atomic
from ..utils.precision import resolve_device, resolve_precision
from .lexical import word_similarity_evaluators
from .retrieval import evaluate_retrieval, format_retrieval, model_score
from .senteval import evaluate, format_table, parse_tasks, split_keyword, split_lexical

MTEB_STS, MTEB_RETRIEVAL = "mteb-sts", "mteb-retrieval"
MTEB_INSTALL = "pip install 'bertcf[mteb]'"


def run(config) -> dict:
    """The tasks of ``config`` on its encoder: the results (with the environment they were computed
    in), printed as a table and written to the ``--json`` file (``config.json``) when given. Bad tasks and data are found
    before the model loads."""
    tasks, retrieval = split_keyword(config.tasks, "retrieval")
    tasks, mteb_sts = split_keyword(tasks, MTEB_STS)
    tasks, mteb_retrieval = split_keyword(tasks, MTEB_RETRIEVAL)
    rest, lexical = split_lexical(tasks)
    if rest or not (lexical or retrieval or mteb_sts or mteb_retrieval):
        parse_tasks(rest)
    if lexical:
        word_similarity_evaluators(config.lexical_dir)
    if (retrieval or mteb_retrieval) and not config.retrieval_dir:
        name = "retrieval" if retrieval else MTEB_RETRIEVAL
        raise UsageError(f"--tasks {name} needs --retrieval-dir DIR (a set in BEIR's layout)")
    if config.rerank and not retrieval:
        raise UsageError("--rerank reranks retrieval's lists: add retrieval to --tasks")
    if retrieval and config.index != "exact":
        import_faiss()  # before the model loads
    retrieval_set = beir.load(config.retrieval_dir) if retrieval or mteb_retrieval else None
    if lexical and config.mode == "dev":
        raise UsageError("--mode dev: the word-similarity sets have no dev split; score lexical in --mode test")
    mteb_tasks = _mteb_tasks(config, mteb_sts, retrieval_set if mteb_retrieval else None)
    torch.set_num_threads(config.threads)
    if retrieval and config.index != "exact":
        set_threads(config.threads)
    if is_onnx_export(config.encoder):
        if tasks or retrieval:
            raise UsageError(f"--encoder {config.encoder} is an ONNX export: it is scored by --tasks {MTEB_STS},"
                             f"{MTEB_RETRIEVAL} only; give its checkpoint for the other tasks")
        onnx = _onnx_encoder(config)
        device = "onnxruntime:" + onnx.session.get_providers()[0]  # where ONNX Runtime ran the graph
        return _finish(config, _run_mteb(config, onnx, mteb_tasks), device, None)
    device = resolve_device(config.device)
    encoder = SentenceEncoder.from_pretrained(config.encoder, pooling=config.pooling, vocab=config.vocab).to(device)
    encoder.precision = resolve_precision(config.precision, device)
    check_truncate_dim(config.truncate_dim, encoder.output_dim, "the encoder")
    encoder.truncate_dim = config.truncate_dim  # every task encodes through encode(): scored at that width
    reranker = None
    if config.rerank:  # loaded before any encoding: a name that cannot be loaded stops the run at once
        reranker = load_cross_encoder(config.rerank, "--rerank", device, precision=encoder.precision)
    show = _show_progress(config)
    result = evaluate(encoder, config.senteval_dir, tasks, config.mode, config.batch_size, config.max_length,
                      show_progress_bar=show, mrpc_features=config.mrpc_features, probe=config.probe,
                      threads=config.threads, lexical_dir=config.lexical_dir,
                      lexical_pooling=config.lexical_pooling) if tasks else {}
    if retrieval:
        result["retrieval"] = evaluate_retrieval(encoder, retrieval_set, str(config.retrieval_dir),
                                                 config.retrieval_score or model_score(config.encoder),
                                                 config.batch_size, show_progress_bar=show, index=config.index,
                                                 index_settings=config.graph() | {
                                                     "rescore_multiplier": config.multiplier()},
                                                 reranker=reranker, rerank_top=config.rerank_top)
        if reranker is not None:
            result["retrieval"]["rerank"] = str(config.rerank)
    if mteb_tasks:
        result |= _run_mteb(config, encoder, mteb_tasks)
    return _finish(config, result, device, encoder.precision)


def _finish(config, result: dict, device, precision) -> dict:
    """``result`` with the encoder and the environment, printed and written to --json."""
    result["encoder"] = str(config.encoder)
    result["truncate_dim"] = config.truncate_dim
    result["environment"] = environment.collect(device, precision)  # what the scores were computed with
    parts = [format_table(result)] if result.get("sts") or result.get("transfer") or result.get("lexical") else []
    if "retrieval" in result:
        parts.append(format_retrieval(result["retrieval"]))
    if "mteb" in result:
        from .mteb_tasks import format_mteb
        parts.append(format_mteb(result["mteb"]))
    print("\n".join(parts))
    if config.json:
        write_json_atomic(config.json, result)
    return result


def _show_progress(config) -> str:
    """The progress mode of every long step: a bar on a terminal, plain lines in a log, none with
    --no-progress."""
    return "none" if config.no_progress else "auto"


def _onnx_encoder(config):
    """The ONNX export of ``config.encoder`` under ONNX Runtime (--threads its intra-op threads),
    --truncate-dim checked against it."""
    if config.pooling or config.vocab or config.precision:
        raise UsageError("--pooling, --vocab and --precision are fixed in an ONNX export; leave them out")
    encoder = load_onnx(config.encoder, threads=config.threads)
    check_truncate_dim(config.truncate_dim, encoder.dim, "the export")
    return encoder


def _mteb_tasks(config, sts: bool, retrieval_set) -> list:
    """mteb's tasks on the local files (read now: a bad file stops the command before the model
    loads); mteb missing is one line saying what to install."""
    if not sts and retrieval_set is None:
        return []
    if importlib.util.find_spec("mteb") is None:
        names = ",".join(n for n, on in ((MTEB_STS, sts), (MTEB_RETRIEVAL, retrieval_set is not None)) if on)
        raise UsageError(f"--tasks {names} needs mteb, which is not installed: {MTEB_INSTALL}")
    from ..data import senteval as se
    from .mteb_tasks import LocalRetrieval, LocalSTSB
    tasks = []
    if sts:
        split = "dev" if config.mode == "dev" else "test"
        tasks.append(LocalSTSB(se.check_dir(config.senteval_dir), split))
    if retrieval_set is not None:
        tasks.append(LocalRetrieval(retrieval_set, str(config.retrieval_dir)))
    return tasks


def _run_mteb(config, encoder, tasks) -> dict:
    """{"mteb": mteb's scores of ``encoder`` on ``tasks``}. STS-B's sentences are encoded whole (up to
    --max-length), as the SentEval tasks encode them; a retrieval set's texts up to the encoder's own
    max_length, as ``--tasks retrieval`` (and sentence-transformers) encode them."""
    from .mteb_tasks import MtebModel, evaluate_mteb
    onnx = not isinstance(encoder, SentenceEncoder)
    positions = int(encoder.config["max_position_embeddings"]) if onnx else encoder.bert.config.max_position_embeddings
    # an export's similarity is its checkpoint's (the export records where it came from)
    score = config.retrieval_score or model_score(encoder.config.get("source") or config.encoder if onnx
                                                  else config.encoder)
    model = MtebModel(encoder, f"bertcf/{Path(str(config.encoder)).name}", score,
                      max_lengths={"STS": config.max_length or positions}, truncate_dim=config.truncate_dim,
                      framework="ONNX" if onnx else "PyTorch")
    bars = _show_progress(config) != "none" and progress.resolve("auto") == "bar"  # mteb's own bars: a terminal's
    return {"mteb": evaluate_mteb(model, tasks, config.batch_size, bars)}
