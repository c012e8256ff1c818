"""The multitask model (the report's sections 4.3 and 5.3): one encoder and a head per task on the
sentence vector f(x) (F(x) = g^{-1}(f(x)) when the checkpoint has a flow; then its linear head,
e.g. a whitening map, when it has one), or, for a pair encoded jointly, on BERT's pooled [CLS].

What a head does depends on its task's kind and the pair encoding; that lives in
``bertcf.multitask.heads`` (one class per kind and encoding). The model runs the encoder once per
step and hands each head its rows; with one peft adapter per task (--peft-scope per-task), once per
task, each task's rows through the shared adapter and its own (:meth:`MultitaskModel.adapter_of`).

``save_pretrained(dir)`` writes the encoder checkpoint plus ``heads.safetensors`` and
``multitask.json`` (the tasks' declarations); ``from_pretrained(dir)`` rebuilds the whole model,
also from a checkpoint written before tasks were declared (its SST/QQP/STS head settings; ``legacy``).
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
import torch.nn as nn

from minbert import CheckpointError

from ..models.cross_encoder import pad_pairs
from ..models.encoder import FIRST_LAST_AVG, SentenceEncoder
from ..utils.files import save_tensors_atomic, write_json_atomic
from ..utils.precision import autocast
from .heads import TaskHead, Widths, build_head
from .legacy import checkpoint_builtin_tasks, renamed_from_para
from .tasks import Task

HEADS_FILE = "heads.safetensors"
HEADS_CONFIG_FILE = "multitask.json"
PAIR_ENCODINGS = ("bi", "cross")  # a pair's sentences encoded apart (the report's) or together


class MultitaskModel(nn.Module):
    """A :class:`SentenceEncoder` and one :class:`~bertcf.multitask.heads.TaskHead` per task
    (``heads``: task name -> head). ``tasks``: the :class:`Task` declarations, in the order of a
    step's batch; ``proj_dim``: the output width of the cosine heads; ``pair_encoding``: "bi" (a
    pair's sentences encoded apart, the report's) or "cross" (together)."""

    def __init__(self, encoder: SentenceEncoder, tasks: list[Task], proj_dim: int = 768, pair_encoding: str = "bi"):
        super().__init__()
        if pair_encoding not in PAIR_ENCODINGS:
            raise ValueError(f"pair_encoding must be one of {PAIR_ENCODINGS}, not {pair_encoding!r}")
        self.encoder = encoder
        self.tasks = {t.name: t for t in tasks}
        self.proj_dim, self.pair_encoding = proj_dim, pair_encoding
        # the heads read what the encoder returns (after its flow and linear head), or the pooler's output
        widths = Widths(sentence=encoder.output_dim, hidden=encoder.dim, proj=proj_dim)
        self.heads: dict[str, TaskHead] = {}
        for task in tasks:  # in order: the heads' initial weights are drawn one after the other
            self.heads[task.name] = build_head(task, widths, pair_encoding)
            # registered as {task}_head, the name every checkpoint's tensors have (sst_head.1.weight)
            self.add_module(f"{task.name}_head", self.heads[task.name])

    @property
    def device(self) -> torch.device:
        return self.encoder.device

    def rows_per_example(self, task: str) -> int:
        """Rows a training example of ``task`` takes in a step's batch: 2 for a pair encoded apart."""
        return self.heads[task].rows_per_example

    def forward(self, input_ids, attention_mask, sizes: dict, num_tokens: int | None = None,
                token_type_ids=None, inputs_embeds=None, return_features: bool = False):
        """One training step's outputs, from one encoder pass over all of its sentences.

        ``input_ids``, ``attention_mask`` [n, t]: the rows of each task of ``sizes`` (task ->
        number of examples, in that order), column by column: e.g. the SST sentences, then the
        QQP first and second questions, then the STS first and second sentences (see
        ``trainer.train_batch``). Returns {task: its head's output} ({'sst': logits [b, 5],
        'qqp': (p1, p2), 'sts': (p1, p2)} for the report's tasks); with ``return_features``, also
        the encoder's output that every head reads (the shared representation). One pass instead
        of one per task: fewer kernel launches, and with the unpadded encoder the common padding
        costs nothing (one per task where each task has its own adapter: :meth:`forward_each_task`).
        ``inputs_embeds``: word embeddings used instead of the ids' (SMART's perturbation). Cross:
        one row per pair, ``token_type_ids`` [n, t] theirs (:meth:`forward_joint`)."""
        if self.per_task_adapters:
            out, features = self.forward_each_task(input_ids, attention_mask, sizes, num_tokens, token_type_ids,
                                                   inputs_embeds)
        else:
            out, features = self.forward_once(input_ids, attention_mask, sizes, num_tokens, token_type_ids,
                                              inputs_embeds)
        return (out, features) if return_features else out

    def forward_once(self, input_ids, attention_mask, sizes: dict, num_tokens=None, token_type_ids=None,
                     inputs_embeds=None):
        """:meth:`forward`'s (outputs, features) from one encoder pass over every row."""
        if self.pair_encoding == "cross":
            return self.forward_joint(input_ids, attention_mask, sizes, num_tokens, token_type_ids, inputs_embeds)
        tasks = list(sizes)
        kwargs = {} if inputs_embeds is None else {"inputs_embeds": inputs_embeds}
        u = self.encoder(input_ids, attention_mask, num_tokens=num_tokens, **kwargs)  # [n, D] float32
        blocks = u.split([sizes[t] * self.heads[t].rows_per_example for t in tasks])  # each task's rows
        return {task: self.heads[task](vectors) for task, vectors in zip(tasks, blocks)}, u

    def forward_each_task(self, input_ids, attention_mask, sizes: dict, num_tokens=None, token_type_ids=None,
                          inputs_embeds=None):
        """:meth:`forward`'s (outputs, features) from one encoder pass per task, each through its
        adapters. The rows keep the step's common padding, so that the features concatenate; a
        pass counts its own real tokens (``num_tokens`` is the whole batch's)."""
        out, features, start = {}, [], 0
        for task, n in sizes.items():
            rows = slice(start, start + n * self.heads[task].rows_per_example)
            start = rows.stop
            own = [None if x is None else x[rows] for x in (token_type_ids, inputs_embeds)]
            with self.adapter_of(task):
                y, f = self.forward_once(input_ids[rows], attention_mask[rows], {task: n},
                                         num_tokens if len(sizes) == 1 else None, *own)
            out[task] = y[task]
            features.append(f)
        if isinstance(features[0], list):  # cross: BERT's outputs that the heads read, each concatenated
            return out, [torch.cat(f) for f in zip(*features)]
        return out, torch.cat(features)

    def add_adapters(self, config) -> None:
        """--peft: ``config``'s adapters (``models.peft.PeftSettings``: peft's in the encoder's Linear
        layers, or Houlsby's bottlenecks), its weights frozen; with --peft-scope per-task, one per task
        beside the shared one. A run adds them after the heads' draws (``MultitaskTrainer.build_model``),
        the bench the same way."""
        from ..models.peft import PeftSettings, make_adapters

        per_task = list(self.tasks) if config.peft_scope == "per-task" else ()
        self.encoder.adapters = make_adapters(self.encoder.bert, PeftSettings(**PeftSettings.pick(config)), per_task)

    @property
    def per_task_adapters(self) -> bool:
        """Whether the encoder has one peft adapter per task (--peft-scope per-task)."""
        return self.encoder.adapters is not None and bool(self.encoder.adapters.tasks)

    def adapter_of(self, task: str):
        """A context in which the encoder is ``task``'s: its adapter and the shared one active where
        each task has its own (--peft-scope per-task), the encoder as it is otherwise."""
        return self.encoder.adapters.of_task(task) if self.per_task_adapters else contextlib.nullcontext()

    def forward_joint(self, input_ids, attention_mask, sizes: dict, num_tokens=None, token_type_ids=None,
                      inputs_embeds=None):
        """:meth:`forward` with jointly encoded pairs: one BERT pass over the single sentences and
        the pairs (a row each), each head reading its rows (``TaskHead.forward_joint``: a sentence
        head its sentence vectors, a pair head the pooled [CLS]). Returns (outputs, the
        representations the heads read: BERT's last hidden state and pooled [CLS], and the first
        layer's output with first-last-avg pooling)."""
        encoder = self.encoder
        first_layer = encoder.pooling == FIRST_LAST_AVG
        kwargs = {} if inputs_embeds is None else {"inputs_embeds": inputs_embeds}
        out = encoder.bert(input_ids, attention_mask, token_type_ids, num_tokens=num_tokens,
                           output_first_layer=first_layer, **kwargs)
        result, start = {}, 0
        for task in sizes:
            rows = slice(start, start + sizes[task])
            start = rows.stop
            result[task] = self.heads[task].forward_joint(out, rows, attention_mask, encoder)
        features = [out["last_hidden_state"], out["pooler_output"]]  # what the sentence and the pair heads read
        if first_layer:
            features.append(out["first_layer_hidden_state"])
        return result, features

    def joint_head_outputs(self, task: str, tokens: list, types: list, batch_size: int = 128,
                           precision: str | None = None) -> torch.Tensor:
        """A joint head's outputs ([n], or [n, C] for several classes; float32, CPU, input order)
        for pairs tokenised jointly (``tokens``, ``types``: token ids and token types per pair),
        length-sorted batches, no gradient; the caller sets eval mode."""
        order = sorted(range(len(tokens)), key=lambda i: -len(tokens[i]))
        device, chunks, head = self.device, [], self.heads[task]
        with torch.inference_mode(), self.adapter_of(task):
            for start in range(0, len(order), batch_size):
                rows = order[start:start + batch_size]
                input_ids, token_types, mask = pad_pairs([tokens[i] for i in rows], [types[i] for i in rows],
                                                         self.encoder.tokenizer.pad_token_id)
                with autocast(device, precision or self.encoder.precision):
                    pooled = self.encoder.bert(input_ids.to(device), mask.to(device), token_types.to(device),
                                               num_tokens=int(mask.sum()))["pooler_output"]
                    chunks.append(head(pooled).cpu())
        width = head.linear.out_features
        y = torch.empty(len(tokens)) if width == 1 else torch.empty(len(tokens), width)
        if tokens:
            y[torch.tensor(order)] = torch.cat(chunks)
        return y

    # ---- checkpoints -------------------------------------------------------------------------
    def heads_state_dict(self) -> dict:
        return {k: v for k, v in self.state_dict().items() if not k.startswith("encoder.")}

    def settings(self) -> dict:
        """What multitask.json records: enough to rebuild the heads."""
        return {"proj_dim": self.proj_dim, "pair_encoding": self.pair_encoding,
                "tasks": [t.to_dict() for t in self.tasks.values()]}

    def save_pretrained(self, directory, extra: dict | None = None) -> None:
        """The encoder checkpoint (Hugging Face directory, flow.safetensors with a flow) plus
        ``heads.safetensors`` and ``multitask.json`` (the heads' settings; ``extra`` is added)."""
        directory = Path(directory)
        self.encoder.save_pretrained(directory)
        save_tensors_atomic(directory / HEADS_FILE, self.heads_state_dict())
        write_json_atomic(directory / HEADS_CONFIG_FILE, self.settings() | (extra or {}))

    @classmethod
    def from_pretrained(cls, path, **encoder_kwargs) -> "MultitaskModel":
        """Rebuild a model written by :meth:`save_pretrained` (a run directory stands for its
        best/). Raises CheckpointError when ``path`` is not a multitask checkpoint."""
        from safetensors.torch import load_file

        path = resolve_checkpoint(path)
        meta = checkpoint_meta(path)
        tasks = checkpoint_tasks(meta)
        encoder = SentenceEncoder.from_pretrained(path, task_adapters=[t.name for t in tasks], **encoder_kwargs)
        model = cls(encoder, tasks, meta.get("proj_dim", 768), meta.get("pair_encoding", "bi"))
        try:
            heads = renamed_from_para(load_file(str(path / HEADS_FILE)))
            result = model.load_state_dict(heads, strict=False)
            wrong = result.unexpected_keys + [k for k in result.missing_keys if not k.startswith("encoder.")]
            if wrong:
                raise ValueError(f"tensors {sorted(wrong)} do not match")
        except Exception as e:
            raise CheckpointError(f"{path / HEADS_FILE} does not fit the model ({e})") from None
        return model


