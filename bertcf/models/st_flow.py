"""BERT-CF's flow as a sentence-transformers module, so that ``SentenceTransformer(checkpoint,
trust_remote_code=True)`` returns F(x) = g^{-1}(f(x)), the vectors ``SentenceEncoder.encode`` returns.

This file and ``flow.py`` need torch, safetensors and sentence-transformers only: a checkpoint with
a flow carries copies of both (``bertcf_st.py`` and ``flow.py``) and its ``modules.json`` names
the module ``bertcf_st.Flow``, which sentence-transformers loads from the checkpoint itself, so the
model works where BERT-CF is not installed (``bertcf.st_format``). Checkpoints written before
name ``bertcf.st.Flow`` and load where BERT-CF is installed; ``python -m bertcf.st_format upgrade
DIR`` gives them the files.

    Flow.forward(features) maps features["sentence_embedding"] [b, D] through the Glow flow.
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
