"""BERT-CF: contrastive flows for multitask BERT, built on minBERT."""
from .encoder import SentenceEncoder

__all__ = ["SentenceEncoder"]
