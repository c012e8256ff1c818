"""The pretraining corpus of a run's settings (``load_corpus``): a text file, the task files'
sentences, or a word list (a lexical corpus)."""
from __future__ import annotations

import sys
from pathlib import Path

from ..errors import UsageError
from .download import WIKI1M_NAME
from .tasks import read_corpus, task_sentences
from .words import read_word_list, top_words

#: The settings that give the corpus; one at a time.
CORPUS_SETTINGS = ("corpus", "corpus_from_tasks", "corpus_words", "corpus_words_file")


def load_corpus(config) -> tuple[list[str], str | None]:
    """The sentences of ``config`` (a run's settings: ``corpus``, ``corpus_from_tasks``,
    ``corpus_words``, ``corpus_words_file``, ``data_dir``, ``min_words``, ``max_sentences``; by
    default DATA_DIR/wiki1m_for_simcse.txt), and, for a lexical corpus, where its words come from."""
    given = [f"--{f.replace('_', '-')}" for f in CORPUS_SETTINGS if getattr(config, f)]
    if len(given) > 1:
        raise UsageError(f"give one corpus, not {' and '.join(given)} together")
    word_list = None
    if config.corpus_words or config.corpus_words_file:
        if config.corpus_words:
            sentences, word_list = top_words(config.corpus_words)
        else:
            sentences, word_list = read_word_list(config.corpus_words_file), str(config.corpus_words_file)
        print(f"note: corpus: {len(sentences)} words or phrases from {word_list}", file=sys.stderr)
    elif config.corpus_from_tasks:
        sentences = [s for s in task_sentences(config.data_dir) if len(s.split()) >= config.min_words]
    else:
        corpus = config.corpus or Path(config.data_dir) / WIKI1M_NAME
        if config.corpus is None and not Path(corpus).is_file():
            raise UsageError(f"no corpus: give --corpus FILE, --corpus-from-tasks or --corpus-words N ({corpus} "
                             f"not found)")
        sentences = read_corpus(corpus, min_words=config.min_words)
    if config.max_sentences:
        sentences = sentences[:config.max_sentences]
    if len(sentences) < 2:
        raise UsageError(f"the corpus has {len(sentences)} usable sentence(s); contrastive learning needs at least 2")
    return sentences, word_list
