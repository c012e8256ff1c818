"""mteb (Muennighoff et al. 2023) on local files, offline: a BERT-CF encoder as an mteb model, and
STS-B and a BEIR-layout set as mteb tasks, scored by mteb's own evaluators (``mteb.evaluate``).

    model = MtebModel(encoder, "bertcf/my-run", score="cos")   # a SentenceEncoder or an OnnxEncoder
    tasks = [LocalSTSB("data/SentEval"), LocalRetrieval(beir.load("data/beir-quora"), "beir-quora")]
    scores = evaluate_mteb(model, tasks)  # {"STSBenchmarkLocal": {"main_score": "cosine_spearman", ...}, ...}

The model (:class:`MtebModel`) is mteb's encoder protocol (``mteb.models.AbsEncoder``): ``encode``
takes mteb's batches of texts and returns the encoder's float32 vectors [n, D] (numpy), encoded by
the encoder's own ``encode`` (length-sorted batches); ``score`` sets the similarity mteb searches
and scores with (cos: ``ScoringFunction.COSINE``; dot: ``DOT_PRODUCT``). ``max_lengths`` gives a
token limit per mteb task type ("STS", "Retrieval"); a type not named is encoded up to the
encoder's own ``max_length``, as sentence-transformers encodes.

The tasks are mteb's task classes with their data read from local files by BERT-CF's readers
(``bertcf.data.senteval``, ``bertcf.data.beir``; a bad file is a DataError when the task is built)
instead of downloaded from the Hugging Face hub. They are named ``STSBenchmarkLocal`` and
``BEIRLocal``, not after mteb's own tasks: mteb's STSBenchmark reads the original sentences from the
hub, SentEval's copy is tokenized and lower-cased.

* :class:`LocalSTSB`: ``AbsTaskSTS`` on STS-B test (or dev) in SentEval's layout; main score
  ``cosine_spearman``, the Spearman correlation of cos(u, v) with the gold scores, the figure
  ``python -m bertcf.evaluate`` reports for STSBenchmark (there ×100).
* :class:`LocalRetrieval`: ``AbsTaskRetrieval`` on a BEIR-layout set; main score ``ndcg_at_10``
  (pytrec_eval's nDCG@10 over mteb's exact search). ``ignore_identical_ids`` is on, as in
  ``bertcf.evaluation.retrieval`` and BEIR: a document whose id is the query's is never retrieved.

:func:`evaluate_mteb` runs them with no result cache (nothing is read from or written to
``~/.cache/mteb``) and returns mteb's scores as mteb reports them (fractions, not ×100).
"""
from __future__ import annotations

from pathlib import Path

import datasets
import mteb
import numpy as np
from datasets import Dataset, DatasetDict
from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
from mteb.abstasks.sts import AbsTaskSTS
from mteb.abstasks.task_metadata import TaskMetadata
from mteb.models.abs_encoder import AbsEncoder
from mteb.models.model_meta import ModelMeta, ScoringFunction

from ..data import senteval as se

SCORE_FUNCTIONS = {"cos": ScoringFunction.COSINE, "dot": ScoringFunction.DOT_PRODUCT}
STS_TASK, RETRIEVAL_TASK = "STSBenchmarkLocal", "BEIRLocal"  # not mteb's hub tasks: other files

_LOCAL = dict(dataset={"path": "local", "revision": "local"}, category="t2t", eval_splits=["test"],
              eval_langs=["eng-Latn"], modalities=["text"], domains=[], task_subtypes=[], bibtex_citation="")


class MtebModel(AbsEncoder):
    """``encoder`` (a ``SentenceEncoder`` or an ``OnnxEncoder``: anything with ``encode(texts,
    batch_size=, show_progress_bar=, max_length=)``) as an mteb model named ``name`` ("org/model",
    mteb's form), scored by ``score`` ("cos" or "dot"); ``max_lengths``: {mteb task type: tokens};
    ``truncate_dim``: the vectors' first k dimensions (passed to ``encode``)."""

    def __init__(self, encoder, name: str = "bertcf/encoder", score: str = "cos", max_lengths=None,
                 truncate_dim: int | None = None, framework: str = "PyTorch"):
        if score not in SCORE_FUNCTIONS:
            raise ValueError(f"score must be one of {', '.join(SCORE_FUNCTIONS)}, not {score!r}")
        self.model = encoder
        self.max_lengths = dict(max_lengths or {})
        self.truncate_dim = truncate_dim
        width = truncate_dim or getattr(encoder, "truncate_dim", None) or getattr(encoder, "output_dim", encoder.dim)
        self.mteb_model_meta = ModelMeta.create_empty({
            "name": name if "/" in name else f"bertcf/{name}", "similarity_fn_name": SCORE_FUNCTIONS[score],
            "embed_dim": int(width), "framework": [framework], "modalities": ["text"]})

    def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs) -> np.ndarray:
        """mteb's batches (each {"text": [...], ...}) -> float32 [n, D], in input order."""
        texts = [text for batch in inputs for text in batch["text"]]
        vectors = self.model.encode(texts, batch_size=kwargs.get("batch_size", 64),
                                    show_progress_bar=bool(kwargs.get("show_progress_bar", False)),
                                    max_length=self.max_lengths.get(task_metadata.type),
                                    truncate_dim=self.truncate_dim)
        if hasattr(vectors, "numpy"):  # a torch tensor (SentenceEncoder); OnnxEncoder gives numpy already
            vectors = vectors.numpy()
        return np.asarray(vectors, dtype=np.float32)


