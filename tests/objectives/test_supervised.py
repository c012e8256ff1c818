"""The supervised objectives (--stage supervised) and their data.

- each loss against sentence-transformers' (as tests/objectives/test_reference.py does): sbert-softmax =
  SoftmaxLoss (the classifier's weights copied), sbert-cosine = CosineSimilarityLoss, simcse-sup =
  MultipleNegativesRankingLoss with a hard-negative column (scale 1/tau; with query_to_query for
  the report's variant); loss and gradients within 1e-5 on the same batch;
- the NLI readers on small files in each published format (.jsonl, .txt, the TSV), the rows they
  skip and the ones they refuse (one line naming the file and line), the triples, the pair files
  of every kind, parallel text;
- every method end to end through run_pretrain's main: best/ is a plain encoder (no classifier,
  no MLP), last/ keeps the heads, --resume is exact, presets measure the run in epochs.
"""
from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from helpers import (
    CONTRADICTED,
    ENTAILED,
    NEUTRAL,
    PREMISES,
    load,
    make_objective,
    record_pretrainings,
    stacked,
)

from bertcf.data.nli import LABELS, NLIExample, nli_triples, read_nli
from bertcf.data.pairs import read_pairs, read_parallel
from bertcf.errors import DataError, UsageError
from bertcf.models.encoder import SentenceEncoder
from bertcf.objectives import (
    METHODS,
    SUPERVISED,
    Examples,
    SBERTCosine,
    SBERTSoftmax,
    SupervisedSimCSE,
)

TAU = 0.05


def embeddings_of(objective, batch_, labels=None):
    """(our loss, the embeddings [k b, D] it was computed from, the loss's gradient on them)."""
    kept = []
    embed = objective.embed

    def capture(*a, **kw):
        out = embed(*a, **kw)
        out.retain_grad()
        kept.append(out)
        return out
    objective.embed = capture
    loss, _ = objective.loss(*batch_, labels=labels)
    loss.backward()
    (u,) = kept
    return loss, u.detach(), u.grad


def same(ours, theirs, atol=1e-5):
    assert torch.allclose(ours, theirs, atol=atol, rtol=1e-5), (ours - theirs).abs().max()


def with_gradient(loss_fn, *tensors):
    leaves = [t.clone().requires_grad_(True) for t in tensors]
    loss = loss_fn(*leaves)
    loss.backward()
    return loss.detach(), [t.grad for t in leaves]


class Fixed(torch.nn.Module):
    """A sentence-transformers model that returns the embeddings it is given (features["x"])."""

    device = torch.device("cpu")

    def forward(self, features):
        return {"sentence_embedding": features["x"]}


# ---- against sentence-transformers ----------------------------------------------------------------------
def test_sbert_softmax_is_sentence_transformers_softmax_loss(tiny_bert_dir):
    from sentence_transformers.sentence_transformer.losses import SoftmaxLoss

    enc = load(tiny_bert_dir)
    examples = Examples([PREMISES, ENTAILED], torch.tensor([0, 1, 2, 0]), LABELS)
    objective = SBERTSoftmax(enc, generator=torch.Generator().manual_seed(0), **SBERTSoftmax.from_examples(examples))
    labels = torch.tensor([0, 2, 1, 2])
    loss, u, grad = embeddings_of(objective, stacked(enc, [PREMISES, ENTAILED]), labels)
    reference = SoftmaxLoss(Fixed(), embedding_dimension=enc.dim, num_labels=3)
    with torch.no_grad():
        reference.classifier.weight.copy_(objective.classifier.weight)
        reference.classifier.bias.copy_(objective.classifier.bias)
    theirs, (their_grad,) = with_gradient(lambda v: reference([{"x": v[:4]}, {"x": v[4:]}], labels), u)
    same(loss.detach(), theirs)
    same(grad, their_grad)
    same(objective.classifier.weight.grad, reference.classifier.weight.grad)
    same(objective.classifier.bias.grad, reference.classifier.bias.grad)


def test_sbert_cosine_is_sentence_transformers_cosine_similarity_loss(tiny_bert_dir):
    from sentence_transformers.sentence_transformer.losses import CosineSimilarityLoss

    enc = load(tiny_bert_dir)
    objective = SBERTCosine(enc, generator=torch.Generator().manual_seed(0))
    gold = torch.tensor([0.9, 0.2, 0.55, 1.0])
    loss, u, grad = embeddings_of(objective, stacked(enc, [PREMISES, ENTAILED]), gold)
    reference = CosineSimilarityLoss(Fixed())
    theirs, (their_grad,) = with_gradient(lambda v: reference.compute_loss_from_embeddings([v[:4], v[4:]], gold), u)
    same(loss.detach(), theirs)
    same(grad, their_grad)


