"""The bench's stage-3 step with peft's adapters (issue 68): ``multitask-lora|dora|ia3`` and their
``-per-task`` forms time the step ``run_multitask.py --peft X --peft-scope Y`` runs (its adapters, its
optimiser over the trainable parameters), beside full fine-tuning (``multitask``); each records its
trainable parameters, AdamW's state and the step's memory; the per-task forms pass the encoder once
per task; their FLOPs are those of a frozen encoder (torch's FlopCounterMode agrees); without peft
they are skipped, with the reason. On --tiny, the CPU, one step."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from bertcf.bench import models, timing
from bertcf.bench.load import LoadMonitor
from bertcf.bench.workloads import MULTITASK_VARIANTS, PEFT_VARIANTS, Multitask
from bertcf.commands import bench
from bertcf.errors import UsageError

pytestmark = pytest.mark.usefixtures("one_thread")
needs_peft = pytest.mark.skipif(not __import__("importlib.util").util.find_spec("peft"),
                                reason="peft is an optional extra: pip install -e '.[peft]'")
VARIANTS = ["multitask", *PEFT_VARIANTS]


def run_bench(*workloads, extra=()):
    return bench.run(["--tiny", "--device", "cpu", "--steps", "1", "--warmup", "0", "--minbert-only",
                      "--load-check", "0", "--workloads", ",".join(workloads), *extra],
                     monitor=LoadMonitor(reader=lambda: None))


def built(name):
    """Workload ``name`` on a tiny minBERT, its step built for minBERT, and that minBERT."""
    mb, _, _ = models.load_models(None, tiny=True)
    workload = Multitask(name, mb.config, "cpu", "fp32", 1, 11711)
    return workload, workload.build(models.Encoder(mb)), mb


def test_the_variants_are_named_and_take_the_multitask_pool():
    assert set(PEFT_VARIANTS) == {f"multitask-{m}{s}" for m in ("lora", "dora", "ia3", "houlsby")
                                 for s in ("", "-per-task")}
    assert PEFT_VARIANTS["multitask-dora-per-task"] == {"peft": "dora", "peft_scope": "per-task"}
    assert set(PEFT_VARIANTS) <= set(MULTITASK_VARIANTS)  # the seed of multitask's inputs: the same batches


@needs_peft
def test_each_variant_times_a_step_and_records_its_memory(capsys):
    results = run_bench(*VARIANTS)["results"]
    out = capsys.readouterr().out
    assert list(results) == VARIANTS
    full = results["multitask"]["minbert"]
    for name in VARIANTS:
        r, x = results[name], results[name]["minbert"]
        assert x["ms_per_step"] > 0 and x["step_peak_bytes"] > 0 and x["device_peak_bytes"] is None  # the CPU
        assert x["peak_bytes"] == x["weights_bytes"] + x["optimizer_state_bytes"] + x["step_peak_bytes"]
        assert r["per_step"]["tokens"] == results["multitask"]["per_step"]["tokens"]  # the same batches
        assert f"| {name} | {x['trainable_params']:,} |" in out  # the memory table
        if name != "multitask" and "houlsby" not in name:  # (houlsby's bottleneck of 64 is twice --tiny's width)
            assert x["trainable_params"] < full["trainable_params"]
            assert x["optimizer_state_bytes"] < full["optimizer_state_bytes"]
            assert x["weights_bytes"] > full["weights_bytes"]  # the frozen weights and the adapters
        if "ia3" in name:  # no weight gradients for the frozen encoder, IA3 no matrix: fewer FLOPs than full's
            assert r["per_step"]["flops"] < results["multitask"]["per_step"]["flops"]
        # (LoRA's rank 8 is a quarter of --tiny's width: its matrices cost more than the gradients saved)
    # one adapter per task beside the shared one: more to train than the shared one alone
    for method in ("lora", "dora", "ia3", "houlsby"):
        per_task = results[f"multitask-{method}-per-task"]["minbert"]
        assert per_task["trainable_params"] > results[f"multitask-{method}"]["minbert"]["trainable_params"]


@needs_peft
@pytest.mark.parametrize("name", list(PEFT_VARIANTS))
def test_trains_what_a_run_trains(name, tmp_path):
    """The trainable parameters are those of ``run_multitask.py --peft X --peft-scope Y``'s model
    (MultitaskTrainer.build_model, the run's budget line), the heads' and the adapters' as peft counts
    them; AdamW's state after a step is what models.peft.adamw_state_bytes says; the encoder given to
    the bench is left as it was (the adapters go into a copy)."""
    from bertcf.models.encoder import SentenceEncoder
    from bertcf.models.peft import adamw_state_bytes, budget
    from bertcf.multitask.tasks import builtin_tasks
    from bertcf.multitask.trainer import MultitaskTrainer
    from bertcf.training.optim import make_optimizer

    workload, step, mb = built(name)
    step(workload.batches[0])
    x = timing.step_memory(step, workload.batches[0], torch.device("cpu"))
    trained = [p for group in step.optimizer.param_groups for p in group["params"]]

    trainer = MultitaskTrainer(SentenceEncoder(models.load_models(None, tiny=True)[0], tokenizer=None),
                               list(builtin_tasks().values()), out_dir=str(tmp_path), **PEFT_VARIANTS[name])
    model = trainer.build_model("cpu")
    run_budget = budget(model, make_optimizer(model.parameters(), 1e-5, 0.01, "cpu"))
    heads = sum(p.numel() for head in model.heads.values() for p in head.parameters())
    settings = PEFT_VARIANTS[name]
    if settings["peft"] == "houlsby":  # 2 per layer, each W_down, b_down, W_up, b_up; every LayerNorm trained
        d, layers, m = mb.config.hidden_size, mb.config.num_hidden_layers, 64
        places = 2 * layers * (1 + 3 * (settings["peft_scope"] == "per-task"))  # shared (+ one per task)
        adapters = places * (2 * d * m + m + d) + (2 * layers + 1) * 2 * d
    else:
        adapters = model.encoder.adapters.model.get_nb_trainable_parameters()[0]
    assert x["trainable_params"] == run_budget["trainable_params"] == heads + adapters
    assert x["optimizer_state_bytes"] == adamw_state_bytes(trained)
    assert not any("lora" in n or "ia3" in n or "adapters" in n for n, _ in mb.named_modules())  # untouched
    assert all(p.requires_grad for p in mb.parameters())


@needs_peft
@pytest.mark.parametrize("method", ["lora", "dora", "ia3"])
def test_per_task_passes_the_encoder_once_per_task(method):
    """--peft-scope per-task: one encoder pass per task of the step (MultitaskModel.forward_each_task),
    the shared scope one for them all."""
    for name, passes in ((f"multitask-{method}-per-task", 3), (f"multitask-{method}", 1)):
        workload, step, _ = built(name)
        calls = []
        step.module.encoder.bert.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
        step(workload.batches[0])
        (b,) = workload.batches[0]
        assert len(calls) == passes and sum(calls) == len(b.lengths), name
        if passes == 3:  # a task's rows each: SST's sentences, QQP's and STS's pairs (two columns)
            assert calls == [32, 2 * 96, 2 * 32]


@needs_peft
@pytest.mark.parametrize("method", ["lora", "dora", "ia3", "houlsby"])
@pytest.mark.parametrize("adapters", [1, 2])
def test_adapted_flops_match_torch_flop_counter(method, adapters):
    """adapted_encoder_flops against torch's FlopCounterMode over transformers' BertModel with eager
    attention and peft's adapters (frozen weights: no weight gradients; the first layer's query, key
    and value without input gradients), forward and backward of one sentence; two adapters active
    as under --peft-scope per-task."""
    import transformers
    from torch.utils.flop_counter import FlopCounterMode

    from bertcf.models.peft import SHARED, PeftSettings, make_adapters

    config = models.load_models(None, tiny=True)[0].config
    hf_config = transformers.BertConfig.from_dict(config.to_dict())
    hf_config._attn_implementation = "eager"
    model = transformers.BertModel(hf_config, add_pooling_layer=False)
    settings = PeftSettings(peft=method)
    wrapped = make_adapters(model, settings, ("sst",) if adapters == 2 else ())
    if adapters == 2:
        wrapped.activate([SHARED, "sst"])
    ids = torch.randint(5, config.vocab_size, (1, 13), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counted:
        model.train()(input_ids=ids).last_hidden_state.sum().backward()
    assert timing.adapted_encoder_flops(config, [13], settings, adapters=adapters) == counted.get_total_flops()
    if method == "houlsby":  # (its bottlenecks of 64 and every layer's input gradients: 0.7-0.8 of full's)
        return
    # MiniLM's shape (hidden 384, 6 layers), the report's 288 sentences a step: about 2/3 of full fine-tuning's
    minilm, lengths = SimpleNamespace(hidden_size=384, num_hidden_layers=6, intermediate_size=1536), [18] * 288
    ratio = (timing.adapted_encoder_flops(minilm, lengths, settings, adapters, passes=3 if adapters == 2 else 1)
             / timing.encoder_flops(minilm, lengths, training=True))
    assert 0.65 < ratio < 0.75


def test_cpu_step_peak_counts_what_the_step_holds_at_once():
    """The step's own tensors at their most (1 + 3 MiB, then 3 + 2 MiB: 5 MiB), not what it frees of
    the tensors it found (``before``)."""
    before = [torch.empty(8 << 20, dtype=torch.uint8)]
    kept = []

    def step(_):
        before.pop()
        a = torch.empty(1 << 20, dtype=torch.uint8)
        b = torch.empty(3 << 20, dtype=torch.uint8)
        del a
        c = torch.empty(2 << 20, dtype=torch.uint8)
        kept.append(b)
        del c
    assert timing.cpu_step_peak(step, None) == 5 << 20


def test_without_peft_the_variants_are_skipped_with_the_reason(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft fails, find_spec finds nothing
    results = run_bench("multitask-lora", "multitask-ia3-per-task")["results"]
    why = 'needs the peft library: pip install -e ".[peft]"'
    assert results == {"multitask-lora": {"skipped": why}, "multitask-ia3-per-task": {"skipped": why}}
    assert f"multitask-lora: skipped ({why})" in capsys.readouterr().out


def test_compile_is_refused_with_the_peft_variants():
    with pytest.raises(UsageError, match="--compile: the peft variants"):
        run_bench("multitask", "multitask-lora", extra=("--compile",))
