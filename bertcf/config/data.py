"""What a training run reads (``DataConfig``, ``CorpusConfig``, ``TrainFilesConfig``): the CS224N
directory, the pretraining corpus, and the supervised objectives' labelled files or teacher."""
from __future__ import annotations

from dataclasses import dataclass

from ..cli import AT_LEAST_2
from ..settings import Settings, option


@dataclass(frozen=True)
class DataConfig(Settings):
    GROUP = "data"
    data_dir: str = option("data", "directory with the CS224N files")


@dataclass(frozen=True)
class CorpusConfig(Settings):
    """The sentences of self-supervised pretraining: one corpus, from a file, the task files or a
    word list."""

    GROUP = "corpus"
    corpus: str | None = option(None, "text file, one sentence per line (default: DATA_DIR/wiki1m_for_simcse.txt "
                                      "when present)")
    corpus_from_tasks: bool = option(False, "use the unlabeled sentences of the SST/QQP/STS training files in "
                                            "--data-dir", switch=True)
    corpus_words: int | None = option(None, "a lexical corpus: the N most frequent English words (wordfreq), one a "
                                            "row, as Mirror-BERT's word encoder (--preset mirror-bert-lexical: "
                                            "10,000); --min-words does not apply", type=AT_LEAST_2)
    corpus_words_file: str | None = option(None, "a lexical corpus: one word or phrase per line (blank lines "
                                                 "skipped, repeats kept once); --min-words does not apply")
    min_words: int = option(6, "drop corpus sentences with fewer words", type=int)
    max_sentences: int | None = option(None, "use at most this many corpus sentences (or words)", type=int)


@dataclass(frozen=True)
class TrainFilesConfig(Settings):
    """What the supervised objectives train on instead of the corpus."""

    GROUP = "supervised (--stage supervised)"
    train_file: list[str] | None = option(
        None, "labelled training files, of one kind: NLI (SNLI/MultiNLI .jsonl or .txt, or a premise<TAB>hypothesis"
              "<TAB>label TSV) for sbert-softmax and simcse-sup, a CS224N STS or QQP file for sbert-cosine (default "
              "DATA_DIR/sts-train.csv) and sbert-softmax (QQP); simcse-sup also: anchor<TAB>positive<TAB>negative "
              "triplets, query<TAB>positive pairs, a set in BEIR's layout (its qrels/train.tsv, e.g. python -m "
              "bertcf.data genq's); margin-mse: query<TAB>positive<TAB>negative<TAB>margin rows; distill: "
              "source<TAB>target lines or one sentence a line (default: the corpus)", nargs="+", metavar="FILE")
    teacher: str | None = option(None, "distill: the teacher encoder (a checkpoint, run directory, sentence-"
                                       "transformers directory or Hugging Face name), whose vectors of the training "
                                       "sentences the student learns", metavar="DIR|NAME")
    teacher_cache: str | None = option(None, "distill: where the teacher's vectors are kept, one file per teacher and "
                                             "corpus (default: OUT_DIR/teacher); runs that share it compute them once",
                                       metavar="DIR")