@pytest.mark.parametrize("negatives,directions", [("simcse", ("query_to_doc",)),
                                                  ("report", ("query_to_doc", "query_to_query"))])
def test_supervised_simcse_is_mnrl_with_a_hard_negative_column(negatives, directions, tiny_bert_dir):
    """Published (--negatives simcse): each anchor against every positive and every hard negative,
    MNRL's (anchor, positive, negative) triplets at scale 1/tau; the report's variant adds the other
    anchors: MNRL with its query_to_query direction."""
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.util import cos_sim

    enc = load(tiny_bert_dir)
    objective = SupervisedSimCSE(enc, negatives=negatives, temperature=TAU, generator=torch.Generator().manual_seed(0))
    loss, u, grad = embeddings_of(objective, stacked(enc, [PREMISES, ENTAILED, CONTRADICTED]))
    mnrl = MultipleNegativesRankingLoss(None, scale=1 / TAU, similarity_fct=cos_sim, directions=directions)
    theirs, (their_grad,) = with_gradient(lambda v: mnrl.compute_loss_from_embeddings(list(v.chunk(3)), None), u)
    same(loss.detach(), theirs)
    same(grad, their_grad)
    without = mnrl.compute_loss_from_embeddings(list(u.chunk(3))[:2], None)
    assert not torch.allclose(without, theirs)  # the hard negatives are in the loss


def test_supervised_simcse_trains_its_mlp_and_saves_cls_without_it(tiny_bert_dir):
    enc = load(tiny_bert_dir)
    enc.pooling = "cls"  # the caller's choice: the objective checks it and changes nothing of the encoder
    objective = SupervisedSimCSE(enc, mlp=True, generator=torch.Generator().manual_seed(0))
    assert enc.pooling == "cls" and objective.mlp is not None
    loss, _ = objective.loss(*stacked(enc, [PREMISES, ENTAILED, CONTRADICTED]))
    loss.backward()
    assert objective.mlp[0].weight.grad.abs().sum() > 0
    assert set(objective.checkpoint_modules()) == {"encoder", "mlp"}


# ---- the shared interface ---------------------------------------------------------------------------------
def batch_of(method, enc):
    if method == "margin-mse":
        return stacked(enc, [PREMISES, ENTAILED, CONTRADICTED]), torch.tensor([0.5, 1.0, -0.3, 2.0]), None
    if method == "simcse-sup":
        return stacked(enc, [PREMISES, ENTAILED, CONTRADICTED]), None, None
    if method == "sbert-softmax":
        return stacked(enc, [PREMISES, NEUTRAL]), torch.tensor([1, 1, 0, 2]), Examples([[]], classes=LABELS)
    return stacked(enc, [PREMISES, ENTAILED]), torch.tensor([0.2, 0.4, 0.6, 0.8]), None


@pytest.mark.parametrize("method", [m for m in METHODS["supervised"] if m != "distill"])
def test_interface(method, tiny_bert_dir):
    """As tests/objectives/test_objectives.py's test_interface for the other stages: the optimiser's groups
    hold exactly the trainable parameters, the encoder's among them, the loss is finite, and what a
    checkpoint keeps round-trips."""
    enc = load(tiny_bert_dir, dropout=0.1)
    batch_, labels, examples = batch_of(method, enc)
    obj = make_objective("supervised", method, enc, torch.Generator().manual_seed(0), examples)
    assert obj.encoder is enc and enc.flow is None
    grouped = [p for g in obj.parameter_groups() for p in g["params"]]
    assert {id(p) for p in grouped} == {id(p) for p in obj.parameters() if p.requires_grad}
    assert {id(p) for p in enc.bert.parameters()} <= {id(p) for p in grouped}
    loss, scalars = obj(*batch_, labels=labels)
    assert torch.isfinite(loss) and all(torch.isfinite(torch.as_tensor(v)) for v in scalars.values())
    other = make_objective("supervised", method, load(tiny_bert_dir, dropout=0.1), None, examples)
    for name, module in obj.checkpoint_modules().items():
        other.checkpoint_modules()[name].load_state_dict(module.state_dict())


