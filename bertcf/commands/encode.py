"""The encoding command: the sentences of a file to a .npy of vectors, one row per sentence.

    bertcf-encode --model DIR --input FILE --output FILE.npy [--backend auto|torch|onnx] [--batch-size N]
                  [--column NAME] [--quantized] [--device D] [--precision fp32|bf16|fp16] [--threads N] [--max-length N]
                  [--embedding-precision float32|int8|uint8|binary|ubinary] [--calibration FILE]

FILE is a text file (one sentence a line; row i of the output is line i + 1, blank lines included)
or, with ``--column``, a CSV or TSV file with a header (the delimiter is a tab when the header has
one, as in the CS224N files, else a comma). The sentences are encoded longest first (less padding)
and each batch's vectors written to their input rows of a memory-mapped .npy, so an input larger
than memory's worth of vectors works; the file is written under a temporary name and renamed
when complete. ``--backend onnx`` (``auto`` picks it for a directory written by ``bertcf-export
onnx``) runs the export under ONNX Runtime (``bertcf.backend.onnx_runtime.OnnxEncoder``); ``torch``, the
checkpoint under PyTorch (``SentenceEncoder``), on a GPU in bf16 autocast unless ``--precision fp32``
(the summary line names the backend and its precision). Both return the model's vectors (unit vectors
when it normalises), in float32.

``--embedding-precision`` writes the vectors quantised (``bertcf.search.quantization``, equal to
sentence-transformers' ``quantize_embeddings``): int8 or uint8 [sentences, dim], each dimension's
range cut into 256 steps, or binary (int8) or ubinary (uint8) [sentences, ceil(dim / 8)], one bit
a dimension. int8's ranges are those of the vectors of ``--calibration``'s sentences, else of the
vectors themselves (then every vector is first written in float32 beside the output, under a
temporary name, and read back a chunk at a time); they are written beside the output as
``NAME.ranges.npy`` ([2, dim]: each dimension's min and max), which quantises queries alike.
"""
from __future__ import annotations

import csv
import os
import time
from pathlib import Path

import numpy as np

from ..cli import AT_LEAST_1, ArgumentParser, check_truncate_dim, run_main
from ..errors import DataError, UsageError
from ..search import quantization
from ..utils import progress
from ..utils.files import atomic_path

CHUNK = 65_536  # rows read back at a time to quantise the staged float32 vectors

BACKENDS = ("auto", "torch", "onnx")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m bertcf.encode", description="Encode the sentences of a file to a .npy of vectors.")
    p.add_argument("--model", required=True,
                   help="a checkpoint or run directory (torch), or a directory written by bertcf-export onnx (onnx)")
    p.add_argument("--input", required=True, help="a text file (one sentence a line), or a CSV/TSV file with --column")
    p.add_argument("--output", required=True, help="the .npy file to write: float32 [sentences, dim], input order")
    p.add_argument("--column", default=None, help="the CSV/TSV column that holds the sentences")
    add_backend_flags(p, "--model", calibration=("int8/uint8", "the vectors themselves"))
    p.add_argument("--max-length", type=AT_LEAST_1, default=None,
                   help="tokens per sentence after truncation (default: the model's max_length)")
    p.add_argument("--truncate-dim", type=AT_LEAST_1, default=None,
                   help="write each vector's first k dimensions, after the normalisation (a Matryoshka-trained "
                        "model's smaller widths; sentence-transformers' truncate_dim)")
    p.add_argument("--embedding-precision", choices=quantization.PRECISIONS, default="float32",
                   help="the vectors' precision: int8/uint8 (a byte a dimension) or binary/ubinary (a bit a dimension, "
                        "packed), as sentence-transformers' quantize_embeddings")
    p.add_argument("--progress", choices=progress.MODES, default="auto",
                   help="a tqdm bar (on a terminal, with auto), plain lines (in a log file, with auto), or none")
    return p


def add_backend_flags(p: ArgumentParser, model_flag: str, calibration: tuple[str, str] | None = None) -> None:
    """The flags of how the model runs, which bertcf-encode and python -m bertcf.search share
    (``model_flag``: the flag that names the model); ``calibration``: (the precisions it serves,
    what sets their ranges without it) for a --calibration flag, None for none."""
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help=f"onnx: ONNX Runtime on an export; torch: PyTorch on a checkpoint; auto: onnx when "
                        f"{model_flag} is an export")
    p.add_argument("--quantized", action="store_true", help="onnx: the int8 graph (an export made with --quantize int8)")
    p.add_argument("--batch-size", type=AT_LEAST_1, default=64, help="texts encoded at once")
    p.add_argument("--device", default=None, help="torch: cpu, cuda, cuda:N (default: cuda when available)")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default=None,
                   help="torch: the autocast precision of the encoder (default: bf16 on a GPU that has it, else fp32); "
                        "the vectors are float32 either way")
    p.add_argument("--threads", type=AT_LEAST_1, default=None,
                   help="CPU threads (torch.set_num_threads; ONNX Runtime's intra-op threads; faiss's, in python -m "
                        "bertcf.search) (default: the libraries')")
    if calibration is not None:
        precisions, default = calibration
        p.add_argument("--calibration", default=None, metavar="FILE",
                       help=f"{precisions}: a text file of sentences (one a line) whose vectors set each dimension's "
                            f"range (default: {default})")


