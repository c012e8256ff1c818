"""The sentence-transformers layout of a checkpoint directory, written beside the Hugging Face
files and read back: ``modules.json`` (Transformer, Pooling, then the flow, the linear head and
Normalize when there are), ``sentence_bert_config.json`` (max_seq_length), ``1_Pooling/config.json``
(mean or [CLS]; first-last-avg, which sentence-transformers' Pooling cannot express, is the module
``bertcf_st.FirstLastAvgPooling`` of the checkpoint's own code below, fed every layer's output by
``config_args`` in sentence_bert_config.json); with a flow, ``2_Flow/`` (its weights); with either,
the modules' code: ``bertcf_st.py`` and ``flow.py``, copies of ``bertcf/models/st_flow.py`` and
``bertcf/models/flow.py``, which sentence-transformers loads from the directory itself with
``trust_remote_code=True`` (modules ``bertcf_st.Flow``, ``bertcf_st.FirstLastAvgPooling``), so
a shared checkpoint works without BERT-CF installed; with a linear head (``SentenceEncoder.dense``),
sentence-transformers' own Dense module with the identity activation (``N_Dense/``: config.json and
model.safetensors with ``linear.weight`` [out, in] and ``linear.bias`` [out]), which needs no
remote code. No sentence-transformers import here: writing and reading are plain files.

    python -m bertcf.st_format upgrade DIR    # a checkpoint written before: add the code files
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from minbert import CheckpointError

from ..utils.files import save_tensors_atomic, write_json_atomic, write_text_atomic

MODULES_FILE = "modules.json"
ST_CONFIG_FILE = "sentence_bert_config.json"
FLOW_MODULE = "bertcf_st.Flow"        # loaded from the checkpoint's own bertcf_st.py
OLD_FLOW_MODULE = "bertcf.st.Flow"    # checkpoints written before 2026-11-24: BERT-CF must be installed
#: The flow module's code a checkpoint carries: its name there -> the file beside this one.
FLOW_CODE = {"bertcf_st.py": "st_flow.py", "flow.py": "flow.py"}
POOLING_MODES = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token"}
#: first-last-avg, which sentence-transformers' Pooling cannot express: a module of the checkpoint's own
#: code (bertcf_st.py), which reads every layer's output (the Transformer's config_args ask for them).
FIRST_LAST_AVG_MODULE = "bertcf_st.FirstLastAvgPooling"
DENSE_MODULE = "sentence_transformers.models.Dense"
#: The names of the identity activation a Dense config may give (what sentence-transformers writes for
#: nn.Identity, and the public name); any other activation is not a linear head.
IDENTITY = ("torch.nn.modules.linear.Identity", "torch.nn.Identity")
DENSE_WEIGHTS = "model.safetensors"
_OTHER_POOLING_MODES = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                        "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")


def write(directory, dim: int, pooling: str, max_length: int, flow_file=None, normalize: bool = False,
          dense=None) -> None:
    """Write the layout into ``directory`` (which holds the Hugging Face files already).
    ``flow_file``: the flow's safetensors file in ``directory``, hard-linked (or copied) as the
    flow module's weights; ``dense``: the encoder's linear head (an ``nn.Linear``), written as a
    Dense module after the flow."""
    directory = Path(directory)
    custom_pooling = pooling not in POOLING_MODES
    modules = [("", "sentence_transformers.models.Transformer"),
               ("1_Pooling", FIRST_LAST_AVG_MODULE if custom_pooling else "sentence_transformers.models.Pooling")]
    if custom_pooling:
        pooling_config = {"embedding_dimension": dim}
    else:
        pooling_config = {"word_embedding_dimension": dim, "include_prompt": True}
        pooling_config |= {key: mode == pooling for mode, key in POOLING_MODES.items()} | dict.fromkeys(
            _OTHER_POOLING_MODES, False)
    write_json_atomic(directory / "1_Pooling" / "config.json", pooling_config)
    if flow_file is not None or custom_pooling:
        write_flow_code(directory)
    else:
        for name in FLOW_CODE:
            (directory / name).unlink(missing_ok=True)
    if flow_file is not None:
        flow_dir = directory / f"{len(modules)}_Flow"
        flow_dir.mkdir(exist_ok=True)
        target = flow_dir / "model.safetensors"
        target.unlink(missing_ok=True)
        try:
            os.link(flow_file, target)
        except OSError:
            shutil.copyfile(flow_file, target)
        modules.append((flow_dir.name, FLOW_MODULE))
    if dense is not None:
        dense_dir = f"{len(modules)}_Dense"
        write_dense(directory / dense_dir, dense)
        modules.append((dense_dir, DENSE_MODULE))
    if normalize:
        normalize_dir = f"{len(modules)}_Normalize"
        write_json_atomic(directory / normalize_dir / "config.json", {"module_input_name": "sentence_embedding",
                                                                      "module_output_name": "sentence_embedding"})
        modules.append((normalize_dir, "sentence_transformers.models.Normalize"))
    write_json_atomic(directory / MODULES_FILE, [{"idx": i, "name": str(i), "path": path, "type": kind}
                                                 for i, (path, kind) in enumerate(modules)])
    st_config = {"max_seq_length": max_length, "do_lower_case": False}
    if custom_pooling:  # the pooling module reads every layer (config_args: the name every release reads)
        st_config["config_args"] = {"output_hidden_states": True}
    write_json_atomic(directory / ST_CONFIG_FILE, st_config)


def needs_remote_code(directory) -> bool:
    """Whether a checkpoint's sentence-transformers modules include its own code (bertcf_st.*: the
    flow, first-last-avg pooling), so that loading it needs ``trust_remote_code=True``."""
    path = Path(directory) / MODULES_FILE
    return path.is_file() and any(str(m.get("type", "")).startswith(("bertcf_st.", "bertcf.st."))
                                  for m in _read_json(path))


def write_dense(directory, linear) -> None:
    """An ``nn.Linear`` as sentence-transformers' Dense module in ``directory``: the config its
    ``Dense.load`` reads (identity activation) and ``model.safetensors`` with ``linear.weight``
    and, when it has one, ``linear.bias``, float32."""
    directory = Path(directory)
    config = {"in_features": linear.in_features, "out_features": linear.out_features,
              "bias": linear.bias is not None, "activation_function": IDENTITY[0],
              "module_input_name": "sentence_embedding", "module_output_name": "sentence_embedding"}
    tensors = {"linear.weight": linear.weight.detach().float()}
    if linear.bias is not None:
        tensors["linear.bias"] = linear.bias.detach().float()
    save_tensors_atomic(directory / DENSE_WEIGHTS, tensors)
    write_json_atomic(directory / "config.json", config)


def read_dense(directory, in_features: int):
    """The ``nn.Linear`` of a Dense module directory that ``read`` accepted (its config is checked
    there); ``in_features``: the width of the vector it is applied to. CheckpointError when the
    weights are missing, corrupt or of another shape."""
    import torch
    from safetensors.torch import load_file

    directory = Path(directory)
    config = _read_json(directory / "config.json")
    rows, columns, bias = int(config["out_features"]), int(config["in_features"]), bool(config.get("bias", True))
    if columns != in_features:
        raise CheckpointError(f"{directory}: a Dense of {columns} inputs cannot follow a {in_features}-dimensional "
                              f"sentence vector")
    weights = directory / DENSE_WEIGHTS
    if not weights.is_file() and (directory / "pytorch_model.bin").is_file():  # sentence-transformers before 3
        weights = directory / "pytorch_model.bin"
    try:
        tensors = load_file(str(weights)) if weights.suffix == ".safetensors" else torch.load(
            weights, map_location="cpu", weights_only=True)
    except Exception as e:  # missing, truncated, not a weights file
        raise CheckpointError(f"{weights} is missing, truncated or corrupt ({type(e).__name__})") from None
    expected = {"linear.weight": (rows, columns)} | ({"linear.bias": (rows,)} if bias else {})
    found = {k: tuple(v.shape) for k, v in tensors.items()}
    if found != expected:
        raise CheckpointError(f"{weights} holds {found}, not the {expected} of its config.json")
    linear = torch.nn.Linear(columns, rows, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(tensors["linear.weight"].float())
        if bias:
            linear.bias.copy_(tensors["linear.bias"].float())
    return linear


def _dense_config(config_path: Path) -> None:
    """CheckpointError unless a Dense module's config is a linear head: identity activation (a
    config without one gets sentence-transformers' default, Tanh), no residual, on the sentence
    embedding."""
    config = _read_json(config_path)
    activation = config.get("activation_function", "torch.nn.modules.activation.Tanh (the default)")
    if activation not in IDENTITY:
        raise CheckpointError(f"{config_path}: a Dense with activation {activation} cannot be represented by a "
                              f"SentenceEncoder (its linear head has none: {IDENTITY[0]})")
    if config.get("use_residual"):
        raise CheckpointError(f"{config_path}: a Dense with a residual connection cannot be represented by a "
                              f"SentenceEncoder")
    names = {config.get(k, "sentence_embedding") or "sentence_embedding" for k in ("module_input_name",
                                                                                    "module_output_name")}
    if names != {"sentence_embedding"} or not {"in_features", "out_features"} <= set(config):
        raise CheckpointError(f"{config_path}: a Dense that does not map the sentence embedding to itself "
                              f"(or has no in_features/out_features) cannot be represented by a SentenceEncoder")


def write_flow_code(directory) -> None:
    """Copy the flow module's code (``FLOW_CODE``) into a checkpoint directory."""
    here = Path(__file__).parent
    for name, source in FLOW_CODE.items():
        write_text_atomic(Path(directory) / name, (here / source).read_text(encoding="utf-8"))


