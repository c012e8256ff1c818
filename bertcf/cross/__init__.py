"""The cross-encoder as a package, as sentence-transformers keeps its ``cross_encoder/``: both texts
of a pair read together (``[CLS] a [SEP] b [SEP]``) and scored from BERT's pooled [CLS] vector.

- :mod:`.config`: the settings of ``python -m bertcf.cross train`` (``CrossConfig``) and
  ``evaluate`` (``CrossEvalConfig``), resolved once by ``parse``;
- :mod:`.evaluation`: the pair sets (CS224N STS dev, QQP dev, SentEval's STS-B test) scored by a
  cross-encoder or a bi-encoder's cosine; ``evaluate``'s ``run``;
- :mod:`.training`: a cross-encoder trained on labelled pairs on ``TrainingLoop``; ``train``'s ``run``;
- :mod:`.command`: ``python -m bertcf.cross`` and ``bertcf-cross`` (``run``, ``main``).

The model itself, ``bertcf.CrossEncoder``, is ``bertcf/models/cross_encoder.py`` (stage 3's joint
pairs share its tokenisation), and so is the one pair scorer every user of a cross-encoder calls:
``CrossEncoder.relevance`` (the log-odds that a pair is relevant: reranking, GPL's margins, and,
through a sigmoid, the pair sets' scores) with ``load_cross_encoder`` (a checkpoint that is a
cross-encoder, refused in one line when it is not). Importing this package imports nothing.
"""