class LocalSTSB(AbsTaskSTS):
    """STS-B's ``split`` ("test" or "dev") from ``senteval_dir`` in SentEval's layout
    (``STS/STSBenchmark/sts-{split}.csv``), as mteb's STS task: gold scores 0-5."""

    metadata = TaskMetadata(name=STS_TASK, type="STS", main_score="cosine_spearman",
                            description="STS Benchmark (Cer et al. 2017) from SentEval's files", **_LOCAL)
    min_score, max_score = 0, 5

    def __init__(self, senteval_dir, split: str = "test", **kwargs):
        self.split = split
        self.pairs = se.read_stsb(Path(senteval_dir) / se.STSB_FILES[split])
        super().__init__(**kwargs)
        self._eval_splits = [split]

    def load_data(self, num_proc=None, **kwargs) -> None:
        columns = {"sentence1": [p.sentence1 for p in self.pairs], "sentence2": [p.sentence2 for p in self.pairs],
                   "score": [float(p.label) for p in self.pairs]}
        self.dataset = DatasetDict({self.split: Dataset.from_dict(columns)})
        self.data_loaded = True


class LocalRetrieval(AbsTaskRetrieval):
    """A BEIR-layout set (``data``: a ``bertcf.data.beir.RetrievalSet``, its queries those with a
    relevant document) as mteb's retrieval task; ``name``: the set's name in the results."""

    metadata = TaskMetadata(name=RETRIEVAL_TASK, type="Retrieval", main_score="ndcg_at_10",
                            description="a retrieval set in BEIR's layout, read from local files", **_LOCAL)
    ignore_identical_ids = True  # BEIR's default, and bertcf.evaluation.retrieval's

    def __init__(self, data, name: str = "", **kwargs):
        self.data, self.name = data, name  # not self.corpus/queries: mteb takes those for its old format
        super().__init__(**kwargs)

    def load_data(self, num_proc=None, **kwargs) -> None:
        ids = list(self.data.corpus)
        corpus = Dataset.from_dict({"id": ids, "title": [""] * len(ids), "text": [self.data.corpus[i] for i in ids]})
        queries = Dataset.from_dict({"id": list(self.data.queries), "text": list(self.data.queries.values())})
        split = RetrievalSplitData(corpus=corpus, queries=queries, top_ranked=None,
                                   relevant_docs={q: dict(docs) for q, docs in self.data.qrels.items()})
        self.dataset = {"default": {"test": split}}
        self.data_loaded = True


def evaluate_mteb(model: MtebModel, tasks, batch_size: int = 64, show_progress_bar: bool = False) -> dict:
    """``mteb.evaluate`` of ``model`` on ``tasks`` (built above), no cache, errors raised:
    {task name: {"split", "main_score" (its name), "value" (its value), "scores" (every metric mteb
    reports, as it reports them: fractions), "set" (a retrieval task's directory), "mteb_version"}}."""
    bars = datasets.is_progress_bar_enabled()
    if not show_progress_bar:  # datasets' bars for mteb's own preprocessing of the corpus
        datasets.disable_progress_bars()
    try:
        results = mteb.evaluate(model, list(tasks), cache=None, co2_tracker=False, overwrite_strategy="always",
                                encode_kwargs={"batch_size": batch_size, "show_progress_bar": show_progress_bar},
                                show_progress_bar=show_progress_bar)
    finally:
        if bars:
            datasets.enable_progress_bars()
    out = {}
    for task, result in zip(tasks, results.task_results):
        split = task.eval_splits[0]
        scores = {k: v for k, v in result.scores[split][0].items() if isinstance(v, (int, float))}
        out[task.metadata.name] = {"split": split, "main_score": task.metadata.main_score,
                                   "value": scores[task.metadata.main_score], "scores": scores,
                                   **({"set": task.name} if isinstance(task, LocalRetrieval) else {}),
                                   "mteb_version": mteb.__version__}
    return out


#: The metrics the table shows for each kind of task, beside the main score.
SHOWN = {"cosine_spearman": ("cosine_spearman", "cosine_pearson"),
         "ndcg_at_10": ("ndcg_at_10", "mrr_at_10", "recall_at_100", "map_at_100")}


def format_mteb(results: dict) -> str:
    """One line per task: its name, split and main metrics (×100, as the other tables)."""
    lines = [f"mteb {next(iter(results.values()))['mteb_version']}:" if results else "mteb:"]
    for name, r in results.items():
        shown = SHOWN.get(r["main_score"], (r["main_score"],))
        where = f"{name} ({r['split']}" + (f", {r['set']})" if r.get("set") else ")")
        lines.append(f"  {where}: " + ", ".join(f"{k} {100 * r['scores'][k]:.2f}" for k in shown if k in r["scores"]))
    return "\n".join(lines)