def checkpoint_tasks(meta: dict) -> list[Task]:
    """The tasks of a checkpoint's multitask.json; one written before tasks were declared holds
    the settings of the report's three heads instead (sst_dropout, qqp_margin, ...)."""
    if "tasks" in meta:
        try:
            return [Task(**d) for d in meta["tasks"]]
        except Exception as e:
            raise CheckpointError(f"{HEADS_CONFIG_FILE}: a task declaration does not load ({e})") from None
    return checkpoint_builtin_tasks(meta)


def checkpoint_meta(path) -> dict:
    """The ``multitask.json`` of a checkpoint (head settings and the step it was saved at), with
    QQP's old name read as today's."""
    path = Path(path) / HEADS_CONFIG_FILE
    if not path.exists():  # a checkpoint of the report's three heads with their default settings
        return {}
    try:
        return renamed_from_para(json.loads(path.read_text()))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is missing or not readable JSON ({type(e).__name__})") from None


def resolve_checkpoint(path) -> Path:
    """A multitask checkpoint directory (holding heads.safetensors), or a run directory whose
    best/ is one."""
    p = Path(path)
    if (p / HEADS_FILE).is_file():
        return p
    if (p / "best" / HEADS_FILE).is_file():
        return p / "best"
    if not p.exists():
        raise CheckpointError(f"checkpoint {p} not found")
    raise CheckpointError(f"{p} is not a multitask checkpoint or run directory (no {HEADS_FILE} in it or in its best/)")


def run_dir_of(checkpoint: Path) -> Path:
    """The run directory a checkpoint belongs to: DIR for DIR/best (or DIR/last), else itself."""
    checkpoint = Path(checkpoint)
    return checkpoint.parent if checkpoint.name in ("best", "last") else checkpoint

