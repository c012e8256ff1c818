"""BERT-whitening (bertcf/models/whitening.py) against by-hand float64 computations (numpy's cov and
eigh) and scikit-learn's PCA(whiten=True): identity covariance and zero mean on the fitting set,
the k-dimensional truncation, the stored float32 head, and singular covariances without NaN."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import ST_SENTENCES, standalone_vectors
from sklearn.decomposition import PCA

from bertcf.models.whitening import fit_whitening


def anisotropic(n: int, d: int, seed: int = 0) -> torch.Tensor:
    """float32 vectors [n, d] with a large common offset and a spread of standard deviations over 4
    orders of magnitude, like a BERT encoder's (a cone far from the origin). The covariance's
    condition number is then 1e8: float64 results agree to about 1e-16 * 1e8 relative."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(1, -3, d, dtype=torch.float64)
    mixing = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
    z = torch.randn(n, d, generator=g, dtype=torch.float64) * scales
    return (z @ mixing + 5.0).float()


def by_hand(x: torch.Tensor, k: int):
    """numpy in float64: the mean, and the inverse covariance restricted to its top-k eigenvectors,
    U_k diag(1/lambda_k) U_k^T (independent of the eigenvectors' signs)."""
    x = x.double().numpy()
    values, vectors = np.linalg.eigh(np.cov(x.T))  # ascending
    top = np.argsort(values)[::-1][:k]
    return x.mean(0), vectors[:, top] @ np.diag(1 / values[top]) @ vectors[:, top].T


def test_whitened_fitting_set_has_zero_mean_and_identity_covariance():
    x = anisotropic(500, 12)
    w = fit_whitening(x)
    y = w(x).numpy()
    assert w.dim == 12 and w.rank == 12 and w.sentences == 500
    assert np.abs(y.mean(0)).max() < 1e-10
    assert np.abs(np.cov(y.T) - np.eye(12)).max() < 1e-7
    mean, inverse = by_hand(x, 12)
    assert np.allclose(w.mean.numpy(), mean, rtol=0, atol=1e-12)
    assert np.allclose((w.weight @ w.weight.T).numpy(), inverse, rtol=1e-6, atol=0)  # W W^T = Sigma^-1
    assert np.allclose(inverse, np.linalg.inv(np.cov(x.double().numpy().T)), rtol=1e-6)


@pytest.mark.parametrize("k", [1, 4, 7])
def test_the_first_k_directions_are_those_of_largest_variance(k):
    x = anisotropic(400, 10, seed=1)
    w, full = fit_whitening(x, dim=k), fit_whitening(x)
    y = w(x).numpy()
    assert y.shape == (400, k)
    assert np.abs(np.cov(y.T).reshape(k, k) - np.eye(k)).max() < 1e-7
    _, inverse_k = by_hand(x, k)
    assert np.allclose((w.weight @ w.weight.T).numpy(), inverse_k, rtol=1e-6, atol=1e-9)
    assert np.allclose(np.abs(y), np.abs(full(x).numpy()[:, :k]), atol=1e-7)  # a prefix of the full map
    assert torch.all(w.eigenvalues[:-1] >= w.eigenvalues[1:])
    # scikit-learn's PCA whitening (ddof 1): the same coordinates, up to each column's sign
    theirs = PCA(n_components=k, whiten=True, svd_solver="full").fit_transform(x.double().numpy())
    assert np.allclose(np.abs(y), np.abs(theirs), atol=1e-6)


