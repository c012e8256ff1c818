"""Knowledge distillation: a student encoder trained to give a teacher's sentence vectors."""
from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data.pairs import read_parallel
from ..errors import UsageError
from ..models.encoder import SentenceEncoder
from ..runs import resolve_encoder_path
from ..utils import progress
from ..utils.distributed import dist_info
from ..utils.files import save_tensors_atomic
from ..data.examples import Examples
from .settings import MatryoshkaSettings
from .supervised import Supervised

CACHE_VERSION = "1"  # part of every cache key: bump it when what a cached file holds changes
TEACHER_BATCH = 64


def _fingerprint(teacher: str) -> str:
    """What identifies the teacher: the content of every file of its directory (a run directory's
    best/), or its name when it is not a local directory (a Hugging Face hub name)."""
    path = Path(resolve_encoder_path(teacher))
    digest = hashlib.sha256()
    if not path.is_dir():
        digest.update(str(teacher).encode())
        return digest.hexdigest()
    for f in sorted(p for p in path.rglob("*") if p.is_file() and p.name != "README.md"):
        digest.update(str(f.relative_to(path)).encode() + b"\0")
        with open(f, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def cache_key(teacher: str, sentences: list[str], precision: str | None) -> str:
    """sha256 of the teacher (its files), the sentences (in order) and the precision it encodes in."""
    digest = hashlib.sha256(f"{CACHE_VERSION}\0{_fingerprint(teacher)}\0{precision}\0".encode())
    for s in sentences:
        digest.update(s.encode() + b"\n")
    return digest.hexdigest()


def _read_cache(path: Path, key: str, n: int) -> torch.Tensor | None:
    """The cached vectors [n, D'], or None when the file is absent, unreadable or not this key's."""
    from safetensors import safe_open
    try:
        with safe_open(str(path), framework="pt") as f:
            if (f.metadata() or {}).get("key") != key:
                return None
            vectors = f.get_tensor("embeddings")
    except Exception:  # absent, truncated (a killed writer leaves none: the writes are atomic), corrupt
        return None
    return vectors if vectors.ndim == 2 and vectors.shape[0] == n else None


def teacher_embeddings(teacher: str, sentences: list[str], cache_dir, device="cpu", precision: str | None = None,
                       show_progress: bool = False) -> torch.Tensor:
    """The teacher's vectors of ``sentences`` [n, D'] float32 (its ``encode``: its pooling, flow,
    linear head and normalisation, whole sentences up to its own max length), computed once and
    kept in ``cache_dir/teacher-<key>.safetensors`` (``cache_key``; written atomically), which
    any later run with the same teacher, sentences and precision reads instead. Under
    torch.distributed rank 0 computes them and the other ranks read its file."""
    key = cache_key(teacher, sentences, precision)
    path = Path(cache_dir) / f"teacher-{key[:24]}.safetensors"
    rank, world = dist_info()
    vectors = _read_cache(path, key, len(sentences))
    if vectors is None and rank == 0:
        print(f"distill: the teacher's vectors of {len(sentences):,} sentences ({teacher}), once, into {path}",
              file=sys.stderr, flush=True)
        started = time.perf_counter()
        encoder = SentenceEncoder.from_pretrained(teacher).to(device)
        encoder.precision = precision
        vectors = encoder.encode(sentences, batch_size=TEACHER_BATCH, show_progress_bar=show_progress)
        save_tensors_atomic(path, {"embeddings": vectors},
                            {"key": key, "teacher": str(teacher), "sentences": str(len(sentences))})
        print(f"distill: {tuple(vectors.shape)} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        del encoder
    if world > 1:
        torch.distributed.barrier()
        vectors = vectors if vectors is not None else _read_cache(path, key, len(sentences))
    if vectors is None or not torch.isfinite(vectors).all():
        raise UsageError(f"distill: the teacher's vectors in {path} are missing or not finite")
    return vectors


class Distill(Supervised):
    """Knowledge distillation of sentence embeddings (Reimers & Gurevych 2020, "Making Monolingual
    Sentence Embeddings Multilingual using Knowledge Distillation", EMNLP, section 2).

    Inputs: sentences s (one column: the corpus, or one sentence a line of --train-file) or
    parallel pairs (s, t) (``source<TAB>target`` lines: a sentence and its translation), and the
    teacher's vectors T(s) [b, D'] of the sources, computed once for the whole training set before
    training (``teacher_embeddings``; cached on disk). The student f is the encoder, followed by its
    linear head P (``SentenceEncoder.dense``: D -> D', created when the widths differ, and saved
    with the student as a sentence-transformers Dense module; none when they agree):

        loss = mean over the columns c in (s[, t]) of MSE(P f(c), T(s)),

    MSE the mean over the b rows and D' dimensions, as sentence-transformers' MSELoss; with one
    column, loss = MSE(P f(s), T(s)): the teacher distilled into the student. ``width``: D' (default:
    the student's own output width); ``columns``: 1 (sentences) or 2 (parallel pairs). Settings:
    ``MatryoshkaSettings`` (the teacher's vectors cut to each width, as sentence-transformers').
    """

    uses_dense = True  # the projection is trained here, and part of the student
    SETTINGS = (MatryoshkaSettings,)

    def __init__(self, encoder, *, width: int | None = None, columns: int = 1, **settings):
        super().__init__(encoder, **settings)
        width = width or encoder.output_dim
        if encoder.dense is not None and encoder.dense.out_features != width:
            raise UsageError(f"distill: the student's linear head gives {encoder.dense.out_features} dimensions, the "
                             f"teacher's vectors {width}")
        if encoder.dense is None and encoder.dim != width:
            encoder.dense = nn.Linear(encoder.dim, width)  # PyTorch's initialisation, as sentence-transformers' Dense
        self.columns = columns
        self.matryoshka_widths(width)

    @classmethod
    def reads_corpus(cls, config) -> bool:
        return not config.train_file

    @classmethod
    def from_examples(cls, examples: Examples) -> dict:
        return {"width": examples.labels.shape[1], "columns": len(examples.columns)}

    @classmethod
    def read_examples(cls, config, corpus) -> Examples:
        files = config.train_file
        if files:
            read = [read_parallel(f) for f in files]
            if len({targets is None for _, targets in read}) > 1:
                raise UsageError("distill: the --train-file files mix source<TAB>target lines with one sentence a line")
            columns = [[s for sources, _ in read for s in sources]]
            if read[0][1] is not None:
                columns.append([t for _, targets in read for t in targets])
            what = f"from {', '.join(map(str, files))}"
        else:
            columns, what = [corpus()], "of the corpus"
        cache = config.teacher_cache or Path(config.out_dir) / "teacher"
        show = progress.resolve(config.progress) == "bar"
        vectors = teacher_embeddings(config.teacher, columns[0], cache, config.device, config.precision, show)
        kind = "parallel pairs" if len(columns) == 2 else "sentences"
        return Examples(columns, vectors, (), f"{len(columns[0]):,} {kind} {what}, with the teacher's "
                                              f"{vectors.shape[1]}-dimensional vectors ({config.teacher})")

    def student(self, u) -> torch.Tensor:
        """P f(x): the student's vectors [b, D'] in float32 (its linear head, when it has one)."""
        if self.encoder.dense is None:
            return u.float()
        with torch.autocast(device_type=u.device.type, enabled=False):
            return self.encoder.dense(u.float())

    def loss(self, ids, mask, special, rank=0, world=1, labels=None):
        if labels is None:
            raise UsageError("distill needs the teacher's vectors (labels)")
        target = self.local_labels(labels, ids.shape[0] // self.columns, rank, world).float()
        students = [self.student(u) for u in self.column_embeddings(ids, mask, self.columns, rank, world)]
        loss = self.at_widths(lambda s, t: torch.stack([F.mse_loss(c, t) for c in s]).mean(), students, target)
        with torch.no_grad():
            scalars = {"mse_source": F.mse_loss(students[0], target),
                       "teacher_cosine": F.cosine_similarity(students[0], target).mean()}
            if len(students) == 2:
                scalars["mse_target"] = F.mse_loss(students[1], target)
        return loss, scalars
