"""minBERT: a BERT encoder written from scratch in PyTorch."""
from .model import BertConfig, BertModel, CheckpointError
from .tokenizer import load_tokenizer, pad_batch, tokenize

__all__ = ["BertConfig", "BertModel", "CheckpointError", "load_tokenizer", "pad_batch", "tokenize"]
