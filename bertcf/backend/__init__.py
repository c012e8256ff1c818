"""What a trained encoder runs in besides PyTorch: ONNX Runtime. ``onnx_export`` writes the encoder
as one ONNX graph (and its int8 copy); ``onnx_runtime`` (``OnnxEncoder``) runs an export with
onnxruntime, numpy and tokenizers alone: every export carries a copy of it. ``is_onnx_export`` and
``load_onnx`` serve the commands that take an export where a checkpoint may be given."""
from pathlib import Path


def is_onnx_export(path) -> bool:
    """Whether ``path`` is a directory written by ``bertcf-export onnx`` (it holds onnx_encoder.json)."""
    from .onnx_runtime import CONFIG_FILE
    return (Path(path) / CONFIG_FILE).is_file()


def load_onnx(path, quantized: bool = False, threads: int | None = None):
    """``OnnxEncoder`` on the export in ``path`` (``quantized``: its int8 graph; ``threads``: ONNX
    Runtime's intra-op threads); an export that cannot be loaded is a CheckpointError (one line,
    exit status 2)."""
    from minbert import CheckpointError

    from .onnx_runtime import OnnxEncoder, OnnxModelError
    try:
        return OnnxEncoder(path, quantized=quantized, threads=threads)
    except OnnxModelError as e:
        raise CheckpointError(str(e)) from None
