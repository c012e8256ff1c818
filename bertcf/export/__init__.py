"""What a checkpoint tells other tools: the sentence-transformers layout (``st_format``) and the
model card (``model_card``)."""
