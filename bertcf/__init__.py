"""BERT-CF: contrastive flows for multitask BERT, built on minBERT."""

__all__ = ["SentenceEncoder"]


def __getattr__(name):
    # Lazy, so `python -m bertcf.data download` starts without importing torch.
    if name == "SentenceEncoder":
        from .models.encoder import SentenceEncoder
        return SentenceEncoder
    raise AttributeError(f"module 'bertcf' has no attribute {name!r}")
