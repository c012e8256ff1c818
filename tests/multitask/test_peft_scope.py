"""Stage 3's --peft-scope per-task (bertcf/models/peft.py, MultitaskModel.forward_each_task): a shared
adapter and one per task, each task's rows through the shared one and its own. A step's gradients
reach a task's adapter from its rows only, the shared one from all; a task's outputs and gradients
are those of peft's own model with the two adapters active; a stage-3 run trains the adapters apart,
resumes bit for bit, and its checkpoint loads back each task's adapter; bad combinations are refused
in one line. --peft houlsby per task (bertcf/models/bottleneck.py) likewise: trained apart, resumed bit for
bit, read back with each task's adapter."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import multitask_argv, quiet_multitask, refused, write_cs224n_files
from safetensors.torch import load_file

peft = pytest.importorskip("peft", reason="peft is an optional extra: pip install -e '.[peft]'")

from minbert import BertModel, CheckpointError  # noqa: E402

from bertcf.errors import UsageError  # noqa: E402
from bertcf.models import peft as adapters  # noqa: E402
from bertcf.models.bottleneck import HOULSBY_WEIGHTS, HoulsbyAdapters  # noqa: E402
from bertcf.models.encoder import SentenceEncoder  # noqa: E402
from bertcf.models.peft import SHARED, Adapters, PeftSettings  # noqa: E402
from bertcf.multitask import MultitaskModel  # noqa: E402
from bertcf.multitask.evaluation import prediction_file  # noqa: E402
from bertcf.multitask.monitor import shared_parameters  # noqa: E402
from bertcf.multitask.tasks import builtin_tasks  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
T = builtin_tasks()  # the report's SST, QQP and STS declarations
NAMES = list(T)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def per_task_model(bert_dir, method="lora") -> MultitaskModel:
    """The report's three heads on the tiny encoder with one adapter per task,
    every adapter tensor random (LoRA's B starts at zero, which would leave A without a gradient)."""
    torch.manual_seed(0)
    model = MultitaskModel(SentenceEncoder.from_pretrained(bert_dir, **NO_DROPOUT), list(T.values()), proj_dim=8)
    settings = PeftSettings(peft=method) if method == "ia3" else PeftSettings(peft=method, peft_rank=4)
    model.encoder.adapters = Adapters(model.encoder.bert, settings, NAMES)
    model.eval()  # the heads' dropout off
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name in [SHARED, *NAMES]:
            for p in model.encoder.adapters.parameters_of(name):
                p.copy_((1 if method == "ia3" else 0) + 0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def batch(model, sizes: dict, seed=0) -> dict:
    """MultitaskModel.forward's inputs: each task's rows (a pair task two columns), padded to one width."""
    g = torch.Generator().manual_seed(seed)
    n = sum(b * model.rows_per_example(t) for t, b in sizes.items())
    lengths = torch.randint(3, 9, (n,), generator=g)
    mask = (torch.arange(9)[None] < lengths[:, None]).long()
    ids = torch.randint(5, 100, (n, 9), generator=g) * mask
    return {"input_ids": ids, "attention_mask": mask, "sizes": sizes, "num_tokens": int(mask.sum())}


def total(out) -> torch.Tensor:
    """A scalar of a head's output (logits, or a pair's two projections)."""
    return sum(y.sum() for y in (out if isinstance(out, tuple) else (out,)))


def adapter_grads(model, name) -> torch.Tensor:
    params = model.encoder.adapters.parameters_of(name)
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])


