"""BEIR's retrieval layout (Thakur et al. 2021): readers, a writer, and a builder that makes a
duplicate-question retrieval set in that layout from the CS224N Quora files.

    DIR/corpus.jsonl     one JSON object a line: {"_id": ..., "title": ..., "text": ...}
    DIR/queries.jsonl    one JSON object a line: {"_id": ..., "text": ...}
    DIR/qrels/test.tsv   a header line (query-id, corpus-id, score), then one judgement a line, tab-separated

A document's text is its title and text joined by a space (stripped), as BEIR's dense retrievers
read them. A score above 0 marks the document relevant to the query (BEIR's convention; a score of
0 is a judged non-relevant document). Bad input (a missing file, a malformed line, a duplicate id,
a query of the qrels that queries.jsonl does not have) raises :class:`~bertcf.errors.DataError`
naming the file and line.

The Quora set is made the way BEIR made its Quora task: the queries are questions, the corpus is
every distinct question, and a query's relevant documents are its duplicates. Here each duplicate
pair (is_duplicate = 1) of the chosen CS224N splits makes its first question a query and its
second a relevant document; the corpus holds every distinct question of every CS224N Quora file
present (train, dev, and the unlabelled test questions). A query keeps the id of its own copy in
the corpus, as in BEIR's Quora, where the evaluation skips a document whose id is the query's.

    python -m bertcf.data beir-quora --data-dir data/ --out data/beir-quora [--queries-from dev]
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from ..utils.files import save_dir_atomic
from .reading import open_text
from .tasks import SPLITS, read_qqp, task_file

logger = logging.getLogger("bertcf.data")

CORPUS, QUERIES = "corpus.jsonl", "queries.jsonl"
QRELS_HEADER = ("query-id", "corpus-id", "score")


def qrels_file(split: str = "test") -> str:
    return f"qrels/{split}.tsv"


@dataclass
class RetrievalSet:
    """A BEIR-layout set: ``corpus`` {id: text}, ``queries`` {id: text} (those the qrels judge) and
    ``qrels`` {query id: {corpus id: score}}."""

    corpus: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def _lines(path: Path):
    """(line number, line without its end) of a UTF-8 text file; DataError on bytes that are not UTF-8."""
    with open_text(path, hint=f"BEIR's layout: {CORPUS}, {QUERIES}, {qrels_file()}") as handle:
        number = 0
        try:
            for number, line in enumerate(handle, start=1):
                yield number, line.rstrip("\r\n")
        except UnicodeDecodeError as error:
            raise DataError(f"{path} line {number + 1}: not valid UTF-8 (byte {error.start})") from None


def read_jsonl(path, text_fields: tuple[str, ...]) -> dict[str, str]:
    """{_id: text} of a BEIR jsonl file: each line an object with a string ``_id`` and the
    ``text_fields`` (the first required, the others optional), joined by a space and stripped.
    Blank lines are skipped; a malformed line or a repeated id is a DataError."""
    path, out = Path(path), {}
    for number, line in _lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            raise DataError(f"{path} line {number}: not a JSON object ({error.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("_id"), (str, int)) or str(row["_id"]) == "":
            raise DataError(f"{path} line {number}: expected an object with an \"_id\"")
        if not isinstance(row.get(text_fields[-1]), str):
            raise DataError(f"{path} line {number}: expected a string \"{text_fields[-1]}\"")
        if any(not isinstance(row.get(f, ""), str) for f in text_fields):
            raise DataError(f"{path} line {number}: {', '.join(text_fields)} must be strings")
        key = str(row["_id"])
        if key in out:
            raise DataError(f"{path} line {number}: _id {key!r} appears twice")
        out[key] = " ".join(row.get(f, "") for f in text_fields).strip()
    if not out:
        raise DataError(f"{path} has no entries")
    return out


def read_corpus(path) -> dict[str, str]:
    return read_jsonl(path, ("title", "text"))


def read_queries(path) -> dict[str, str]:
    return read_jsonl(path, ("text",))


def read_qrels(path) -> dict[str, dict[str, int]]:
    """{query id: {corpus id: score}} of a BEIR qrels file (a header line, then query-id, corpus-id
    and an integer score, tab-separated). A judgement given twice keeps its last score, as BEIR's loader."""
    path, qrels, header = Path(path), {}, None
    for number, line in _lines(path):
        if not line.strip():
            continue
        fields = line.split("\t")
        if header is None:
            header = tuple(f.strip() for f in fields)
            if header != QRELS_HEADER:
                raise DataError(f"{path} line {number}: expected the header {chr(9).join(QRELS_HEADER)!r}")
            continue
        if len(fields) != 3 or not fields[0].strip() or not fields[1].strip():
            raise DataError(f"{path} line {number}: expected query-id, corpus-id and score, tab-separated")
        try:
            score = int(fields[2])
        except ValueError:
            raise DataError(f"{path} line {number}: score {fields[2]!r} is not an integer") from None
        qrels.setdefault(fields[0].strip(), {})[fields[1].strip()] = score
    if not qrels:
        raise DataError(f"{path} has no judgements")
    return qrels


