"""The two implementations the benchmark times, with the same config and weights: minBERT and
``transformers.BertModel`` (sdpa attention), each behind minBERT's call (:class:`Encoder`)."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

#: --tiny: small enough for a test on a laptop CPU.
TINY_CONFIG = dict(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=64, max_position_embeddings=512)

#: Hub names whose config is known, so the bench runs offline with random weights.
KNOWN_CONFIGS = {
    "bert-base-uncased": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "bert-base-cased": dict(vocab_size=28996, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                            intermediate_size=3072),
    "bert-large-uncased": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                               intermediate_size=4096),
}


def load_models(model: str | None, tiny: bool = False, seed: int = 11711):
    """(minBERT, transformers.BertModel with sdpa attention, note): identical config and weights."""
    import transformers

    from minbert import BertConfig, BertModel, CheckpointError
    from minbert.model import has_weights

    torch.manual_seed(seed)
    note = ""
    if tiny:
        mb, note = BertModel(BertConfig(**TINY_CONFIG)), "tiny config, random weights"
    else:
        path = Path(model)
        config_file = path if path.is_file() else path / "config.json"
        if path.is_dir() and has_weights(path):
            mb, note = BertModel.from_pretrained(path), "checkpoint weights"
        elif config_file.is_file():
            mb, note = BertModel(BertConfig.from_json_file(config_file)), "config only, random weights"
        else:
            try:
                mb, note = BertModel.from_pretrained(model), "checkpoint weights"
            except CheckpointError as e:
                if model not in KNOWN_CONFIGS:
                    raise
                mb = BertModel(BertConfig(**KNOWN_CONFIGS[model]))
                note = f"{model} not available offline ({e}); its config with random weights"
    hf_config = transformers.BertConfig.from_dict(mb.config.to_dict())
    hf_config._attn_implementation = "sdpa"
    hf = transformers.BertModel(hf_config, add_pooling_layer=True)
    hf.load_state_dict(mb.state_dict(), strict=True)
    return mb, hf, note


class Encoder(nn.Module):
    """Either implementation behind minBERT's call, ``(input_ids, attention_mask,
    token_type_ids=None, num_tokens=None) -> {'last_hidden_state': [b, t, D]}``, so that every
    workload (and :class:`bertcf.multitask.model.MultitaskModel`) runs the same code on both.

    ``compile_``: minBERT compiles layer by layer (:meth:`minbert.BertModel.compile`),
    transformers as a whole model, both with ``dynamic=True`` (the batch shapes change from
    step to step). ``unpad=False`` makes minBERT compute the padding too, as transformers does."""

    def __init__(self, model, compile_: bool = False, unpad: bool = True):
        super().__init__()
        self.is_minbert = model.__class__.__module__.startswith("minbert")
        self.config, self.unpad = model.config, unpad
        if compile_ and self.is_minbert:
            model.compile_layers()
        self.call = torch.compile(model, dynamic=True) if compile_ and not self.is_minbert else model

    @property
    def embeddings(self):
        """The word, position and token-type embeddings (both name them alike): SMART perturbs the words'."""
        return getattr(self.call, "_orig_mod", self.call).embeddings  # under torch.compile too

    def forward(self, input_ids, attention_mask, token_type_ids=None, num_tokens=None, inputs_embeds=None):
        if self.is_minbert:
            return self.call(input_ids, attention_mask, token_type_ids, num_tokens=num_tokens, unpad=self.unpad,
                             inputs_embeds=inputs_embeds)
        ids = None if inputs_embeds is not None else input_ids  # transformers takes one or the other
        out = self.call(input_ids=ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                        inputs_embeds=inputs_embeds)
        return {"last_hidden_state": out.last_hidden_state}
