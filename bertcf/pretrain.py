"""The self-supervised stages behind ``run_pretrain.py``.

- ``--stage mirror``: contrastive pretraining of the encoder (``--method mirror``: dropout +
  token-span masking, Mirror-BERT; ``--method simcse``: dropout only; ``--method bsl|ct|tsdae|mlm``:
  the other self-supervised objectives of objectives.py).
- ``--stage joint``: the encoder frozen (unless ``--unfreeze-encoder``), a Glow flow learned on
  L = lambda * L_mirror(F(x)) + L_flow (BERT-CF). ``--method simcse`` gives SimCSE-joint.
- ``--stage flow``: the flow alone on L_flow (MinBERT-flow / Mirror-flow).

Every stage evaluates unsupervised STS-dev Spearman and keeps the best checkpoint. Every stage
and method also runs data-parallel under ``torchrun --nproc_per_node N`` (``--batch-size`` stays
the global batch; see ``train``).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

from minbert import pad_batch
from minbert.model import load_state_dict_file

from . import objectives, training
from .contrastive import InfoNCE, span_mask
from .data import read_corpus, read_sts, task_file, task_sentences
from .encoder import SentenceEncoder, pool, resolve_encoder_path
from .evaluation import encode_pairs, sts_scores
from .senteval import STSB_FILES, read_stsb
from .flow import ActNorm, Glow, gaussian_nll, latent_stats
from .objectives import OBJECTIVES, build_objective
from .training import UsageError

STAGES = ("mirror", "joint", "flow")
METHODS = {"mirror": ("mirror", "simcse", *OBJECTIVES), "joint": ("mirror", "simcse"), "flow": ("flow",)}
STAGE_LR = {"mirror": 1e-4, "joint": 3e-4, "flow": 3e-4}


def build_parser() -> training.ArgumentParser:
    p = training.ArgumentParser(prog="run_pretrain.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--stage", choices=STAGES, default="mirror")
    p.add_argument("--method", default=None,
                   help="mirror (default) or simcse for --stage mirror|joint, or bsl, ct, tsdae, mlm for "
                        "--stage mirror; flow for --stage flow")
    g = p.add_argument_group("corpus")
    g.add_argument("--corpus", default=None, help="text file, one sentence per line "
                   "(default: DATA_DIR/wiki1m_for_simcse.txt when present)")
    g.add_argument("--corpus-from-tasks", action="store_true",
                   help="use the unlabeled sentences of the SST/QQP/STS training files in --data-dir")
    g.add_argument("--min-words", type=int, default=6, help="drop corpus sentences with fewer words")
    g.add_argument("--max-sentences", type=int, default=None, help="use at most this many corpus sentences")
    g = p.add_argument_group("contrastive")
    g.add_argument("--span-p", type=float, default=0.3, help="geometric success probability of the span length")
    g.add_argument("--span-cap", type=int, default=5, help="longest masked span (simcse: 0)")
    g.add_argument("--temperature", type=float, default=0.05)
    g.add_argument("--dropout", type=float, default=0.1, help="encoder dropout (hidden and attention)")
    g.add_argument("--pooling", choices=("mean", "cls"), default="mean")
    g = p.add_argument_group("flow (joint and flow stages)")
    g.add_argument("--lambda-mirror", type=float, default=0.3, help="weight of L_mirror in the joint loss")
    g.add_argument("--flow-blocks", type=int, default=3)
    g.add_argument("--flow-hidden", type=int, default=None, help="coupling network width (default: D)")
    g.add_argument("--unfreeze-encoder", action="store_true", help="joint: train the encoder by L_mirror too")
    g.add_argument("--vocab", default=None, help="vocab.txt for a checkpoint directory without tokenizer files")
    g = p.add_argument_group("model selection")
    g.add_argument("--select-on", choices=("cs224n-sts", "stsb-dev"), default="cs224n-sts",
                   help="the STS dev set that picks best/: the CS224N one (the report's) or SentEval's STS-B dev")
    g.add_argument("--senteval-dir", default=None, help="SentEval's data (default DATA_DIR/SentEval; data/README.md)")
    objectives.add_args(p)
    training.add_common_args(p, lr=None, steps=10_000, batch_size=16, eval_every=250, max_length=32)
    return p


def check_args(args) -> None:
    args.method = args.method or METHODS[args.stage][0]
    if args.method not in METHODS[args.stage]:
        raise UsageError(f"--method {args.method!r} is not a method of --stage {args.stage} "
                         f"(choose from {', '.join(METHODS[args.stage])})")
    if args.method == "simcse":
        args.span_cap = 0
    if args.lr is None:
        args.lr = STAGE_LR[args.stage]
    if args.batch_size < 2:
        raise UsageError(f"--batch-size must be at least 2 for contrastive learning, not {args.batch_size}")
    if not 0 < args.span_p <= 1:
        raise UsageError(f"--span-p must be in (0, 1], not {args.span_p}")
    if args.span_cap < 0:
        raise UsageError(f"--span-cap must be >= 0, not {args.span_cap}")
    if not args.temperature > 0:
        raise UsageError(f"--temperature must be positive, not {args.temperature}")
    if not 0 <= args.dropout < 1:
        raise UsageError(f"--dropout must be in [0, 1), not {args.dropout}")
    if args.stage == "mirror" and args.unfreeze_encoder:
        raise UsageError("--unfreeze-encoder is for --stage joint")
    if args.flow_blocks < 1:
        raise UsageError(f"--flow-blocks must be at least 1, not {args.flow_blocks}")
    objectives.check_args(args)
    if args.out_dir is None:
        args.out_dir = training.default_out_dir(args.stage, args.method)


def load_corpus(args) -> list[str]:
    if args.corpus_from_tasks:
        if args.corpus:
            raise UsageError("give either --corpus or --corpus-from-tasks, not both")
        sentences = task_sentences(args.data_dir)
        sentences = [s for s in sentences if len(s.split()) >= args.min_words]
    else:
        corpus = args.corpus or Path(args.data_dir) / "wiki1m_for_simcse.txt"
        if args.corpus is None and not Path(corpus).is_file():
            raise UsageError(f"no corpus: give --corpus FILE or --corpus-from-tasks ({corpus} not found)")
        sentences = read_corpus(corpus, min_words=args.min_words)
    if args.max_sentences:
        sentences = sentences[:args.max_sentences]
    if len(sentences) < 2:
        raise UsageError(f"the corpus has {len(sentences)} usable sentence(s); contrastive learning needs at least 2")
    return sentences


class GeneratorState:
    """Makes a torch.Generator's state part of a checkpoint (for the span sampler)."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def state_dict(self):
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state):
        self.generator.set_state(state["state"])


