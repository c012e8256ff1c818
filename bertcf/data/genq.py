"""GenQ: synthetic queries for a corpus's passages, written by a seq2seq query generator, in BEIR's
layout, so that a bi-encoder can be trained on (query, passage) pairs of a domain without labels
(Thakur et al. 2021, "BEIR: A Heterogeneous Benchmark for Zero-shot Evaluation of Information
Retrieval Models", NeurIPS, section 4 "GenQ"; after Ma et al. 2021). The default generator is
BEIR's T5-base trained on MS MARCO, ``BeIR/query-gen-msmarco-t5-base-v1``.

    OUT/corpus.jsonl      the passages
    OUT/queries.jsonl     the generated queries, ids genQ1, genQ2, ... (BEIR's)
    OUT/qrels/train.tsv   each query with the passage it was written for, score 1

How the queries are drawn (``Generation``) follows BEIR's generator, which GPL calls unchanged
(``beir.generation.QueryGenerator.generate`` and ``models.QGenModel.generate``; GPL's
``toolkit/qgen.py``): the passage is its title and text joined by a space, truncated to the
generator's length limit; nucleus sampling (``do_sample``) with top_p 0.95 and top_k 25, at most
64 tokens a query; 3 queries a passage (GPL's ``qgen`` default and BEIR's example, "gen-3"); a
passage's repeated queries kept once. Three differences: the attention mask goes to the generator
(BEIR passes the ids alone, so a padded passage attends to its padding), a blank query is dropped,
and the draws are seeded (``seed``), so a run repeats.

    python -m bertcf.data genq --corpus DIR_OR_FILE --out OUT [--generator NAME] [--queries-per-passage 3]
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from ..utils.hub import load_failure
from . import beir
from .reading import read_lines

DEFAULT_GENERATOR = "BeIR/query-gen-msmarco-t5-base-v1"
QUERY_PREFIX = "genQ"  # BEIR's ids of generated queries


@dataclass(frozen=True)
class Generation:
    """How queries are drawn (BEIR's ``QueryGenerator`` defaults, see the module's docstring):
    ``queries_per_passage`` sequences sampled per passage with nucleus sampling (``top_p``, ``top_k``),
    each at most ``max_length`` tokens; ``batch_size`` passages at once; ``seed`` of the draws. The
    command line's values are checked where its flags are declared (``config.datatools.GenQSettings``)."""

    queries_per_passage: int = 3
    top_p: float = 0.95
    top_k: int = 25
    max_length: int = 64
    batch_size: int = 32
    seed: int = 0


def read_passages(path) -> dict[str, str]:
    """{id: text} of the passages to write queries for: a set in BEIR's layout (its corpus.jsonl), a
    BEIR corpus file (.jsonl: title and text joined by a space), or a text file of one passage a
    line (ids: the line numbers; blank lines skipped)."""
    path = Path(path)
    if path.is_dir():
        return beir.read_corpus(path / beir.CORPUS)
    if path.suffix == ".jsonl":
        return beir.read_corpus(path)
    passages = {str(n): line.strip() for n, line in enumerate(read_lines(path, "corpus file"), start=1)
                if line.strip()}
    if not passages:
        raise DataError(f"corpus file {path} holds no passages")
    return passages


def load_generator(name: str, device=None):
    """(model, tokenizer) of a seq2seq query generator (transformers' ``AutoModelForSeq2SeqLM`` and
    ``AutoTokenizer``: a directory or a hub name), in evaluation mode on ``device``; one that cannot
    be loaded is a UsageError naming it and why (not found, offline)."""
    import transformers

    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(name))
        model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(name))
    except (OSError, ValueError, KeyError) as error:
        raise load_failure("--generator", name, error) from None
    return model.to(device or "cpu").eval(), tokenizer


def generate(passages: dict[str, str], model, tokenizer, settings: Generation = Generation(),
             show_progress_bar=True) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """(queries {genQn: text}, qrels {genQn: {passage id: 1}}) for ``passages`` {id: text}, in the
    passages' order, each passage's distinct non-blank queries in the order drawn. The global RNG
    is seeded with ``settings.seed`` for the draws and restored afterwards. ``show_progress_bar``:
    True or a mode of ``utils.progress`` (True: a bar on a terminal, plain lines in a log)."""
    import torch

    from ..utils.progress import Progress, mode_of

    ids, texts = list(passages), [t.strip() for t in passages.values()]
    queries, qrels = {}, {}
    n = settings.queries_per_passage
    devices = [model.device] if model.device.type == "cuda" else []
    shown = Progress(mode_of(show_progress_bar), "genq", len(texts), unit="passage")
    with torch.random.fork_rng(devices=devices), torch.no_grad(), shown:
        torch.manual_seed(settings.seed)
        for start in range(0, len(texts), settings.batch_size):
            batch = tokenizer(texts[start:start + settings.batch_size], padding=True, truncation=True,
                              return_tensors="pt").to(model.device)
            out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], do_sample=True,
                                 top_p=settings.top_p, top_k=settings.top_k, max_length=settings.max_length,
                                 num_return_sequences=n)
            decoded = tokenizer.batch_decode(out, skip_special_tokens=True)
            for i, passage in enumerate(ids[start:start + settings.batch_size]):
                for query in dict.fromkeys(q.strip() for q in decoded[i * n:(i + 1) * n]):
                    if query:
                        key = f"{QUERY_PREFIX}{len(queries) + 1}"
                        queries[key], qrels[key] = query, {passage: 1}
            shown.advance(len(ids[start:start + settings.batch_size]))
    if not queries:
        raise DataError("the generator wrote no query that is not blank")
    return queries, qrels


def generate_set(corpus, out, generator: str, settings: Generation = Generation(), device=None,
                 show_progress_bar: bool = True) -> dict:
    """GenQ from end to end: the passages of ``corpus`` (``read_passages``), ``generator`` loaded on
    ``device``, their queries generated and OUT written: {"queries": how many, "passages": how many}."""
    passages = read_passages(corpus)
    model, tokenizer = load_generator(generator, device)
    queries, qrels = generate(passages, model, tokenizer, settings, show_progress_bar)
    write(out, passages, queries, qrels)
    return {"queries": len(queries), "passages": len(passages)}


def write(out, passages: dict[str, str], queries: dict[str, str], qrels: dict[str, dict[str, int]]) -> None:
    """OUT in BEIR's layout: the passages, the queries and qrels/train.tsv, written as a whole."""
    beir.write(out, passages, queries, qrels, split="train")