def test_the_classifier_has_one_output_per_class(tiny_bert_dir):
    enc = load(tiny_bert_dir)
    examples = Examples([[]], classes=("not duplicate", "duplicate"))
    two = SBERTSoftmax(enc, **SBERTSoftmax.from_examples(examples))
    assert two.classifier.weight.shape == (2, 3 * enc.dim)


# ---- NLI files --------------------------------------------------------------------------------------------
ROWS = [(PREMISES[0], ENTAILED[0], "entailment"), (PREMISES[0], CONTRADICTED[0], "contradiction"),
        (PREMISES[0], NEUTRAL[0], "neutral"), (PREMISES[1], ENTAILED[1], "entailment"),
        (PREMISES[1], NEUTRAL[1], "-"), (PREMISES[2], CONTRADICTED[2], "contradiction")]
EXPECTED = [NLIExample(p, h, LABELS.index(label)) for p, h, label in ROWS if label != "-"]
TXT_HEADER = ["gold_label", "sentence1_binary_parse", "sentence2_binary_parse", "sentence1_parse", "sentence2_parse",
              "sentence1", "sentence2", "captionID", "pairID", "label1", "label2", "label3", "label4", "label5"]


def write_jsonl(path, rows=ROWS):
    path.write_text("".join(json.dumps({"annotator_labels": [g], "captionID": "x", "gold_label": g, "pairID": f"p{i}",
                                        "sentence1": p, "sentence1_binary_parse": "( p )", "sentence2": h})
                            + "\n" for i, (p, h, g) in enumerate(rows)), encoding="utf-8")
    return path


def write_txt(path, rows=ROWS):
    lines = ["\t".join(TXT_HEADER)] + ["\t".join([g, "( p )", "( h )", "(ROOT p)", "(ROOT h)", p, h, "c", f"p{i}", g,
                                                  "", "", "", ""]) for i, (p, h, g) in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_tsv(path, rows=ROWS, numeric=True):
    def label(g):
        return g if not numeric else "-1" if g == "-" else str(LABELS.index(g))
    path.write_text("premise\thypothesis\tlabel\n" + "".join(f"{p}\t{h}\t{label(g)}\n" for p, h, g in rows),
                    encoding="utf-8")
    return path


@pytest.mark.parametrize("write,name", [(write_jsonl, "snli.jsonl"), (write_txt, "snli.txt"), (write_tsv, "snli.tsv"),
                                        (lambda p: write_tsv(p, numeric=False), "named.tsv")])
def test_nli_formats_read_the_same_pairs_and_skip_those_without_gold(write, name, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="bertcf.data"):
        assert read_nli(write(tmp_path / name)) == EXPECTED
    assert "skipped 1 pairs without a gold label and 0 with a blank sentence; 5 kept" in caplog.text


def test_the_shared_snli_split(shared_dir):
    if shared_dir is None or not (shared_dir / "data" / "nli" / "snli-test.tsv").is_file():
        pytest.skip("../shared/data/nli not present")
    examples = read_nli(shared_dir / "data" / "nli" / "snli-test.tsv")
    assert len(examples) == 9824  # SOURCES.md's counts
    assert [sum(e.label == i for e in examples) for i in range(3)] == [3368, 3219, 3237]
    triples = nli_triples(examples)
    assert len({t[0] for t in triples}) == 2921


@pytest.mark.parametrize("write,content,line,message", [
    (write_jsonl, '{"sentence1": "a", "sentence2": "b", "gold_label": "entailment"}\n{"sentence1": "a"', 2,
     "not a JSON object"),
    (write_jsonl, '{"sentence1": "a", "gold_label": "entailment"}\n', 1, "no 'sentence2'"),
    (write_jsonl, '{"sentence1": "a", "sentence2": "b", "gold_label": "maybe"}\n', 1, "label 'maybe' is not one of"),
    (write_tsv, "premise\thypothesis\tlabel\na\tb\t0\na\tb\n", 3, "expected 3 tab-separated fields, found 2"),
    (write_tsv, "premise\thypothesis\tlabel\na\tb\t7\n", 2, "label '7' is not one of entailment, neutral"),
    (write_txt, "gold_label\tsentence1\tsentence2\nentailment\ta\n", 2, "expected 3 tab-separated fields"),
    (write_txt, "label\tsentence1\n", 1, "not an NLI header"),
])
def test_malformed_rows_and_unknown_labels_name_the_file_and_line(write, content, line, message, tmp_path):
    suffix = {write_jsonl: ".jsonl", write_txt: ".txt", write_tsv: ".tsv"}[write]
    path = tmp_path / f"bad{suffix}"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as e:
        read_nli(path)
    assert f"{path} line {line}: " in str(e.value) and message in str(e.value) and "\n" not in str(e.value)


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "empty.tsv").write_text("")
    with pytest.raises(DataError, match="empty"):
        read_nli(tmp_path / "empty.tsv")
    with pytest.raises(DataError, match="not found"):
        read_nli(tmp_path / "missing.jsonl")
    write_tsv(tmp_path / "nogold.tsv", [(PREMISES[0], ENTAILED[0], "-")])
    with pytest.raises(DataError, match="no labelled pairs"):
        read_nli(tmp_path / "nogold.tsv")