def test_the_float32_head_removes_the_mean_and_whitens():
    x = anisotropic(300, 8, seed=2)
    w = fit_whitening(x, dim=6)
    head = w.linear()
    assert head.weight.dtype == torch.float32 and tuple(head.weight.shape) == (6, 8)
    assert torch.allclose(head.weight.double(), w.weight.T, rtol=1e-6, atol=0)
    assert torch.allclose(head.bias.double(), -w.mean @ w.weight, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        assert head(w.mean.float()).abs().max() < 1e-3  # the mean goes to 0 (float32 of a 5 + 1e-3 input)
        y = head(x).double()
    assert (y.mean(0)).abs().max() < 1e-3
    assert (torch.cov(y.T) - torch.eye(6, dtype=torch.float64)).abs().max() < 1e-3
    assert torch.allclose(y, w(x), atol=1e-3)


def test_fewer_sentences_than_dimensions_drops_the_null_directions():
    x = anisotropic(6, 16, seed=3)  # rank of the covariance: n - 1 = 5
    w = fit_whitening(x)
    assert w.rank == 5 and w.dim == 5
    y = w(x).numpy()
    assert np.isfinite(y).all() and np.abs(np.cov(y.T) - np.eye(5)).max() < 1e-7
    assert fit_whitening(x, dim=12).dim == 5 and fit_whitening(x, dim=3).dim == 3
    unseen = anisotropic(50, 16, seed=4)
    assert torch.isfinite(w.linear()(unseen)).all()


def test_a_constant_dimension_is_ignored_not_a_nan():
    x = anisotropic(200, 8, seed=5)
    x[:, 3] = 0.25
    w = fit_whitening(x)
    assert w.rank == 7 and w.dim == 7 and torch.isfinite(w.weight).all()
    assert w.weight[3].abs().max() < 1e-6  # no output reads the constant dimension
    y = w(x).numpy()
    assert np.abs(np.cov(y.T) - np.eye(7)).max() < 1e-7
    moved = x.clone()
    moved[:, 3] = 7.0  # a value the fitting set never had changes nothing
    assert torch.allclose(w(moved), w(x), atol=1e-5)


def test_what_cannot_be_whitened_is_an_error():
    with pytest.raises(ValueError, match="at least 2"):
        fit_whitening(torch.randn(1, 4))
    with pytest.raises(ValueError, match="no variance"):
        fit_whitening(torch.ones(10, 4))
    with pytest.raises(ValueError, match="between 1 and"):
        fit_whitening(torch.randn(10, 4), dim=5)
    bad = torch.randn(10, 4)
    bad[2, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        fit_whitening(bad)


def test_a_large_set_is_fitted_in_chunks(monkeypatch):
    """The two-pass chunked covariance equals the one of all rows at once."""
    from bertcf.models import whitening

    x = anisotropic(257, 6, seed=6)
    whole = fit_whitening(x)
    monkeypatch.setattr(whitening, "CHUNK", 50)
    chunked = fit_whitening(x)
    assert torch.allclose(chunked.mean, whole.mean, rtol=0, atol=1e-12)
    product = whole.weight @ whole.weight.T
    assert torch.allclose(chunked.weight @ chunked.weight.T, product, rtol=1e-6, atol=1e-12 * product.abs().max())


# ---- the pooling the papers whiten: first-last-avg ------------------------------------------------

SENTENCES = ["A man is playing a guitar.", "Two dogs run across the park in the morning sun.", "Hello",
             "the quick brown fox jumps over the lazy dog " * 3]


def test_first_last_avg_reads_transformers_first_layer_not_the_embeddings(tiny_bert_dir):
    """first-last-avg = mean over real tokens of transformers' hidden_states[1] (the first layer's
    output) and hidden_states[-1], averaged; padding never counts."""
    import transformers

    from bertcf import SentenceEncoder

    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir, pooling="first-last-avg").eval()
    hf = transformers.BertModel.from_pretrained(str(tiny_bert_dir)).eval()
    batch = encoder.tokenize(SENTENCES)
    with torch.no_grad():
        states = hf(**batch, output_hidden_states=True).hidden_states
    mask = batch["attention_mask"][..., None].float()

    def mean(h):
        return (h * mask).sum(1) / mask.sum(1)

    ours = encoder.encode(SENTENCES)
    assert (ours - (mean(states[1]) + mean(states[-1])) / 2).abs().max() < 1e-5
    assert (ours - (mean(states[0]) + mean(states[-1])) / 2).abs().max() > 1e-3  # not the embeddings' output


@pytest.mark.parametrize("method", ["mirror", "ct", "bsl", "tsdae"])
def test_every_objective_trains_with_first_last_avg(tiny_bert_dir, method):
    from helpers import make_objective

    from bertcf import SentenceEncoder

    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir, pooling="first-last-avg")
    objective = make_objective("mirror", method, encoder)
    tokens = encoder.tokenize(SENTENCES * 2)
    ids, mask = tokens["input_ids"], tokens["attention_mask"]
    special = torch.isin(ids, torch.tensor(encoder.tokenizer.all_special_ids)) | (mask == 0)
    loss, _ = objective(ids, mask, special)
    loss.backward()
    assert torch.isfinite(loss) and encoder.bert.encoder.layer[0].output.dense.weight.grad.abs().sum() > 0