def load(directory, split: str = "test") -> RetrievalSet:
    """The set in ``directory``; its queries are those with a relevant document (score > 0) in the
    qrels of ``split``. A query of the qrels that is not in queries.jsonl is a DataError; a
    relevant document that is not in the corpus stays relevant (it counts against recall) and is
    reported in one warning."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory}: no such directory (BEIR's layout: {CORPUS}, {QUERIES}, {qrels_file(split)})")
    qrels_path = directory / qrels_file(split)
    for path in (qrels_path, directory / QUERIES, directory / CORPUS):  # the readers' own hint names qrels/test.tsv
        if not path.exists():
            raise DataError(f"{path} not found (BEIR's layout: {CORPUS}, {QUERIES}, {qrels_file(split)})")
    qrels = read_qrels(qrels_path)
    queries = read_queries(directory / QUERIES)
    unknown = [q for q in qrels if q not in queries]
    if unknown:
        raise DataError(f"{qrels_path}: query-id {unknown[0]!r} is not in {directory / QUERIES}"
                        + (f" (nor are {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    corpus = read_corpus(directory / CORPUS)
    judged = {q: docs for q, docs in qrels.items() if any(s > 0 for s in docs.values())}
    absent = {d for docs in judged.values() for d, s in docs.items() if s > 0 and d not in corpus}
    if absent:
        logger.warning("warning: %s: %d relevant corpus-id(s) not in %s (e.g. %r); they count as missed",
                       qrels_path, len(absent), CORPUS, sorted(absent)[0])
    if not judged:
        raise DataError(f"{qrels_path}: no query has a relevant document (score > 0)")
    return RetrievalSet(corpus, {q: queries[q] for q in judged}, judged)


def write(directory, corpus: dict[str, str], queries: dict[str, str], qrels: dict[str, dict[str, int]],
          split: str = "test") -> None:
    """Write a set in BEIR's layout, the directory as a whole (a half-written one is never left)."""
    def lines(rows):
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)

    def fill(tmp: Path):
        documents = ({"_id": k, "title": "", "text": v} for k, v in corpus.items())
        (tmp / CORPUS).write_text(lines(documents), encoding="utf-8")
        (tmp / QUERIES).write_text(lines({"_id": k, "text": v} for k, v in queries.items()), encoding="utf-8")
        (tmp / "qrels").mkdir()
        judgements = [f"{q}\t{d}\t{s}\n" for q, docs in qrels.items() for d, s in docs.items()]
        (tmp / qrels_file(split)).write_text("\t".join(QRELS_HEADER) + "\n" + "".join(judgements), encoding="utf-8")

    save_dir_atomic(directory, fill)


# ---- the Quora set ------------------------------------------------------------------------------
def build_quora(data_dir, queries_from: tuple[str, ...] = ("dev",), exclude: tuple[str, ...] = ()) -> RetrievalSet:
    """The duplicate-question set of the CS224N Quora files in ``data_dir`` (see the module's
    docstring): queries from the duplicate pairs of ``queries_from`` ("train", "dev"), the corpus
    from every Quora file present. Ids are the questions' numbers in order of first appearance.
    ``exclude`` ("dev"): leave out every pair with a question of those splits' duplicate pairs, so
    that a set to train on shares no query or relevant document with the set built from them."""
    pairs = {}
    for split in SPLITS:
        path = task_file(data_dir, "qqp", split)
        if split in queries_from or split in exclude or path.exists():
            pairs[split] = read_qqp(path, labeled=split != "test")
    ids: dict[str, str] = {}
    for split in SPLITS:
        for p in pairs.get(split, []):
            for text in (p.sentence1.strip(), p.sentence2.strip()):
                ids.setdefault(text, str(len(ids)))
    held_out = {t for split in exclude for p in pairs[split] if p.label == 1.0
                for t in (p.sentence1.strip(), p.sentence2.strip())}
    qrels: dict[str, dict[str, int]] = {}
    for split in queries_from:
        for p in pairs[split]:
            query, duplicate = ids[p.sentence1.strip()], ids[p.sentence2.strip()]
            if p.label == 1.0 and query != duplicate and not {p.sentence1.strip(), p.sentence2.strip()} & held_out:
                qrels.setdefault(query, {})[duplicate] = 1
    if not qrels:
        raise DataError(f"{data_dir}: no duplicate pairs in the Quora {' and '.join(queries_from)} file(s)"
                        + (f" that share no question with {' and '.join(exclude)}'s" if exclude else ""))
    corpus = {i: text for text, i in ids.items()}
    return RetrievalSet(corpus, {q: corpus[q] for q in qrels}, qrels)
