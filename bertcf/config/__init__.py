"""The settings, typed and resolved once: one frozen dataclass per concern (``train.TrainConfig``,
``model.ModelConfig``, ``data``'s, each objective's in ``bertcf.objectives.settings``), and each
command's, composed of them and resolved by its ``parse`` (``pretrain``, ``multitask``,
``evaluate``, ``cross``, ``gpl``; ``search.IndexConfig``: a search index's). ``bertcf.settings``, below
both ``objectives`` and ``config``, declares a setting once: its default, help and check, and its flag."""