def test_first_last_avg_loads_in_sentence_transformers_with_its_code_only(tiny_bert_dir, tmp_path):
    """Its sentence-transformers module is the checkpoint's own code (trust_remote_code=True); without
    the flag loading fails rather than pooling otherwise."""
    from sentence_transformers import SentenceTransformer

    from bertcf import SentenceEncoder

    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir, pooling="first-last-avg").eval()
    encoder.dense = fit_whitening(encoder.encode(SENTENCES * 3 + ["one more sentence", "and another"])).linear()
    encoder.save_pretrained(tmp_path / "ckpt")
    modules = [m["type"] for m in json_file(tmp_path / "ckpt" / "modules.json")]
    assert modules == ["sentence_transformers.models.Transformer", "bertcf_st.FirstLastAvgPooling",
                       "sentence_transformers.models.Dense"]
    assert json_file(tmp_path / "ckpt" / "sentence_bert_config.json")["config_args"] == {"output_hidden_states": True}
    loaded = SentenceEncoder.from_pretrained(tmp_path / "ckpt")
    assert loaded.pooling == "first-last-avg" and torch.equal(loaded.encode(SENTENCES), encoder.encode(SENTENCES))
    theirs = SentenceTransformer(str(tmp_path / "ckpt"), device="cpu", trust_remote_code=True).encode(SENTENCES)
    assert (torch.tensor(theirs) - encoder.encode(SENTENCES)).abs().max() < 1e-5
    with pytest.raises(ValueError, match="FirstLastAvgPooling"):
        SentenceTransformer(str(tmp_path / "ckpt"), device="cpu")


def json_file(path):
    import json
    return json.loads(path.read_text())


# ---- run_pretrain.py --stage whiten -------------------------------------------------------------

def whiten_argv(bert, data, out, *more):
    return ["--stage", "whiten", "--model", str(bert), "--data-dir", str(data), "--corpus-from-tasks", "--out-dir",
            str(out), "--device", "cpu", "--precision", "fp32", "--progress", "none", *more]


def run_whiten(*argv):
    import contextlib
    import io

    from bertcf.commands import pretrain

    with contextlib.redirect_stdout(io.StringIO()) as out:
        summary = pretrain.run(list(argv))
    return summary, out.getvalue()


def test_whiten_stage_writes_a_run_and_whitens_its_fitting_set(tiny_bert_dir, tiny_data_dir, tmp_path):
    from bertcf import SentenceEncoder
    from bertcf.data.tasks import task_sentences

    out = tmp_path / "whiten"
    summary, printed = run_whiten(*whiten_argv(tiny_bert_dir, tiny_data_dir, out))
    assert "before whitening" in printed and summary["best_step"] == 0
    assert {p.name for p in out.iterdir()} == {"config.json", "environment.json", "metrics.jsonl", "tb", "best", "last"}
    config = json_file(out / "config.json")
    assert (config["stage"], config["steps"], config["whitening"]["fitted_on"]) == ("whiten", 0, "--whiten-on corpus")
    records = (out / "metrics.jsonl").read_text().splitlines()
    assert len(records) == 1 and '"step": 0' in records[0] and "unwhitened_sts_spearman" in records[0]
    assert not (out / "last" / "training_state.pt").exists()
    assert "BERT-whitening" in (out / "best" / "README.md").read_text()
    encoder = SentenceEncoder.from_pretrained(out)  # the run directory stands for best/
    head, encoder.dense = encoder.dense, None
    sentences = task_sentences(tiny_data_dir, min_words=6)
    x = encoder.encode(sentences)
    assert head.out_features == config["whitening"]["dim"] == fit_whitening(x).dim
    # the tiny BERT's mean-pooled vectors lie in a hyperplane (each token vector comes out of a LayerNorm
    # without bias, so its coordinates sum to 0): a null direction, dropped
    assert config["whitening"]["rank"] == x.shape[1] - 1 == head.out_features
    with torch.no_grad():
        y = head(x).double()
    assert y.mean(0).abs().max() < 1e-4
    assert (torch.cov(y.T) - torch.eye(y.shape[1], dtype=torch.float64)).abs().max() < 1e-3