def check_column(path: Path, column: str | None, flag: str) -> None:
    """Refuse, before the model loads, a CSV/TSV file without --column."""
    if column is None and path.suffix in (".csv", ".tsv"):
        raise UsageError(f"{flag} {path} is a {path.suffix[1:].upper()} file: give --column NAME")


def check_output(path: Path) -> None:
    """Refuse, before any work, an output that cannot be written: one line, exit status 2."""
    if path.suffix != ".npy":
        raise UsageError(f"--output {path}: give a .npy file name")
    if path.is_dir():
        raise UsageError(f"--output {path} is a directory; give a .npy file name")
    parent = next((p for p in path.absolute().parents if p.exists()), None)
    if parent is None or not parent.is_dir():
        raise UsageError(f"--output {path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--output {path}: cannot write in {parent} (permission denied)")


def read_sentences(path: Path, column: str | None, flag: str = "--input") -> list[str]:
    """The sentences of a text file (every line) or of a CSV/TSV ``column``, in file order
    (``flag``: the option that named the file, for the error lines)."""
    if not path.is_file():
        raise DataError(f"{flag} {path} not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{flag} {path} is not UTF-8 text (byte {e.start})") from None
    lines = text.splitlines()
    if column is None:
        sentences = lines
    else:
        header = lines[0] if lines else ""
        delimiter = "\t" if path.suffix == ".tsv" or "\t" in header else ","
        reader = csv.DictReader(lines, delimiter=delimiter)
        if column not in (reader.fieldnames or []):
            raise DataError(f"{flag} {path} has no column {column!r} (its columns: "
                            f"{', '.join(reader.fieldnames or []) or 'none'})")
        sentences = [row[column] or "" for row in reader]
    if not sentences:
        raise DataError(f"{flag} {path} holds no sentences" + (f" (no rows under {column!r})" if column else ""))
    return sentences


class Backend:
    """One interface over both encoders: ``tokenize(sentences)`` -> id lists, ``run(id lists)`` ->
    float32 [b, D] in the model's final form (unit vectors when it normalises), ``dim``, ``name``."""

    def __init__(self, model, backend: str, quantized: bool, threads: int | None, device: str | None,
                 max_length: int | None, truncate_dim: int | None = None, precision: str | None = None):
        from ..backend import is_onnx_export, load_onnx

        self.max_length = max_length
        if backend == "auto":
            backend = "onnx" if is_onnx_export(model) else "torch"
        if quantized and backend != "onnx":
            raise UsageError("--quantized runs the int8 ONNX graph: give --backend onnx and an export as --model")
        if backend == "onnx":
            if precision not in (None, "fp32"):
                raise UsageError(f"--precision {precision} is the torch backend's: the ONNX graphs run in fp32 "
                                 "(or int8 with --quantized)")
            self.name = "onnx int8" if quantized else "onnx fp32"
            self.onnx = load_onnx(model, quantized=quantized, threads=threads)
            self.dim = self.truncate(self.onnx.dim, truncate_dim)
            return
        import torch

        from ..models.encoder import SentenceEncoder
        from ..utils.precision import resolve_device, resolve_precision
        if threads:
            torch.set_num_threads(threads)
        device = resolve_device(device)
        self.onnx, self.torch = None, SentenceEncoder.from_pretrained(model).to(device).eval()
        self.torch.precision = resolve_precision(precision, device)  # what encode_ids autocasts to
        self.name = f"torch {self.torch.precision}"
        self.dim = self.truncate(self.torch.output_dim, truncate_dim)

    def truncate(self, width: int, truncate_dim: int | None) -> int:
        """The width of what ``run`` returns: ``truncate_dim`` when given (at most ``width``)."""
        check_truncate_dim(truncate_dim, width, self.name)
        return truncate_dim or width

    def tokenize(self, sentences: list[str]) -> list[list[int]]:
        if self.onnx is not None:
            return self.onnx.tokenize(sentences, self.max_length)
        return self.torch.token_ids(sentences, self.max_length)

    def run(self, id_lists) -> np.ndarray:
        if self.onnx is not None:
            return self.onnx.run(id_lists, self.onnx.normalize)[:, :self.dim]
        from torch.nn.functional import normalize
        vectors = self.torch.encode_ids(id_lists, batch_size=len(id_lists))
        return (normalize(vectors, dim=-1) if self.torch.normalize else vectors)[:, :self.dim].numpy()


def encoded_batches(backend: Backend, token_ids: list, batch_size: int, mode: str):
    """(input rows, their float32 vectors) a batch at a time, longest sentences first."""
    order = sorted(range(len(token_ids)), key=lambda i: -len(token_ids[i]))
    starts = range(0, len(order), batch_size)
    shown = progress.Progress(mode, "encode", total=len(starts))
    for step, start in enumerate(starts, start=1):
        rows = order[start:start + batch_size]
        yield rows, backend.run([token_ids[i] for i in rows])
        shown.step(step)
    shown.close()


