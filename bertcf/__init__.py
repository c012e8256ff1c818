"""BERT-CF: contrastive flows for multitask BERT, built on minBERT; a library to train sentence
encoders from Python, and the commands of the report's pipeline.

    from bertcf import SentenceEncoder, TrainConfig, Trainer, objectives, set_seed

    set_seed(11711)
    encoder = SentenceEncoder.from_pretrained("bert-base-uncased")
    objective = objectives.SimCSE(encoder, temperature=0.05)
    Trainer(objective, sentences, TrainConfig(steps=1000, out_dir="runs/simcse")).fit()
"""

__all__ = ["SentenceEncoder", "CrossEncoder", "Trainer", "TrainConfig", "Examples", "STSDevEvaluator", "objectives",
           "set_seed"]


def __getattr__(name):
    # Imported on first use, so that ``python -m bertcf.data download`` starts without torch.
    if name == "SentenceEncoder":
        from .models.encoder import SentenceEncoder
        return SentenceEncoder
    if name == "CrossEncoder":
        from .models.cross_encoder import CrossEncoder
        return CrossEncoder
    if name == "Trainer":
        from .training.trainer import Trainer
        return Trainer
    if name == "TrainConfig":
        from .config.train import TrainConfig
        return TrainConfig
    if name == "Examples":
        from .data.examples import Examples
        return Examples
    if name == "STSDevEvaluator":
        from .evaluation.metrics import STSDevEvaluator
        return STSDevEvaluator
    if name == "set_seed":
        from .training.loop import set_seed
        return set_seed
    if name == "objectives":
        import bertcf.objectives as objectives  # not "from . import": that asks this function again
        return objectives
    raise AttributeError(f"module 'bertcf' has no attribute {name!r}")