def upgrade(directory) -> bool:
    """Give a checkpoint written before (modules.json naming ``bertcf.st.Flow``) the flow module's
    code, so it loads without BERT-CF. The code files come first and modules.json is replaced in
    one rename, so an interrupted upgrade leaves the old checkpoint or the new one. Returns whether
    anything changed (False: no flow, or already upgraded)."""
    directory = Path(directory)
    path = directory / MODULES_FILE
    if not path.is_file():
        raise CheckpointError(f"{directory} has no {MODULES_FILE}: not a checkpoint written by BERT-CF")
    modules = _read_json(path)
    if not any(m.get("type") == OLD_FLOW_MODULE for m in modules):
        return False
    write_flow_code(directory)
    write_json_atomic(path, [m | {"type": FLOW_MODULE} if m.get("type") == OLD_FLOW_MODULE else m for m in modules])
    return True


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not a readable JSON file ({type(e).__name__})") from None


def read(directory) -> dict | None:
    """What a sentence-transformers directory says the encoder is: {"pooling", "max_length",
    "normalize", "flow", "dense"} (flow: the flow module's weights file or None; dense: the Dense
    module's directory or None, for ``read_dense``), or None when there is no ``modules.json``. A
    module the SentenceEncoder cannot represent (or in an order it cannot: it applies the flow,
    then the linear head, then Normalize) is a CheckpointError naming it."""
    directory = Path(directory)
    if not (directory / MODULES_FILE).is_file():
        return None
    out = {"pooling": None, "max_length": None, "normalize": False, "flow": None, "dense": None}
    for module in _read_json(directory / MODULES_FILE):
        kind, path = module.get("type", ""), directory / module.get("path", "")
        name = kind.rsplit(".", 1)[-1]
        if out["normalize"]:  # the encoder normalises last, after pooling and the flow
            raise CheckpointError(f"{directory / MODULES_FILE}: module {kind!r} after Normalize cannot be represented "
                                  f"by a SentenceEncoder (it normalises last)")
        if kind in (FLOW_MODULE, OLD_FLOW_MODULE):
            if out["dense"] is not None:
                raise CheckpointError(f"{directory / MODULES_FILE}: a flow after a Dense module cannot be represented "
                                      f"by a SentenceEncoder (it applies its linear head after the flow)")
            out["flow"] = path / "model.safetensors"
        elif kind.startswith("sentence_transformers.") and name == "Dense":
            if out["dense"] is not None:
                raise CheckpointError(f"{directory / MODULES_FILE}: two Dense modules cannot be represented by a "
                                      f"SentenceEncoder (it has one linear head)")
            _dense_config(path / "config.json")
            out["dense"] = path
        elif kind.startswith("sentence_transformers.") and name == "Transformer":
            if path != directory:
                raise CheckpointError(f"{directory / MODULES_FILE}: the Transformer module must be the directory "
                                      f"itself, not {module.get('path')!r}")
        elif kind.startswith("sentence_transformers.") and name == "Pooling":
            out["pooling"] = _pooling(path / "config.json")
        elif kind == FIRST_LAST_AVG_MODULE:
            out["pooling"] = "first-last-avg"
        elif kind.startswith("sentence_transformers.") and name == "Normalize":
            out["normalize"] = True
        else:
            raise CheckpointError(f"{directory / MODULES_FILE}: module {kind!r} ({module.get('path')}) cannot be "
                                  f"represented by a SentenceEncoder (Transformer, mean or [CLS] Pooling, "
                                  f"bertcf's first-last-avg pooling and flow, a Dense without activation and "
                                  f"Normalize can)")
    out["max_length"] = _max_length(directory)
    return out


