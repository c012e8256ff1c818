"""WordPiece tokenisation through ``transformers``' BERT tokenizer (the fast, Rust one)."""
from __future__ import annotations

from pathlib import Path

import torch

from .model import CheckpointError


def load_tokenizer(name_or_path, vocab_fallback=None):
    """A BERT tokenizer from a checkpoint directory, a bare ``vocab.txt``, or a hub name.

    ``vocab_fallback``: a vocab.txt used when a checkpoint directory carries no tokenizer
    files (e.g. a config-only directory made for a benchmark)."""
    from transformers import BertTokenizerFast

    path = Path(name_or_path)
    try:
        if path.is_file():  # a bare vocab.txt
            return BertTokenizerFast(vocab=str(path), do_lower_case=True)
        if path.is_dir():
            if (path / "tokenizer.json").is_file() or (path / "vocab.txt").is_file():
                return BertTokenizerFast.from_pretrained(str(path))
            if vocab_fallback is not None:
                return BertTokenizerFast(vocab=str(vocab_fallback), do_lower_case=True)
            raise CheckpointError(f"{path} has no tokenizer files (tokenizer.json or vocab.txt): copy a "
                                  f"vocab.txt into it, or give one with --vocab FILE")
        return BertTokenizerFast.from_pretrained(str(name_or_path))
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"cannot load a tokenizer from {name_or_path!r} ({type(e).__name__}: {e})") from None


def tokenize(tokenizer, sentences, max_length: int, return_tensors="pt"):
    """Truncate to ``max_length`` tokens and pad to the longest sentence of this batch only."""
    return tokenizer(list(sentences), truncation=True, max_length=max_length, padding="longest",
                     return_tensors=return_tensors, return_token_type_ids=True)


def pad_batch(id_lists, pad_token_id: int = 0):
    """Pre-tokenised sentences (lists of ids) -> input_ids, attention_mask [b, longest]."""
    longest = max(len(ids) for ids in id_lists)
    input_ids = torch.full((len(id_lists), longest), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(id_lists), longest), dtype=torch.long)
    for i, ids in enumerate(id_lists):
        input_ids[i, :len(ids)] = torch.tensor(ids)
        attention_mask[i, :len(ids)] = 1
    return input_ids, attention_mask