def test_triples_pair_each_entailment_with_a_contradiction_of_its_premise():
    examples = [NLIExample("p1", "e1", 0), NLIExample("p1", "c1", 2), NLIExample("p1", "n1", 1),
                NLIExample("p2", "e2", 0),                                       # no contradiction: no triple
                NLIExample("p3", "c3", 2), NLIExample("p3", "e3", 0), NLIExample("p3", "e3b", 0),
                NLIExample("p1", "e1b", 0)]                                      # a later round of p1
    assert nli_triples(examples) == [("p1", "e1", "c1"), ("p1", "e1b", "c1"), ("p3", "e3", "c3"),
                                     ("p3", "e3b", "c3")]


def test_pair_files_of_every_kind(tmp_path, tiny_data_dir):
    nli = read_pairs([write_tsv(tmp_path / "a.tsv"), write_jsonl(tmp_path / "b.jsonl")])
    assert nli.kind == "nli" and len(nli) == 10 and nli.classes == LABELS
    qqp = read_pairs([tiny_data_dir / "quora-train.csv"])
    assert qqp.kind == "qqp" and set(qqp.labels) == {0.0, 1.0} and len(qqp) == 24
    sts = read_pairs([tiny_data_dir / "sts-train.csv"])
    assert sts.kind == "sts" and max(sts.labels) <= 5
    with pytest.raises(DataError, match="different kinds"):
        read_pairs([tmp_path / "a.tsv", tiny_data_dir / "sts-train.csv"])
    with pytest.raises(DataError, match="not a labelled-pair file"):
        read_pairs([tiny_data_dir / "ids-sst-train.csv"])


def test_parallel_text(tmp_path):
    (tmp_path / "pairs.tsv").write_text("Hello world.\tHallo Welt.\n\nGood morning.\tGuten Morgen.\n")
    assert read_parallel(tmp_path / "pairs.tsv") == (["Hello world.", "Good morning."],
                                                     ["Hallo Welt.", "Guten Morgen."])
    (tmp_path / "one.txt").write_text("A sentence.\nAnother one.\n")
    assert read_parallel(tmp_path / "one.txt") == (["A sentence.", "Another one."], None)
    (tmp_path / "mixed.tsv").write_text("a\tb\nc\n")
    with pytest.raises(DataError, match="mixed.tsv line 2: expected source<TAB>target"):
        read_parallel(tmp_path / "mixed.tsv")
    (tmp_path / "blank.tsv").write_text("a\t \n")
    with pytest.raises(DataError, match="line 1: a blank sentence"):
        read_parallel(tmp_path / "blank.tsv")


# ---- end to end through run_pretrain's main --------------------------------------------------------------
def pretrain(model, data_dir, out_dir, method, *extra):
    from bertcf.commands.pretrain import run as main

    return main(["--stage", "supervised", "--method", method, "--model", str(model), "--data-dir", str(data_dir),
                 "--out-dir", str(out_dir), "--batch-size", "4", "--max-length", "24", "--eval-every", "2",
                 "--log-every", "1", "--device", "cpu", "--seed", "3", "--lr", "1e-3", *extra])


def nli_file(tmp_path):
    rows = [(p, h, g) for i, p in enumerate(PREMISES) for h, g in ((ENTAILED[i], "entailment"),
                                                                   (NEUTRAL[i], "neutral"),
                                                                   (CONTRADICTED[i], "contradiction"))]
    return write_tsv(tmp_path / "nli.tsv", rows)


def objective_state(run_dir):
    return torch.load(run_dir / "last" / "training_state.pt", map_location="cpu", weights_only=False)["modules"]


@pytest.mark.parametrize("method,heads", [("sbert-softmax", ("classifier.",)), ("sbert-cosine", ()),
                                          ("simcse-sup", ("mlp.",))])
