"""GPL, Generative Pseudo Labeling (Wang et al. 2022), as a package, as the cross-encoder's
``bertcf/cross/``: a bi-encoder adapted to a domain from its passages alone, in four steps, each
one's output kept in OUT.

- :mod:`.config`: the settings of ``python -m bertcf.gpl`` (``GPLConfig``), resolved once by
  ``parse``, the training step's run_pretrain.py flags after ``--`` parsed there too;
- :mod:`.pipeline`: the four steps (the queries, each retriever's negatives, the cross-encoder's
  margins, the MarginMSE run, whose ``PretrainConfig`` it builds directly), each skipped when its
  output is there; ``run``;
- :mod:`.command`: ``python -m bertcf.gpl`` and ``bertcf-gpl`` (``run``, ``main``).

Its parts live where every command's do: GenQ's generation and the mining in ``bertcf.data``, the
cross-encoder in ``bertcf.models.cross_encoder``, MarginMSE in ``bertcf.objectives.margin_mse``
and the training in ``bertcf.training.pretraining``. Importing this package imports nothing.
"""
