"""Evaluation: STS and representation metrics (``metrics``), SentEval's tasks as evaluator objects
(``evaluators``) and bootstrap intervals (``bootstrap``)."""
