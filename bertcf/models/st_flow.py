"""BERT-CF's flow as a sentence-transformers module, so that ``SentenceTransformer(checkpoint,
trust_remote_code=True)`` returns F(x) = g^{-1}(f(x)), the vectors ``SentenceEncoder.encode`` returns;
and first-last-avg pooling, which sentence-transformers' Pooling cannot express.

This file and ``flow.py`` need torch, safetensors and sentence-transformers only: a checkpoint with
a flow carries copies of both (``bertcf_st.py`` and ``flow.py``) and its ``modules.json`` names
the module ``bertcf_st.Flow``, which sentence-transformers loads from the checkpoint itself, so the
model works where BERT-CF is not installed (``bertcf.st_format``). Checkpoints written before
name ``bertcf.st.Flow`` and load where BERT-CF is installed; ``python -m bertcf.st_format upgrade
DIR`` gives them the files.

    Flow.forward(features) maps features["sentence_embedding"] [b, D] through the Glow flow.
    FirstLastAvgPooling.forward(features) sets features["sentence_embedding"] [b, D] to the average
    of the token means (over the attention mask) of the first transformer layer's output and the
    last layer's, from features["all_layer_embeddings"] (the Transformer module gives them when its
    config has output_hidden_states, which the checkpoint's sentence_bert_config.json sets through
    config_args); [0] there is the embeddings' output, so the first layer is [1].
"""
from __future__ import annotations

try:  # sentence-transformers 6 moved the module base class
    from sentence_transformers.base.modules.module import Module
except ImportError:  # pragma: no cover - older releases
    from sentence_transformers.models.Module import Module

from .flow import Glow


class Flow(Module):
    """A :class:`bertcf.flow.Glow` on the pooled sentence embedding. Its directory holds
    ``model.safetensors``, the flow's own file (weights plus its config in the metadata)."""

    config_keys: list[str] = ["dim", "num_blocks", "hidden", "permutation"]

    def __init__(self, glow: Glow):
        super().__init__()
        self.glow = glow

    def forward(self, features: dict) -> dict:
        features["sentence_embedding"] = self.glow(features["sentence_embedding"])[0]
        return features

    def get_sentence_embedding_dimension(self) -> int:
        return self.glow.dim

    def get_config_dict(self) -> dict:
        return self.glow.config()

    def save(self, output_path: str, *args, **kwargs) -> None:
        from pathlib import Path

        self.glow.save(Path(output_path) / "model.safetensors")

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token=None, cache_folder=None, revision=None,
             local_files_only: bool = False, **kwargs) -> "Flow":
        path = cls.load_file_path(model_name_or_path, filename="model.safetensors", subfolder=subfolder, token=token,
                                  cache_folder=cache_folder, revision=revision, local_files_only=local_files_only)
        return cls(Glow.load(path))


class FirstLastAvgPooling(Module):
    """first-last-avg pooling (BERT-whitening's and BERT-flow's; ``SentenceEncoder`` pooling
    ``first-last-avg``): the mean over the real tokens of the first transformer layer's output and
    of the last layer's, averaged. Its directory holds ``config.json`` only (no weights)."""

    config_keys: list[str] = ["embedding_dimension"]

    def __init__(self, embedding_dimension: int):
        super().__init__()
        self.embedding_dimension = embedding_dimension

    def forward(self, features: dict) -> dict:
        layers = features.get("all_layer_embeddings")
        if layers is None or len(layers) < 2:
            raise ValueError("first-last-avg pooling needs every layer's output: the Transformer module must be "
                             "loaded with config_args {'output_hidden_states': True} (sentence_bert_config.json)")
        mask = features["attention_mask"].unsqueeze(-1).to(layers[-1].dtype)

        def mean(hidden):
            return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)

        features["sentence_embedding"] = (mean(layers[1]) + mean(layers[-1])) / 2
        return features

    def get_sentence_embedding_dimension(self) -> int:
        return self.embedding_dimension

    def get_embedding_dimension(self) -> int:
        return self.embedding_dimension

    def save(self, output_path: str, *args, **kwargs) -> None:
        self.save_config(output_path)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token=None, cache_folder=None, revision=None,
             local_files_only: bool = False, **kwargs) -> "FirstLastAvgPooling":
        config = cls.load_config(model_name_or_path=model_name_or_path, subfolder=subfolder, token=token,
                                 cache_folder=cache_folder, revision=revision, local_files_only=local_files_only)
        return cls(**config)
