"""The encoder a run starts from (``ModelConfig``): a Hugging Face BERT or a checkpoint, its
tokenizer, dropout and pooling."""
from __future__ import annotations

from dataclasses import dataclass

from ..cli import PROBABILITY
from ..models.encoder import POOLINGS
from ..settings import Settings, option


@dataclass(frozen=True)
class ModelConfig(Settings):
    GROUP = "model"

    model: str = option("bert-base-uncased", "Hugging Face BERT name or directory")
    init: str | None = option(None, "start from this run directory or checkpoint instead of --model")
    vocab: str | None = option(None, "vocab.txt for a checkpoint directory without tokenizer files")
    dropout: float = option(0.1, "encoder dropout (hidden and attention)", type=PROBABILITY)
    pooling: str | None = option(None, "the sentence vector (default: the checkpoint's, mean for a plain BERT): mean, "
                                       "cls, or first-last-avg, the average of the first and the last layer's token "
                                       "means (BERT-flow's, BERT-whitening's)", choices=POOLINGS)
