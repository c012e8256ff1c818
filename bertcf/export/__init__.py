"""What a trained checkpoint gives other tools: the model card (``model_card``); the
sentence-transformers layout itself is part of the checkpoint (``bertcf.models.st_format``)."""