@torch.no_grad()
def pair_scalars(a, b) -> dict:
    """Mean cosine of the positive pairs and of all other pairs in the batch."""
    cos = torch.nn.functional.normalize(a.float(), dim=-1) @ torch.nn.functional.normalize(b.float(), dim=-1).T
    n = cos.shape[0]
    return {"pos_cosine": cos.diagonal().mean(), "neg_cosine": (cos.sum() - cos.diagonal().sum()) / (n * n - n)}


def load_encoder(args) -> SentenceEncoder:
    """The encoder to start from: --init (a run directory or checkpoint) or --model."""
    source = resolve_encoder_path(args.init) if args.init else args.model
    encoder = SentenceEncoder.from_pretrained(source, pooling=args.pooling, vocab=args.vocab,
                                              hidden_dropout_prob=args.dropout,
                                              attention_probs_dropout_prob=args.dropout)
    encoder.max_length = args.max_length
    encoder.precision = args.precision  # evaluation (encode) in the run's precision
    return encoder


def main(argv=None) -> dict:
    parser = build_parser()
    args = training.parse_args(parser, argv)
    check_args(args)
    return training.run_distributed(train, args)


def train(args, device) -> dict:
    """The run of ``args`` on ``device``. Under torchrun every rank runs this: each draws the same
    global batch (and the same views of it), keeps its own rows, and the modules the step calls
    are DistributedDataParallel, so an update equals one process's on the global batch; rank 0
    alone evaluates, logs and writes the run directory (training.Trainer)."""
    rank, world = training.dist_info()
    if args.batch_size % world:  # every rank stops here, before any collective
        raise UsageError(f"--batch-size {args.batch_size} (the global batch) is not divisible by the {world} "
                         f"processes")
    local = training.local_slice(range(args.batch_size), rank, world)
    rows = slice(local.start, local.stop)  # this rank's rows of each global batch
    if world > 1:  # the default --out-dir names the time: every rank takes rank 0's (for its messages)
        out_dir = [args.out_dir]
        torch.distributed.broadcast_object_list(out_dir, src=0)
        args.out_dir = out_dir[0]
    training.set_seed(args.seed)
    sentences = load_corpus(args)
    dev_pairs = (read_sts(task_file(args.data_dir, "sts", "dev")) if args.select_on == "cs224n-sts" else
                 read_stsb(Path(args.senteval_dir or Path(args.data_dir) / "SentEval") / STSB_FILES["dev"]))
    encoder = load_encoder(args)

    use_flow = args.stage in ("joint", "flow")
    train_encoder = args.stage == "mirror" or args.unfreeze_encoder
    if use_flow and encoder.flow is None:
        encoder.flow = Glow(encoder.dim, num_blocks=args.flow_blocks, hidden=args.flow_hidden)
    elif use_flow and rank == 0 and (encoder.flow.num_blocks, encoder.flow.hidden) != (args.flow_blocks,
                                                                                      args.flow_hidden or encoder.dim):
        print(f"note: --init already has a flow ({encoder.flow.num_blocks} blocks, coupling width "
              f"{encoder.flow.hidden}); training it on, so --flow-blocks {args.flow_blocks} and --flow-hidden "
              f"{args.flow_hidden or encoder.dim} do not apply", file=sys.stderr)
    if args.stage == "mirror":
        encoder.flow = None  # the contrastive stage trains the encoder itself
    encoder.bert.requires_grad_(train_encoder)
    encoder.to(device)
    trainable = [p for p in encoder.parameters() if p.requires_grad]

    tokenizer = encoder.tokenizer
    token_ids = tokenizer(sentences, truncation=True, max_length=args.max_length)["input_ids"]
    special_ids = torch.tensor(tokenizer.all_special_ids)
    span_generator = torch.Generator().manual_seed(args.seed)
    objective = None  # --method bsl|ct|tsdae|mlm: the objective holds the encoder and its extra modules
    if args.method in OBJECTIVES:
        objective = build_objective(args.method, encoder, args, span_generator).to(device)
        trainable = objective.trainable_parameters()
    info_nce = InfoNCE(temperature=args.temperature)
    sampler = training.EpochSampler(len(sentences), seed=args.seed)

    # What the step calls, each called once a step: under torchrun a DistributedDataParallel
    # wrapper (gradients averaged over ranks); a frozen module, or one process, gets the module
    # itself. `encoder` and `objective` stay unwrapped: evaluation, checkpoints and the Trainer
    # use them. --compile compiles minBERT layer by layer (BertModel.compile), in place.
    if args.compile:
        encoder.bert.compile()
    if objective is not None:
        step_objective = training.wrap_ddp(objective, device)
    else:
        bert = training.wrap_ddp(encoder.bert, device)
        # Every flow parameter takes part in every step's loss: no search for unused ones.
        flow = training.wrap_ddp(encoder.flow, device, find_unused_parameters=False) if use_flow else None
    # --unfreeze-encoder: ActNorm's data-dependent initialisation must see the two views only, as
    # with a frozen encoder, not the three-part batch of the joint call below (set after --resume).
    init_actnorm = False

    def embed(ids, mask):
        """f(x) for a batch on the host; no graph is built through a frozen encoder."""
        num_tokens = int(mask.sum())  # counted here, so the unpadded encoder needs no GPU sync
        ids, mask = ids.to(device, non_blocking=True), mask.to(device, non_blocking=True)
        with torch.set_grad_enabled(train_encoder):
            return pool(bert(ids, mask, num_tokens=num_tokens)["last_hidden_state"], mask, encoder.pooling)

    def step_fn(step):
        nonlocal init_actnorm
        # The global batch, padded as one process would pad it; every rank draws the same.
        ids, mask = pad_batch([token_ids[i] for i in sampler.next(args.batch_size)], tokenizer.pad_token_id)
        if args.stage == "flow":  # L_flow alone needs one view only
            u = embed(ids[rows], mask[rows])
            z, logdet = flow(u)
            l_flow = gaussian_nll(z, logdet).mean()
            return l_flow, flow_scalars(l_flow, z, logdet)
        special = torch.isin(ids, special_ids) | (mask == 0)
        if objective is not None:  # it draws its views for the global batch and encodes this rank's rows
            return step_objective(ids, mask, special, rank=rank, world=world)
        # Spans are drawn for the whole global batch, so the generator advances alike on every
        # rank (and as in one process); then each rank keeps its rows.
        masked = span_mask(ids, mask, special, tokenizer.mask_token_id, args.span_p, args.span_cap, span_generator)
        ids, masked, mask = ids[rows], masked[rows], mask[rows]
        # Both views in one forward pass: dropout masks differ per row, so they are independent.
        u, u_masked = embed(torch.cat([ids, masked]), torch.cat([mask, mask])).chunk(2)
        if not use_flow:
            return info_nce(u, u_masked), pair_scalars(u, u_masked)
        if train_encoder:
            # L_flow models the encoder's embeddings; it does not move the encoder: its rows are
            # u.detach(). One flow call for all three parts, so DDP sees one forward per step.
            if init_actnorm:
                with torch.no_grad():
                    encoder.flow(torch.cat([u, u_masked]))
                init_actnorm = False
            z_all, logdet_all = flow(torch.cat([u, u_masked, u.detach()]))
            z, z_masked, z_flow = z_all.chunk(3)
            logdet = logdet_all.chunk(3)[2]
        else:
            z_both, logdet_both = flow(torch.cat([u, u_masked]))
            z, z_masked = z_both.chunk(2)
            z_flow, logdet = z, logdet_both.chunk(2)[0]
        l_flow = gaussian_nll(z_flow, logdet).mean()
        l_mirror = info_nce(z, z_masked)
        scalars = flow_scalars(l_flow, z, logdet) | pair_scalars(z, z_masked) | {"l_mirror": l_mirror.detach()}
        return args.lambda_mirror * l_mirror + l_flow, scalars

    def flow_scalars(l_flow, z, logdet):
        return {"l_flow_per_dim": l_flow.detach() / encoder.dim, "logdet": logdet.detach().mean(),
                "latent_norm": z.detach().norm(dim=-1).mean()}

    def evaluate(step):  # rank 0 only (the Trainer); the other ranks wait at a barrier
        x, y = encode_pairs(encoder, dev_pairs)
        result = sts_scores(x, y, dev_pairs)
        run.histogram(step, "eval/sts_dev_cosines", result.pop("cosines"))
        if encoder.flow is not None:  # the latents of the first sentences, encoded above
            stats = latent_stats(x)
            result |= {"latent_mean_norm": stats["mean_norm"], "latent_log10_eig_ratio": stats["log10_eig_ratio"]}
        return result

    run = training.Run(args.out_dir, vars(args), resume=args.resume)

    def save_model(directory):
        """The encoder (and flow) checkpoint. A frozen encoder never changes during the run, so
        once a checkpoint of it exists its weights are hard-linked rather than written again at
        every evaluation (440 MB at bert-base size, twice: last/ and best/)."""
        written = [d / "model.safetensors" for d in (run.dir / "last", run.dir / "best")]
        reuse = next((f for f in written if f.is_file()), None) if not train_encoder else None
        encoder.save_pretrained(directory, link_weights_from=reuse)

    optimizer = training.make_optimizer(trainable, args.lr, args.weight_decay, device)
    scheduler = training.make_scheduler(optimizer, args.lr_schedule, args.warmup_steps, args.steps)
    # What last/training_state.pt keeps. An objective holds the encoder. A frozen encoder (the
    # joint and flow stages) is left out: last/model.safetensors holds it already, and --resume
    # loads it from there.
    frozen = objective is None and not train_encoder
    modules = {"objective": objective} if objective is not None else {"flow": encoder.flow} if frozen \
        else {"encoder": encoder}
    trainer = training.Trainer(args, run, modules, optimizer, scheduler, {"corpus": sampler},
                               metric="sts_spearman", save_model=save_model, evaluate=evaluate,
                               items_per_step=args.batch_size, extra_state={"span": GeneratorState(span_generator)})
    if args.resume:
        if frozen:  # the encoder as this run used it, whatever --init holds now
            last = training.recover_dir(run.dir / "last")
            encoder.bert.load_hf_state_dict(load_state_dict_file(last / "model.safetensors"), source=str(last))
        trainer.resume()
    if use_flow and train_encoder:
        init_actnorm = any(isinstance(m, ActNorm) and not bool(m.initialized) for m in encoder.flow.modules())
    summary = trainer.fit(step_fn, after_step=objective.after_step if objective is not None else None)
    if rank == 0:
        print(final_line(summary, run.dir))
    return summary


def final_line(summary: dict, run_dir) -> str:
    """The closing line: step-0 and best STS dev Spearman, and where the best checkpoint is."""
    def score(x):
        return "n/a" if x is None or not math.isfinite(x) else f"{x:.4f}"
    if summary["best_step"] is None:  # every evaluation gave nan (e.g. constant cosines)
        return f"STS dev Spearman: step 0 {score(summary['first'])}; no best checkpoint written"
    return (f"STS dev Spearman: step 0 {score(summary['first'])}, best {score(summary['best'])} at step "
            f"{summary['best_step']}; best checkpoint: {Path(run_dir) / 'best'}")