@pytest.mark.parametrize("method", ["lora", "ia3"])
def test_a_task_reaches_the_shared_adapter_and_its_own_only(tiny_bert_dir, method):
    """A one-task step: gradients on the shared adapter and the task's, zero on the others'. A
    three-task step: each task's adapter gets the gradient of its own rows alone (that of a step of
    that task alone), the shared adapter all of them."""
    model = per_task_model(tiny_bert_dir, method)
    out = model(**batch(model, {"qqp": 3}))
    total(out["qqp"]).backward()
    assert adapter_grads(model, SHARED).abs().sum() > 0 and adapter_grads(model, "qqp").abs().sum() > 0
    assert not adapter_grads(model, "sst").any() and not adapter_grads(model, "sts").any()

    inputs = batch(model, {"sst": 2, "qqp": 3, "sts": 2}, seed=1)
    alone, rows, start = {}, {}, 0
    for task, n in inputs["sizes"].items():  # each task's rows on their own
        width = n * model.rows_per_example(task)
        rows[task], start = slice(start, start + width), start + width
        model.zero_grad()
        own = {"input_ids": inputs["input_ids"][rows[task]], "attention_mask": inputs["attention_mask"][rows[task]]}
        total(model(**own, sizes={task: n})[task]).backward()
        alone[task] = {name: adapter_grads(model, name) for name in [SHARED, *NAMES]}
    model.zero_grad()
    out = model(**inputs)
    sum(total(y) for y in out.values()).backward()
    for task in NAMES:
        torch.testing.assert_close(adapter_grads(model, task), alone[task][task], rtol=1e-5, atol=1e-7)
        assert not alone[task][next(t for t in NAMES if t != task)].any()
    torch.testing.assert_close(adapter_grads(model, SHARED), sum(alone[t][SHARED] for t in NAMES),
                               rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("method", ["lora", "dora", "ia3"])
def test_a_task_is_peft_with_the_shared_adapter_and_its_own_active(tiny_bert_dir, tmp_path, method):
    """A task's outputs in a three-task step and the gradients on its adapters equal those of peft's
    own model, loaded from the adapters as peft saved them, with ``shared`` and the task's active."""
    model = per_task_model(tiny_bert_dir, method)
    model.encoder.adapters.model.save_pretrained(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted([SHARED, *NAMES])
    inputs = batch(model, {"sst": 2, "qqp": 3, "sts": 2}, seed=2)
    out = model(**inputs)
    total(out["sts"]).backward()

    base = BertModel.from_pretrained(tiny_bert_dir, **NO_DROPOUT).eval()
    reference = peft.PeftModel.from_pretrained(base, str(tmp_path / SHARED), adapter_name=SHARED, is_trainable=True)
    reference.load_adapter(str(tmp_path / "sts"), adapter_name="sts", is_trainable=True)
    reference.base_model.set_adapter([SHARED, "sts"])
    encoder = SentenceEncoder(reference.get_base_model(), model.encoder.tokenizer, pooling=model.encoder.pooling)
    rows = slice(2 + 3 * 2, None)  # the STS rows: after SST's 2 and QQP's 3 pairs
    ids, mask = inputs["input_ids"][rows], inputs["attention_mask"][rows]
    expected = model.heads["sts"](encoder(ids, mask))
    for got, want in zip(out["sts"], expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    total(expected).backward()
    mine = dict(model.encoder.adapters.model.named_parameters())
    compared = 0
    for name, p in reference.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(mine[name].grad, p.grad, rtol=1e-5, atol=1e-7, msg=name)
            compared += 1
    assert compared == len(model.encoder.adapters.parameters_of(SHARED)) * 2


@pytest.mark.parametrize("method", ["lora", "dora", "ia3"])
def test_adapters_read_back_say_what_they_are(tiny_bert_dir, tmp_path, method):
    """A per-task checkpoint's adapters, read back (``Adapters.load``), carry the settings they were
    made with: the run's budget line says the same of them as of the adapters that were saved."""
    saved = per_task_model(tiny_bert_dir, method).encoder.adapters
    saved.model.save_pretrained(str(tmp_path))
    loaded = Adapters.load(tmp_path, BertModel.from_pretrained(tiny_bert_dir), NAMES)
    assert loaded.settings == saved.settings and loaded.summary() == saved.summary()
    assert loaded.summary().endswith(f"one shared and one per task ({len(NAMES)})")
    custom = PeftSettings(peft=method, peft_targets=("value", "query", "output.dense"))  # peft keeps no order
    Adapters(BertModel.from_pretrained(tiny_bert_dir), custom, NAMES).model.save_pretrained(str(tmp_path / "custom"))
    loaded = Adapters.load(tmp_path / "custom", BertModel.from_pretrained(tiny_bert_dir), NAMES)
    assert set(loaded.settings.target_modules) == {"value", "query", "output.dense"}
    assert loaded.settings.replace(peft_targets=custom.peft_targets) == custom


def test_the_conflicts_are_on_the_shared_adapter_and_shared_is_no_task_name(tiny_bert_dir):
    """--conflict-every's cosines are taken on what every task reaches: the shared adapter, the tasks'
    own aside. A task named ``shared`` is refused before peft injects anything."""
    model = per_task_model(tiny_bert_dir)
    assert {id(p) for p in shared_parameters(model)} == {id(p) for p in model.encoder.adapters.parameters_of(SHARED)}
    with pytest.raises(UsageError, match="rename the task"):
        Adapters(BertModel.from_pretrained(tiny_bert_dir), PeftSettings(peft="lora"), ["sst", SHARED])


def test_a_save_replaces_the_adapters_saved_there_before(tiny_bert_dir, tmp_path):
    """One adapter saved over a per-task checkpoint leaves no task's folder behind, and the other way round."""
    one = SentenceEncoder.from_pretrained(tiny_bert_dir)
    one.adapters = Adapters(one.bert, PeftSettings(peft="lora", peft_rank=4))
    per_task = per_task_model(tiny_bert_dir).encoder
    for encoder, single in ((per_task, False), (one, True), (per_task, False)):
        encoder.save_pretrained(tmp_path)
        assert adapters.has_adapter(tmp_path) == single and adapters.has_task_adapters(tmp_path) != single
        assert all((tmp_path / name).is_dir() != single for name in [SHARED, *NAMES])


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_cs224n_files(tmp_path_factory.mktemp("mt-peft-scope"))


def run(bert_dir, data_dir, out, steps, *extra):
    return quiet_multitask(multitask_argv(bert_dir, data_dir, out, steps, "--conflict-every", "0", "--peft", "lora",
                                          "--peft-scope", "per-task", *extra))


def adapter_files(checkpoint: Path) -> dict:
    return {name: load_file(str(checkpoint / name / adapters.ADAPTER_WEIGHTS)) for name in [SHARED, *NAMES]}


def test_a_run_trains_each_task_its_adapter_resumes_bit_for_bit_and_loads_back(tiny_bert_dir, data_dir, tmp_path):
    straight, part = tmp_path / "straight", tmp_path / "part"
    summary = run(tiny_bert_dir, data_dir, straight, 4)
    run(tiny_bert_dir, data_dir, part, 2)
    assert quiet_multitask(["--resume", "--out-dir", str(part), "--steps", "4"])["step"] == 4
    a, b = adapter_files(straight / "last"), adapter_files(part / "last")
    for name in a:
        assert a[name].keys() == b[name].keys()
        for k in a[name]:
            assert torch.equal(a[name][k], b[name][k]), (name, k)
    for name in ("heads.safetensors", "model.safetensors"):
        x, y = load_file(str(straight / "last" / name)), load_file(str(part / "last" / name))
        assert all(torch.equal(x[k], y[k]) for k in x), name
    assert (part / "predictions" / "sts-dev-output.csv").read_bytes() == \
        (straight / "predictions" / "sts-dev-output.csv").read_bytes()

    b_sst, b_qqp = ({k: v for k, v in a[t].items() if "lora_B" in k} for t in ("sst", "qqp"))
    assert all(v.abs().max() > 0 for v in b_sst.values())  # trained (B starts at zero) ...
    assert any(not torch.equal(v, b_qqp[k]) for k, v in b_sst.items())  # ... and apart
    assert not adapters.has_adapter(straight / "best")  # no single adapter: one per folder, as peft saves them

    best = MultitaskModel.from_pretrained(straight / "best")  # each task's adapter, unmerged
    assert best.per_task_adapters and best.encoder.adapters.tasks == tuple(NAMES)
    metrics = summary["metrics"]  # scored by that model: the mean dev of the best step, as training evaluated it
    assert metrics["mean_dev"] == pytest.approx(summary["best"], abs=1e-6)
    with pytest.raises(CheckpointError, match="one adapter per task"):
        SentenceEncoder.from_pretrained(straight / "best")
    again = tmp_path / "again"  # --predict-only reads each task's adapter back: the run's predictions
    quiet_multitask(["--predict-only", "--checkpoint", str(straight), "--out-dir", str(again), "--device", "cpu"])
    for task in NAMES:
        name = prediction_file(task, "dev")
        assert (again / "predictions" / name).read_bytes() == (straight / "predictions" / name).read_bytes(), task


def test_jointly_encoded_pairs_and_the_conflicts_run_per_task(tiny_bert_dir, data_dir, tmp_path):
    """--pair-encoding cross (a row per pair, BERT's outputs as the features) and --conflict-every,
    whose cosines are on the shared adapter alone: a short run, each task's adapter trained."""
    out = tmp_path / "cross"
    quiet_multitask(multitask_argv(tiny_bert_dir, data_dir, out, 2, "--peft", "lora", "--peft-scope", "per-task",
                                   "--pair-encoding", "cross", "--conflict-every", "1", proj_dim=None))
    for name, tensors in adapter_files(out / "last").items():
        assert any(v.abs().max() > 0 for k, v in tensors.items() if "lora_B" in k), name


def test_houlsby_per_task_trains_apart_resumes_bit_for_bit_and_loads_back(tiny_bert_dir, data_dir, tmp_path):
    """--peft houlsby --peft-scope per-task: one file of adapters (shared and one per task) and
    LayerNorms, equal bit for bit after a resume; each task's W_up trained and apart from the others';
    best/ read back with each task's adapter, whose predictions are the run's."""
    flags = ("--conflict-every", "0", "--peft", "houlsby", "--peft-bottleneck", "4", "--peft-scope", "per-task")
    straight, part = tmp_path / "straight", tmp_path / "part"
    quiet_multitask(multitask_argv(tiny_bert_dir, data_dir, straight, 4, *flags))
    quiet_multitask(multitask_argv(tiny_bert_dir, data_dir, part, 2, *flags))
    assert quiet_multitask(["--resume", "--out-dir", str(part), "--steps", "4"])["step"] == 4
    for name in ("heads.safetensors", "model.safetensors", HOULSBY_WEIGHTS):
        x, y = load_file(str(straight / "last" / name)), load_file(str(part / "last" / name))
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), name
    own = load_file(str(straight / "last" / HOULSBY_WEIGHTS))
    up = {t: [v for k, v in own.items() if f".adapters.{t}.up.weight" in k] for t in [SHARED, *NAMES]}
    assert all(v.abs().max() > 0 for t in up for v in up[t])
    assert any(not torch.equal(x, y) for x, y in zip(up["sst"], up["qqp"]))
    assert adapters.has_task_adapters(straight / "best")

    best = MultitaskModel.from_pretrained(straight / "best")
    assert isinstance(best.encoder.adapters, HoulsbyAdapters) and best.encoder.adapters.tasks == tuple(NAMES)
    again = tmp_path / "again"
    quiet_multitask(["--predict-only", "--checkpoint", str(straight), "--out-dir", str(again), "--device", "cpu"])
    for task in NAMES:
        name = prediction_file(task, "dev")
        assert (again / "predictions" / name).read_bytes() == (straight / "predictions" / name).read_bytes(), task


@pytest.mark.parametrize("extra, needles", [
    (["--peft-scope", "per-task"], ["--peft-scope per-task", "needs --peft"]),
    (["--peft", "lora", "--peft-scope", "per-task", "--merge"], ["--merge", "one per task"]),
    (["--peft", "lora", "--peft-scope", "per-task", "--aggregator", "pcgrad"], ["--aggregator pcgrad", "own adapter"]),
    (["--peft", "lora", "--peft-scope", "everything"], ["--peft-scope", "everything"]),
])
def test_bad_scopes_are_refused_in_one_line(tiny_bert_dir, data_dir, tmp_path, capsys, extra, needles):
    out = tmp_path / "run"
    refused(multitask_argv(tiny_bert_dir, data_dir, out, 2, *extra), capsys, *needles)
    assert not (out / "config.json").exists()
