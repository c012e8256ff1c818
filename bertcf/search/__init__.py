"""Quantised sentence vectors and approximate-nearest-neighbour search over them.

- :mod:`.quantization`: int8, uint8, binary and ubinary vectors as sentence-transformers'
  ``quantize_embeddings`` computes them, in numpy alone (a copy ships with every ONNX export);
- :mod:`.index`: ``VectorIndex``, a faiss index of one of four kinds (exact float32, HNSW float32,
  int8 HNSW, binary), with sentence-transformers' float rescoring of the quantised kinds;
- :mod:`.store`: an index on disk, built from a corpus's vectors a chunk at a time, and read back.

The command is ``python -m bertcf.search build | query`` (:mod:`bertcf.commands.search`). Importing
this package imports nothing (neither torch nor faiss, an optional extra: ``pip install
'bertcf[search]'``).
"""
