"""What a trained encoder runs in besides PyTorch: ONNX Runtime. ``onnx_export`` writes the encoder
as one ONNX graph (and its int8 copy); ``onnx_runtime`` (``OnnxEncoder``) runs an export with
onnxruntime, numpy and tokenizers alone: every export carries a copy of it."""