def write_vectors(backend: Backend, token_ids: list, output: Path, batch_size: int, mode: str,
                  precision: str = "float32", ranges=None) -> np.ndarray | None:
    """Encode longest first, each batch's rows (in ``precision``, int8's ``ranges`` given) into a
    memory-mapped .npy renamed into place at the end. int8 without ``ranges``: the float32 vectors
    first, staged beside ``output``, then their ranges and codes a chunk at a time. Returns int8's ranges."""
    if quantization.is_scalar(precision) and ranges is None:
        staged = output.with_name(f".{output.name}.float32")
        try:
            write_vectors(backend, token_ids, staged, batch_size, mode)
            floats = np.load(staged, mmap_mode="r")
            for start in range(0, len(floats), CHUNK):
                ranges = quantization.merge_ranges(ranges, floats[start:start + CHUNK])
            with atomic_path(output) as tmp:
                codes = np.lib.format.open_memmap(tmp, mode="w+", dtype=quantization.DTYPES[precision],
                                                  shape=floats.shape)
                for start in range(0, len(floats), CHUNK):
                    codes[start:start + CHUNK] = quantization.quantize_embeddings(floats[start:start + CHUNK],
                                                                                  precision, ranges)
                codes.flush()
                del codes, floats
        finally:
            staged.unlink(missing_ok=True)
        return ranges
    shape = (len(token_ids), quantization.width(backend.dim, precision))
    with atomic_path(output) as tmp:
        vectors = np.lib.format.open_memmap(tmp, mode="w+", dtype=quantization.DTYPES[precision], shape=shape)
        for rows, batch in encoded_batches(backend, token_ids, batch_size, mode):
            vectors[rows] = quantization.quantize_embeddings(batch, precision, ranges)
        vectors.flush()
        del vectors
    return ranges


def encode_texts(backend: Backend, texts: list[str], batch_size: int) -> np.ndarray:
    """The float32 vectors [n, dim] of ``texts``, in input order (held in memory)."""
    token_ids = backend.tokenize(texts)
    vectors = np.empty((len(texts), backend.dim), dtype=np.float32)
    for rows, batch in encoded_batches(backend, token_ids, batch_size, "none"):
        vectors[rows] = batch
    return vectors


def calibration_vectors(backend: Backend, path: str | None, batch_size: int) -> np.ndarray | None:
    """The vectors of ``--calibration``'s sentences, which set int8's ranges (None without the flag)."""
    if path is None:
        return None
    vectors = encode_texts(backend, read_sentences(Path(path), None, "--calibration"), batch_size)
    if len(vectors) < 2:
        raise DataError(f"--calibration {path}: give at least two sentences (a range needs two vectors)")
    return vectors


def calibration_ranges(backend: Backend, path: str | None, batch_size: int) -> np.ndarray | None:
    """int8's ranges from the vectors of ``--calibration``'s sentences (None without the flag)."""
    vectors = calibration_vectors(backend, path, batch_size)
    return None if vectors is None else quantization.ranges_of(vectors)


def run(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    output, source = Path(args.output), Path(args.input)
    check_output(output)
    check_column(source, args.column, "--input")
    if args.calibration is not None and not quantization.is_scalar(args.embedding_precision):
        raise UsageError("--calibration sets int8's ranges: give --embedding-precision int8 or uint8")
    backend = Backend(args.model, args.backend, args.quantized, args.threads, args.device, args.max_length,
                      args.truncate_dim, args.precision)
    sentences = read_sentences(source, args.column)
    precision = args.embedding_precision
    if len(sentences) == 1 and quantization.is_scalar(precision) and args.calibration is None:
        raise UsageError(f"--embedding-precision {precision} of a single sentence: its ranges cannot come from "
                         f"its own vector; give --calibration FILE")
    start = time.perf_counter()
    ranges = calibration_ranges(backend, args.calibration, args.batch_size)
    ranges = write_vectors(backend, backend.tokenize(sentences), output, args.batch_size, args.progress, precision,
                           ranges)
    if ranges is not None:
        with atomic_path(ranges_file(output)) as tmp, open(tmp, "wb") as handle:
            np.save(handle, ranges)
    seconds = time.perf_counter() - start
    quantized = "" if precision == "float32" else f", {precision}" + (
        f", ranges in {ranges_file(output).name}" if ranges is not None else "")
    print(f"{output}: {len(sentences)} vectors of {backend.dim} dimensions ({backend.name}{quantized}, "
          f"{len(sentences) / seconds:,.0f} sentences/s)")
    return {"output": str(output), "sentences": len(sentences), "dim": backend.dim, "backend": backend.name,
            "embedding_precision": precision, "seconds": seconds}


def ranges_file(output: Path) -> Path:
    """Where int8's ranges go: vectors.npy -> vectors.ranges.npy."""
    return output.with_name(output.stem + ".ranges.npy")


def main(argv=None) -> int:
    return run_main(run, argv)
