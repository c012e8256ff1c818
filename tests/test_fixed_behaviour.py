"""A guard for refactorings: a 30-step mirror run of a fixed tiny model on a fixed corpus, on the
CPU with one thread and a fixed seed, must write bit-identical ``last/`` weights. The digest was
taken on main at c24a106, before the redesign of issue 18; a change of behaviour (another
random draw, another order of operations) changes it. A deliberate change of the mirror
objective must update the digest, saying why, in the same commit."""
from __future__ import annotations

import contextlib
import hashlib
import io
import random

import torch
import transformers
from conftest import TINY_BERT_CONFIG, synthetic_vocab
from safetensors.torch import load_file, save_file

from bertcf import pretrain

DIGEST = "5e5d24ad7d93c602720050ef590501af0aaf971bf8c0db2311e8b9f64de8f4ae"


def tensor_digest(path) -> str:
    """sha256 over the tensors of a safetensors file, in key order (names, dtypes, shapes, bytes)."""
    h = hashlib.sha256()
    for key, tensor in sorted(load_file(str(path)).items()):
        h.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        h.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def fixed_bert_dir(directory):
    """TINY_BERT_CONFIG over the synthetic vocabulary, every tensor drawn from one seeded generator
    (so the weights do not depend on how transformers initialises a model)."""
    vocab = directory / "vocab.txt"
    directory.mkdir(parents=True)
    vocab.write_text("\n".join(synthetic_vocab()) + "\n", encoding="utf-8")
    config = transformers.BertConfig(**TINY_BERT_CONFIG, vocab_size=len(synthetic_vocab()))
    model = transformers.BertModel(config)
    g = torch.Generator().manual_seed(0)
    state = {k: (torch.randn(v.shape, generator=g) * 0.05 + (1.0 if k.endswith("LayerNorm.weight") else 0.0))
             if v.is_floating_point() else v for k, v in model.state_dict().items()}
    model.save_pretrained(str(directory))
    save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    transformers.BertTokenizerFast(vocab=str(vocab), do_lower_case=True).save_pretrained(str(directory))
    return directory


def test_mirror_run_weights_are_unchanged(tmp_path):
    words = "the a man woman dog band plays runs on in park guitar piano red blue small big old young city".split()
    rng = random.Random(0)
    data = tmp_path / "data"
    data.mkdir()
    pairs = ["\tid\tsentence1\tsentence2\tsimilarity"]
    for i in range(8):
        s1, s2 = (" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))) for _ in range(2))
        pairs.append(f"{i}\tid{i}\t{s1}\t{s2}\t{rng.uniform(0, 5):.1f}")
    (data / "sts-dev.csv").write_text("\n".join(pairs) + "\n")
    (data / "corpus.txt").write_text("\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(6, 14)))
                                               for _ in range(64)) + "\n")
    bert = fixed_bert_dir(tmp_path / "bert")
    out = tmp_path / "run"
    argv = ["--model", str(bert), "--data-dir", str(data), "--corpus", str(data / "corpus.txt"),
            "--out-dir", str(out), "--steps", "30", "--batch-size", "8", "--max-length", "24",
            "--eval-every", "15", "--lr", "1e-3", "--device", "cpu", "--precision", "fp32"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            pretrain.main(argv)
    finally:
        torch.set_num_threads(threads)
    assert tensor_digest(out / "last" / "model.safetensors") == DIGEST