def test_whiten_on_the_target_sentences_and_k_dimensions(tiny_bert_dir, tiny_data_dir, tmp_path):
    from bertcf.data.tasks import read_sts, task_file

    summary, _ = run_whiten(*whiten_argv(tiny_bert_dir, tiny_data_dir, tmp_path / "w", "--whiten-on", "sts-dev",
                                         "--whiten-dim", "4", "--pooling", "first-last-avg"))
    pairs = read_sts(task_file(tiny_data_dir, "sts", "dev"))
    assert summary["whitening"]["sentences"] == 2 * len(pairs) and summary["whitening"]["dim"] == 4
    config = json_file(tmp_path / "w" / "best" / "sentence_encoder.json")
    assert config["pooling"] == "first-last-avg" and config["dense"]


@pytest.mark.parametrize("argv, message", [
    (["--whiten-dim", "1000"], "more than the encoder's 32"),
    (["--stage", "mirror", "--whiten-dim", "4"], "are for --stage whiten"),
    (["--whiten-on", "stsb", "--senteval-dir", "nowhere"], "nowhere"),
    (["--mini-batch-size", "4"], "--mini-batch-size is for the training stages"),
])
def test_whiten_stage_bad_input_is_one_line(tiny_bert_dir, tiny_data_dir, tmp_path, capsys, argv, message):
    from bertcf.commands import pretrain
    from bertcf.cli import run_main

    assert run_main(pretrain.run, whiten_argv(tiny_bert_dir, tiny_data_dir, tmp_path / "w") + argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and message in err


@pytest.mark.slow
def test_a_whitened_checkpoint_loads_where_bertcf_is_not_installed(tiny_bert_dir, tiny_data_dir, tmp_path):
    """The stage's checkpoints in sentence-transformers alone, in a process where bertcf cannot be
    imported: mean pooling + Dense needs no remote code, first-last-avg carries its module's code.
    Within 1e-5 of the vectors' scale: whitened coordinates of sentences unlike the fitting set reach
    25 here (1/sqrt of the smallest eigenvalue scales up float32's rounding of the pooled vector as
    much), so 1e-5 is relative to the largest coordinate when that is above 1."""
    from bertcf import SentenceEncoder

    run_whiten(*whiten_argv(tiny_bert_dir, tiny_data_dir, tmp_path / "mean"))
    run_whiten(*whiten_argv(tiny_bert_dir, tiny_data_dir, tmp_path / "fla", "--pooling", "first-last-avg",
                            "--whiten-dim", "8"))
    mean, first_last = tmp_path / "mean" / "best", tmp_path / "fla" / "best"
    theirs = standalone_vectors((mean, False), (first_last, True))
    for vectors, path in zip(theirs, (mean, first_last)):
        ours = SentenceEncoder.from_pretrained(path).encode(ST_SENTENCES)
        assert vectors.shape == ours.shape and (vectors - ours).abs().max() < 1e-5 * max(1.0, ours.abs().max())


def test_an_encoder_that_normalises_is_whitened_before_it_normalises(tiny_bert_dir):
    """MiniLM's checkpoint ends in Normalize: the head sits before it, so it is fitted on the raw
    pooled vectors, and encode() returns the whitened vectors made unit length."""
    from bertcf import SentenceEncoder
    from bertcf.training.whiten import whiten

    sentences = [f"{s} number {i}" for i in range(20) for s in SENTENCES[:3]]
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir).eval()
    encoder.normalize = True
    info = whiten(encoder, sentences, dim=None)
    whitened = encoder.encode(sentences, normalize=False).double()  # the head's output, before normalising
    assert whitened.shape[1] == info["dim"]
    assert (torch.cov(whitened.T) - torch.eye(info["dim"], dtype=torch.float64)).abs().max() < 1e-3
    assert torch.allclose(encoder.encode(sentences).norm(dim=1), torch.ones(len(sentences)), atol=1e-5)