def test_end_to_end(method, heads, tiny_bert_dir, tiny_data_dir, tmp_path):
    out = tmp_path / "run"
    extra = [] if method == "sbert-cosine" else ["--train-file", str(nli_file(tmp_path))]
    extra += ["--pooling", "cls-mlp"] if method == "simcse-sup" else []
    summary = pretrain(tiny_bert_dir, tiny_data_dir, out, method, "--steps", "3", *extra)
    assert summary["step"] == 3 and math.isfinite(summary["best"])
    config = json.loads((out / "config.json").read_text())
    assert (config["stage"], config["method"]) == ("supervised", method)
    state = objective_state(out)
    names = [f"{name}.{k}" for name, m in state.items() for k in m] + [k for m in state.values() for k in m]
    for prefix in heads:
        assert any(k.startswith(prefix) for k in names), prefix
    for kept in ("best", "last"):
        files = {p.name for p in (out / kept).iterdir()}
        assert "heads.safetensors" not in files and "classifier" not in json.dumps(json.loads(
            (out / kept / "modules.json").read_text()))
        encoder = SentenceEncoder.from_pretrained(out / kept)
        assert encoder.pooling == ("cls" if method == "simcse-sup" else "mean")
        assert encoder.encode(["A man plays a guitar."]).shape == (1, 32)
    start, last = (load(d).bert.encoder.layer[0].output.dense.weight for d in (tiny_bert_dir, out / "last"))
    assert not torch.equal(last, start)


def test_resume_is_exact(tiny_bert_dir, tiny_data_dir, tmp_path):
    """2 steps + --resume for 2 more == 4 steps in one go (the classifier and the data order too)."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    files = ["--train-file", str(nli_file(tmp_path))]
    pretrain(tiny_bert_dir, tiny_data_dir, straight, "sbert-softmax", "--steps", "4", *files)
    pretrain(tiny_bert_dir, tiny_data_dir, resumed, "sbert-softmax", "--steps", "2", *files)
    pretrain(tiny_bert_dir, tiny_data_dir, resumed, "sbert-softmax", "--steps", "4", "--resume")
    a, b = objective_state(straight)["objective"], objective_state(resumed)["objective"]
    assert a.keys() == b.keys() and any(k.startswith("classifier.") for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_presets_measure_the_run_in_epochs(tiny_bert_dir, tiny_data_dir, tmp_path):
    """--preset sbert-nli: one epoch of the 12 pairs at batch 16 is 1 step (--batch-size wins: 4 a
    step, 3 steps), warm-up a tenth; --preset simcse-sup: 3 epochs of the 4 triples; --preset
    sbert-sts on the data directory's STS train file (--steps wins over its 4 epochs)."""
    from bertcf.commands.pretrain import run as main

    base = ["--model", str(tiny_bert_dir), "--data-dir", str(tiny_data_dir), "--device", "cpu", "--eval-every", "50",
            "--train-file", str(nli_file(tmp_path))]
    main(["--preset", "sbert-nli", "--batch-size", "4", "--out-dir", str(tmp_path / "sbert"), *base])
    config = json.loads((tmp_path / "sbert" / "config.json").read_text())
    assert (config["stage"], config["method"], config["steps"], config["warmup_steps"]) == (
        "supervised", "sbert-softmax", 3, 1)
    assert (config["lr"], config["pooling"], config["max_length"]) == (2e-5, "mean", 128)
    main(["--preset", "simcse-sup", "--batch-size", "2", "--out-dir", str(tmp_path / "simcse"), *base])
    config = json.loads((tmp_path / "simcse" / "config.json").read_text())
    assert (config["method"], config["steps"], config["negatives"], config["pooling"]) == (
        "simcse-sup", 6, "simcse", "cls-mlp")
    base = base[:-2] + ["--steps", "2"]  # sbert-sts: the data dir's STS train file (24 pairs), 2 steps given
    main(["--preset", "sbert-sts", "--batch-size", "4", "--out-dir", str(tmp_path / "sts"), *base])
    config = json.loads((tmp_path / "sts" / "config.json").read_text())
    assert (config["method"], config["steps"], config["lr_schedule"]) == ("sbert-cosine", 2, "linear")


