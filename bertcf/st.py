"""BERT-CF's flow as a sentence-transformers module, so that ``SentenceTransformer(checkpoint)``
returns F(x) = g^{-1}(f(x)), the vectors ``SentenceEncoder.encode`` returns. A checkpoint's
``modules.json`` names it by its import path, ``bertcf.st.Flow`` (``bertcf.st_format``): where
bertcf cannot be imported, sentence-transformers fails to load the checkpoint, rather than
silently returning f(x).

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