def _max_length(directory: Path) -> int | None:
    """max_seq_length: in sentence_bert_config.json (before sentence-transformers 6), else the
    tokenizer's model_max_length (where 6 keeps it; a huge number there means none is set)."""
    if (directory / ST_CONFIG_FILE).is_file():
        length = _read_json(directory / ST_CONFIG_FILE).get("max_seq_length")
        if length is not None:
            return int(length)
    if (directory / "tokenizer_config.json").is_file():
        length = _read_json(directory / "tokenizer_config.json").get("model_max_length")
        if isinstance(length, int) and length < 1_000_000:
            return length
    return None


def _pooling(config_path: Path) -> str:
    """mean or cls, from a Pooling module's config: {"pooling_mode": ...} (sentence-transformers 6)
    or one true "pooling_mode_*" flag (before)."""
    config = _read_json(config_path)
    modes = [config["pooling_mode"]] if "pooling_mode" in config else [
        key for key, value in config.items() if key.startswith("pooling_mode_") and value]
    chosen = [mode for mode, key in POOLING_MODES.items() if modes in ([key], [mode])]
    if not chosen:
        raise CheckpointError(f"{config_path}: pooling {', '.join(map(str, modes)) or 'none'} cannot be represented "
                              f"by a SentenceEncoder (mean or [CLS] pooling can)")
    return chosen[0]