@pytest.mark.parametrize("flags,message", [
    (["--method", "sbert-softmax"], "needs --train-file"),
    (["--method", "simcse-sup", "--train-file", "X", "--negatives", "ntxent"], "does not apply to simcse-sup"),
    (["--method", "sbert-cosine", "--teacher", "X"], "are for --stage supervised --method distill"),
    (["--method", "simcse-sup", "--train-file", "STS"], r"trains on NLI files or on \(anchor, positive, negative\) triplets .* \(sts\)"),
    (["--method", "sbert-cosine", "--train-file", "NLI"], "trains on sts or qqp pairs"),
])
def test_bad_flags_and_files(flags, message, tiny_bert_dir, tiny_data_dir, tmp_path):
    from bertcf.commands.pretrain import run as main

    names = {"STS": str(tiny_data_dir / "sts-train.csv"), "NLI": str(nli_file(tmp_path))}
    flags = [names.get(f, f) for f in flags]
    with pytest.raises(UsageError, match=message):
        main(["--stage", "supervised", "--model", str(tiny_bert_dir), "--data-dir", str(tiny_data_dir), "--device",
              "cpu", "--out-dir", str(tmp_path / "bad"), *flags])


def test_a_bad_row_is_one_line_and_exit_status_2(tiny_bert_dir, tiny_data_dir, tmp_path, capsys):
    from bertcf.commands.pretrain import main as command

    bad = tmp_path / "bad.tsv"
    bad.write_text("premise\thypothesis\tlabel\na\tb\tentailment\nc\td\tunsure\n")
    status = command(["--stage", "supervised", "--model", str(tiny_bert_dir), "--data-dir", str(tiny_data_dir),
                      "--device", "cpu", "--out-dir", str(tmp_path / "run"), "--train-file", str(bad)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err[-1].startswith(f"error: {bad} line 3: label 'unsure' is not one of"), err
    assert not (tmp_path / "run").exists()


def test_train_file_is_for_the_supervised_stage(tiny_bert_dir, tiny_data_dir, tmp_path):
    from bertcf.commands.pretrain import run as main

    with pytest.raises(UsageError, match="--train-file is for --stage supervised"):
        main(["--stage", "mirror", "--model", str(tiny_bert_dir), "--data-dir", str(tiny_data_dir), "--device", "cpu",
              "--corpus-from-tasks", "--out-dir", str(tmp_path / "bad"), "--train-file", "x.tsv"])
    assert set(SUPERVISED) <= set(METHODS["supervised"])


# ---- distillation ---------------------------------------------------------------------------------------
def test_distill_is_sentence_transformers_mse_loss_with_a_projection(tiny_bert_dir):
    """Parallel pairs (s, t), student width 32, teacher width 48: our loss (its projection the
    encoder's linear head) = MSELoss(projection_dim=48) with the same projection weights, loss and
    gradients on the embeddings and on the projection."""
    from sentence_transformers.sentence_transformer.losses import MSELoss

    from bertcf.objectives import Distill

    enc = load(tiny_bert_dir)
    teacher = torch.randn(4, 48, generator=torch.Generator().manual_seed(1))
    objective = Distill(enc, **Distill.from_examples(Examples([PREMISES, ENTAILED], teacher)))
    assert isinstance(enc.dense, torch.nn.Linear) and enc.dense.weight.shape == (48, 32) and enc.output_dim == 48
    loss, u, grad = embeddings_of(objective, stacked(enc, [PREMISES, ENTAILED]), teacher)

    class Model(Fixed):
        def get_embedding_dimension(self):
            return 32
    reference = MSELoss(Model(), projection_dim=48)
    with torch.no_grad():
        reference.projection.weight.copy_(enc.dense.weight)
        reference.projection.bias.copy_(enc.dense.bias)
    theirs, (their_grad,) = with_gradient(lambda v: reference([{"x": v[:4]}, {"x": v[4:]}], teacher), u)
    same(loss.detach(), theirs)
    same(grad, their_grad)
    same(enc.dense.weight.grad, reference.projection.weight.grad)
    same(enc.dense.bias.grad, reference.projection.bias.grad)


def test_distill_without_projection_when_the_widths_agree(tiny_bert_dir):
    from sentence_transformers.sentence_transformer.losses import MSELoss

    from bertcf.objectives import Distill

    enc = load(tiny_bert_dir)
    teacher = torch.randn(4, 32, generator=torch.Generator().manual_seed(2))
    objective = Distill(enc, **Distill.from_examples(Examples([PREMISES], teacher)))
    assert enc.dense is None
    loss, u, grad = embeddings_of(objective, stacked(enc, [PREMISES]), teacher)
    theirs, (their_grad,) = with_gradient(lambda v: MSELoss(Fixed())([{"x": v}], teacher), u)
    same(loss.detach(), theirs)
    same(grad, their_grad)


def test_teacher_vectors_are_computed_once_and_cached(tiny_bert_dir, tmp_path, monkeypatch):
    from bertcf.objectives import distill

    sentences = PREMISES + ENTAILED
    first = distill.teacher_embeddings(str(tiny_bert_dir), sentences, tmp_path / "cache")
    expected = SentenceEncoder.from_pretrained(tiny_bert_dir).encode(sentences)
    same(first, expected)
    (cached,) = list((tmp_path / "cache").iterdir())
    calls = []
    real = distill.SentenceEncoder.from_pretrained
    monkeypatch.setattr(distill.SentenceEncoder, "from_pretrained", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    again = distill.teacher_embeddings(str(tiny_bert_dir), sentences, tmp_path / "cache")
    assert calls == [] and torch.equal(again, first)  # read from the file
    distill.teacher_embeddings(str(tiny_bert_dir), sentences[:-1], tmp_path / "cache")  # another corpus: a new file
    assert len(calls) == 1 and len(list((tmp_path / "cache").iterdir())) == 2
    cached.write_bytes(cached.read_bytes()[:50])  # truncated: computed again, and rewritten whole
    assert torch.equal(distill.teacher_embeddings(str(tiny_bert_dir), sentences, tmp_path / "cache"), first)
    assert len(calls) == 2 and not any(p.name.startswith(".") for p in (tmp_path / "cache").iterdir())


def student_config(directory, vocab_path, hidden=16):
    """A config-only bert (random weights) of width ``hidden``: the student."""
    import shutil

    from helpers import TINY_BERT_CONFIG

    directory.mkdir()
    vocab_size = sum(1 for line in vocab_path.read_text(encoding="utf-8").splitlines() if line)
    config = {**TINY_BERT_CONFIG, "vocab_size": vocab_size, "hidden_size": hidden, "num_attention_heads": 2,
              "intermediate_size": 2 * hidden}
    (directory / "config.json").write_text(json.dumps(config))
    shutil.copy(vocab_path, directory / "vocab.txt")
    return directory


@pytest.mark.parametrize("parallel", [False, True])
def test_distill_end_to_end(parallel, tiny_bert_dir, tiny_data_dir, vocab_path, tmp_path):
    """A 16-wide student from random weights learns the 32-wide tiny BERT: best/ holds the
    projection as sentence-transformers' Dense, and sentence-transformers gives its vectors; the
    teacher's vectors are cached in the run directory; --resume is exact."""
    from sentence_transformers import SentenceTransformer

    student = student_config(tmp_path / "student", vocab_path)
    extra = ["--teacher", str(tiny_bert_dir)]
    if parallel:
        (tmp_path / "pairs.tsv").write_text("".join(f"{p}\t{e}\n" for p, e in zip(PREMISES, ENTAILED)))
        extra += ["--train-file", str(tmp_path / "pairs.tsv")]
    else:
        extra += ["--corpus-from-tasks"]
    out = tmp_path / "run"
    summary = pretrain(student, tiny_data_dir, out, "distill", "--steps", "4", *extra)
    assert summary["step"] == 4 and math.isfinite(summary["best"])
    assert len(list((out / "teacher").glob("teacher-*.safetensors"))) == 1
    modules = json.loads((out / "best" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Dense"]
    ours = SentenceEncoder.from_pretrained(out / "best")
    assert ours.dense.weight.shape == (32, 16)
    sentences = ["A man plays a guitar.", "Two dogs run in a field."]
    theirs = SentenceTransformer(str(out / "best"), device="cpu").encode(sentences, convert_to_tensor=True)
    same(ours.encode(sentences), theirs.cpu())
    resumed = tmp_path / "resumed"
    pretrain(student, tiny_data_dir, resumed, "distill", "--steps", "2", *extra)
    pretrain(student, tiny_data_dir, resumed, "distill", "--steps", "4", "--resume")
    a, b = objective_state(out)["objective"], objective_state(resumed)["objective"]
    assert any(k.startswith("encoder.dense.") for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_distill_needs_a_teacher(tiny_bert_dir, tiny_data_dir, tmp_path):
    from bertcf.commands.pretrain import run as main

    with pytest.raises(UsageError, match="needs --teacher"):
        main(["--stage", "supervised", "--method", "distill", "--model", str(tiny_bert_dir), "--data-dir",
              str(tiny_data_dir), "--corpus-from-tasks", "--device", "cpu", "--out-dir", str(tmp_path / "x")])


# ---- the experiments commands ------------------------------------------------------------------------------
def experiments_argv(command, model, data_dir, out, *more):
    return [command, "--model", str(model), "--data-dir", str(data_dir), "--out-dir", str(out), "--corpus-from-tasks",
            "--eval-every", "50", "--device", "cpu", "--seed", "3", *more]


@pytest.mark.slow
def test_experiments_supervised(tiny_bert_dir, tiny_data_dir, tmp_path, monkeypatch, capsys):
    """supervised: the three rows at their presets' lengths, SBERT-NLI then STS from SBERT-NLI's
    best/, a table with intervals beside MinBERT; a second invocation reruns nothing."""
    from bertcf.commands import experiments

    out = tmp_path / "out"
    argv = experiments_argv("supervised", tiny_bert_dir, tiny_data_dir, out, "--nli", str(nli_file(tmp_path)),
                            "--pretrain-args", "--batch-size 4")
    summary = experiments.run(argv)
    rows = summary["supervised"]["rows"]
    assert [r["name"] for r in rows] == ["SBERT-NLI", "SimCSE-sup", "SBERT-NLI then STS"]
    assert all(r["ours"]["sts_spearman"]["n"] == 1 and r["ours"]["sts_spearman"]["ci95"] for r in rows)
    assert [r["name"] for r in summary["supervised"]["reference"]] == ["MinBERT"]
    sts = json.loads((out / "stages" / "sbert-nli-sts" / "config.json").read_text())
    assert (sts["method"], sts["preset"], sts["init"]) == ("sbert-cosine", "sbert-sts",
                                                           str(out / "stages" / "sbert-nli" / "best"))
    nli = json.loads((out / "stages" / "sbert-nli" / "config.json").read_text())
    assert (nli["steps"], nli["train_file"]) == (3, [str(tmp_path / "nli.tsv")])  # 12 pairs, batch 4, one epoch
    text = (out / "supervised.md").read_text()
    assert "holds most of STS-B's test pairs" in text and "SimCSE-sup" in text
    settings = text.split("## Settings", 1)[1]  # the presets' lengths, not the report's stages
    assert "sbert-nli: 1 epoch, simcse-sup: 3, sbert-sts: 4" in settings and "mirror" not in settings
    calls = record_pretrainings(monkeypatch, run=False)
    experiments.run(["supervised", "--out-dir", str(out)])
    assert calls == []


@pytest.mark.slow
def test_experiments_distill_against_the_mlm_base(tiny_bert_dir, tiny_data_dir, vocab_path, tmp_path):
    """distill: the MLM base and two seeds of the student from --config, the teacher and the
    untrained student as references, and the claim student > MLM base tested over the seeds."""
    from bertcf.commands import experiments

    config = student_config(tmp_path / "config", vocab_path)
    out = tmp_path / "out"
    summary = experiments.run(experiments_argv("distill", config, tiny_data_dir, out, "--config", str(config),
                                                "--teacher", str(tiny_bert_dir), "--mlm-steps", "3",
                                                "--seeds", "3,4", "--mlm-args", "--batch-size 4"))
    (row,) = summary["distill"]["rows"]
    assert row["name"] == "Distilled student" and row["ours"]["sts_spearman"]["n"] == 2
    assert [r["name"] for r in summary["distill"]["reference"]] == ["Random weights", "MinBERT", "Teacher"]
    student = json.loads((out / "stages" / "distill" / "config.json").read_text())
    assert (student["model"], student["steps"], student["batch_size"], student["lr"]) == (str(config), 3, 64, 5e-4)
    assert student["teacher_cache"] == str((out / "teacher-cache").resolve())
    assert len(list((out / "teacher-cache").iterdir())) == 1  # the seeds share the teacher's vectors
    claims = [c for c in summary["claims"]["claims"] if (c["a"], c["b"]) == ("Distilled student", "MinBERT")]
    assert claims and all(c["seeds"] == [3, 4] and c["verdict"] in ("supported", "contradicted", "inconclusive")
                          for c in claims)
    text = (out / "distill.md").read_text()
    assert "Distilled student" in text
    settings = text.split("## Settings", 1)[1]  # the student's steps (the MLM base's), not the report's stages
    assert "the student 3, as the MLM base" in settings and "mirror" not in settings
