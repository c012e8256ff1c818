"""Gradient aggregation for multitask training (issue 56), on torchjd (Quinton & Rey 2024,
"Jacobian Descent for Multi-Objective Optimization").

A multitask step has one loss per task. Plain training backpropagates their sum, so the shared
encoder steps along the sum of the tasks' gradients, where one task's large gradient, or two
tasks pulling apart, can drown the others. An aggregator looks at the tasks' gradients on the
shared parameters one by one, the rows of the Jacobian J [m, n] (m tasks, n shared parameters),
and combines them into one update: PCGrad removes the conflicting components, MGDA takes the
minimum-norm convex combination, UPGrad projects each row onto the cone where no task's loss
rises, and so on (``AGGREGATORS``). Each task's head steps along its own task's gradient alone.

``--aggregator`` names, torchjd's classes and the settings used (torchjd's defaults unless said):

- ``sum``: plain ``sum(losses).backward()``, no torchjd: the training as it was, bit for bit;
- ``mean``: Mean, J's rows averaged;
- ``upgrad``: UPGrad (Quinton & Rey 2024);               needs the ``mtl-solvers`` extra (quadprog)
- ``dualproj``: DualProj (Lopez-Paz & Ranzato 2017, GEM's projection); needs ``mtl-solvers`` (quadprog)
- ``pcgrad``: PCGrad (Yu et al. 2020, "Gradient Surgery for Multi-Task Learning");
- ``mgda``: MGDA (Desideri 2012; Sener & Koltun 2018), epsilon 0.001, at most 100 iterations;
- ``cagrad``: CAGrad (Liu et al. 2021), c = 0.4, the paper's NYUv2 and CityScapes setting (torchjd
  has no default);                                         needs ``mtl-solvers`` (cvxpy)
- ``imtl-g``: IMTLG (Liu et al. 2021, "Towards Impartial Multi-task Learning");
- ``aligned-mtl``: AlignedMTL (Senushkin et al. 2023), scale_mode "min";
- ``graddrop``: GradDrop (Chen et al. 2020), f = identity, no leak; random;
- ``nash-mtl``: NashMTL (Navon et al. 2022), max_norm 1.0, weights updated every step, 20 solver
  iterations; stateful;                                   needs ``mtl-solvers`` (cvxpy, ecos)
- ``random``: Random (Lin et al. 2022, random loss weighting); random;
- ``config``: ConFIG (Liu et al. 2024);
- ``gradvac``: GradVac (Wang et al. 2021), beta 0.5, as torchjd and LibMTL; random task order,
  stateful (an EMA of the tasks' cosine similarities);
- ``fairgrad``: FairGrad (Ban & Ji 2024), alpha = 2.0, the value of the authors' run script
  (OptMN-Lab/fairgrad, experiments/quantum_chemistry/run.sh; torchjd has no default); uses scipy;
- ``excess-mtl``: ExcessMTL (He et al. 2024), torchjd's defaults; stateful (it keeps an
  [m, n] sum of squared gradients: 1.3 GB for BERT-base and three tasks);
- ``pcd``: PCD (priority-constrained descent, 2026), tau 0.02; stateful. Not symmetric: the
  *first* task of the step is the primary objective, the others constraints.

Left out: Krum and TrimmedMean (Byzantine-robust averages that need more rows than twice the
number of outliers they drop, not a handful of tasks), Constant (fixed loss weights:
``weighting.FixedWeighting`` does that without a Jacobian) and torchjd's Sum (``sum`` is the same
update without one).

Limits and how to call it:

- At least two tasks (one task has nothing to aggregate) and one process: torchjd computes the
  gradients with ``torch.autograd.grad`` and writes ``.grad`` itself, where
  DistributedDataParallel's all-reduce hooks do not see it, so each rank would step along its own
  batch's gradients and the replicas would drift apart (``check_aggregator``).
- Mixed precision: under bf16 autocast nothing changes (the parameters and so the Jacobian stay
  float32). Under fp16 with a ``GradScaler``, pass the scaled losses and ``loss_scale=
  scaler.get_scale()``: the aggregator then sees the true Jacobian (NashMTL, FairGrad, ExcessMTL
  and PCD do not scale along with their input) and the result is scaled back, so that
  ``scaler.unscale_`` and ``scaler.step`` work as usual. A Jacobian with an inf or a NaN (an fp16
  overflow, a diverged loss) is not aggregated: the shared parameters get its plain row sum, as
  ``backward`` would give, so the scaler skips the step (or the trainer reports the non-finite
  loss) and a stateful aggregator's state is not spoiled.
- The aggregation itself is torchjd's ``jac_to_grad``; with ``gramian`` (``--aggregator-gramian``)
  an aggregator of ``GRAMIAN_BASED`` gets its weights from the sum of the shared parameters'
  Gramians and never holds the Jacobian concatenated (its ``optimize_gramian_computation``: up to
  half the memory, a little slower on CUDA; the same update up to rounding, not bit for bit).
- Resuming: ``aggregator_state`` / ``load_aggregator_state`` carry a stateful aggregator's state
  (GradVac, NashMTL, ExcessMTL, PCD) in the run's training state. The random ones (graddrop,
  random, pcgrad's and gradvac's task orders) draw from torch's global generator, which the
  trainer's state already holds.
"""
from __future__ import annotations

import importlib.util
import pickle
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor
from torchjd import Stateful
from torchjd import aggregation as tja
from torchjd.autojac import backward as autojac_backward
from torchjd.autojac import jac_to_grad, mtl_backward

from ..errors import UsageError

SUM = "sum"  # plain backward of the summed losses: no torchjd, today's behaviour
SOLVERS_EXTRA = "mtl-solvers"  # pyproject.toml's extra with the solvers some aggregators need

#: name -> builder(num_tasks) of the torchjd aggregator (None for "sum"). Settings: module docstring.
AGGREGATORS: dict[str, Callable[[int], tja.Aggregator | None]] = {
    SUM: lambda num_tasks: None,
    "mean": lambda num_tasks: tja.Mean(),
    "upgrad": lambda num_tasks: tja.UPGrad(),
    "dualproj": lambda num_tasks: tja.DualProj(),
    "pcgrad": lambda num_tasks: tja.PCGrad(),
    "mgda": lambda num_tasks: tja.MGDA(),
    "cagrad": lambda num_tasks: tja.CAGrad(c=0.4),
    "imtl-g": lambda num_tasks: tja.IMTLG(),
    "aligned-mtl": lambda num_tasks: tja.AlignedMTL(),
    "graddrop": lambda num_tasks: tja.GradDrop(),
    "nash-mtl": lambda num_tasks: tja.NashMTL(n_tasks=num_tasks),
    "random": lambda num_tasks: tja.Random(),
    "config": lambda num_tasks: tja.ConFIG(),
    "gradvac": lambda num_tasks: tja.GradVac(),
    "fairgrad": lambda num_tasks: tja.FairGrad(alpha=2.0),
    "excess-mtl": lambda num_tasks: tja.ExcessMTL(),
    "pcd": lambda num_tasks: tja.PCD(),
}

#: The modules each aggregator imports beyond torch (torchjd's optional dependencies); those not
#: among this project's own dependencies come with the ``mtl-solvers`` extra.
NEEDS: dict[str, tuple[str, ...]] = {
    "upgrad": ("quadprog", "qpsolvers"),
    "dualproj": ("quadprog", "qpsolvers"),
    "cagrad": ("cvxpy", "clarabel"),
    "nash-mtl": ("cvxpy", "ecos"),
    "fairgrad": ("scipy",),  # a core dependency
}

#: Aggregators whose result depends on the earlier steps (see ``aggregator_state``).
STATEFUL = ("gradvac", "nash-mtl", "excess-mtl", "pcd")

#: Aggregators whose weights depend on the Jacobian J only through its Gramian J J^T (torchjd's
#: ``GramianWeightedAggregator``): ``gramian`` computes it parameter by parameter.
GRAMIAN_BASED = ("upgrad", "dualproj", "pcgrad", "mgda", "cagrad", "imtl-g", "aligned-mtl", "gradvac", "fairgrad",
                 "pcd")


def missing_modules(name: str) -> list[str]:
    """The modules aggregator ``name`` needs that are not installed."""
    return [m for m in NEEDS.get(name, ()) if importlib.util.find_spec(m) is None]


def _check_name(name: str) -> None:
    if name not in AGGREGATORS:
        raise UsageError(f"unknown aggregator {name!r}; choose one of: {', '.join(AGGREGATORS)}")
    missing = missing_modules(name)
    if missing:
        raise UsageError(f"aggregator {name} needs {', '.join(missing)}: pip install -e '.[{SOLVERS_EXTRA}]'")


def build_aggregator(name: str, num_tasks: int | None = None) -> tja.Aggregator | None:
    """The torchjd aggregator called ``name`` (``AGGREGATORS``), or None for ``sum``. An unknown
    name, or one whose solver is not installed, is a UsageError. ``num_tasks``: nash-mtl needs it."""
    _check_name(name)
    if name == "nash-mtl" and num_tasks is None:
        raise ValueError("nash-mtl needs num_tasks")
    return AGGREGATORS[name](num_tasks)


def check_aggregator(name: str, num_tasks: int, world_size: int = 1, gramian: bool = False) -> None:
    """Refuse, in one line (UsageError), what ``aggregated_backward`` cannot do: an unknown
    aggregator or one whose solver is missing, one other than sum with fewer than two tasks, or
    under DistributedDataParallel (``world_size`` > 1; the module's docstring says why), and
    ``gramian`` with an aggregator that is not Gramian-based."""
    _check_name(name)
    if gramian and name not in GRAMIAN_BASED:
        raise UsageError(f"--aggregator-gramian needs an aggregator whose weights come from the Gramian of the "
                         f"tasks' gradients ({', '.join(GRAMIAN_BASED)}), not {name}")
    if name == SUM:
        return
    if num_tasks < 2:
        raise UsageError(f"--aggregator {name} needs at least two tasks; with {num_tasks} there is "
                         f"nothing to aggregate: use --aggregator {SUM}")
    if world_size > 1:
        raise UsageError(f"--aggregator {name} cannot train on {world_size} processes: torchjd writes "
                         f".grad outside DistributedDataParallel's all-reduce, so the ranks would step "
                         f"apart; train on one process or use --aggregator {SUM}")


def aggregated_backward(losses: Sequence[Tensor], features: Tensor | Sequence[Tensor],
                        shared_params: Iterable[Tensor], aggregator: tja.Aggregator | None,
                        loss_scale: float | None = None, gramian: bool = False) -> Tensor | None:
    """Backward pass of one multitask step: fills (accumulates into) the parameters' ``.grad``.

    - ``losses``: one scalar per task, already weighted (``weighting``'s ``weighted`` values),
      in a fixed task order (``pcd`` reads the first as the primary task);
    - ``features``: the shared representation every task's head reads, a tensor or a list of
      them, e.g. the encoder's sentence vectors [n, D] (with jointly encoded pairs, also the
      pooled [CLS] vectors);
    - ``shared_params``: the parameters that compute ``features``, e.g. ``encoder.parameters()``
      (the frozen ones, and those ``features`` do not depend on, such as an unused pooler, are
      left alone, as ``backward`` leaves them);
    - ``aggregator``: from ``build_aggregator``; None (``sum``) backpropagates ``sum(losses)``
      as plain training does, bit for bit;
    - ``loss_scale``: a GradScaler's ``get_scale()`` when ``losses`` are scaled (fp16);
    - ``gramian``: a Gramian-based aggregator (``GRAMIAN_BASED``) takes its weights from the sum
      of the shared parameters' Gramians, the Jacobian never concatenated (torchjd's
      ``optimize_gramian_computation``): the same update up to rounding, not bit for bit.

    The shared parameters get the aggregation of the tasks' gradients on them (torchjd's
    ``jac_to_grad``); each task's own parameters, whatever its loss reaches beyond ``features`` (its
    head; a learned loss weight), their task's own gradient (when no shared parameter
    is trained, a frozen encoder, that is all, and the plain backward of the sum does it). Returns
    the weights the aggregator gave the tasks' gradients ([m], for logging) when it combines them
    linearly, else None.

    Cost: one backward through the encoder per task, and the Jacobian held twice for a moment
    (m times the shared parameters in float32: 3 x 440 MB for BERT-base; once with ``gramian``)."""
    losses = list(losses)
    if aggregator is None:
        sum(losses).backward()  # python's sum from 0, as the weighting adds the heads' losses
        return None
    if len(losses) < 2:
        raise ValueError(f"aggregated_backward needs at least two losses, got {len(losses)}")
    features = [features] if isinstance(features, Tensor) else list(features)
    reached = _leaves_of(features)
    shared = [p for p in shared_params if p.requires_grad and id(p) in reached]
    if not shared:  # a frozen encoder: nothing shared to aggregate, and each head's gradient is its own task's
        sum(losses).backward()
        return None
    # Each task's gradient on its own parameters goes to their .grad; the Jacobian of the losses
    # on the shared parameters, one row per task, to each shared parameter's .jac. One task after
    # the other (parallel_chunk_size=1): torchjd's default batches them with torch.vmap, which has
    # no batching rule for attention's backward on the CPU and does not run through the
    # torch.compile'd layers minBERT uses on a GPU (compile_layers).
    if _nested(features):
        _jacobian_backward(losses, shared)
    else:
        mtl_backward(losses, features=features, shared_params=shared, parallel_chunk_size=1)
    return _jac_to_grad(shared, aggregator, loss_scale, gramian)


def _jac_to_grad(shared: list[Tensor], aggregator: tja.Aggregator, loss_scale: float | None,
                 gramian: bool) -> Tensor | None:
    """torchjd's ``jac_to_grad`` on the shared parameters' ``.jac``: their aggregation added to
    their ``.grad`` (it frees the ``.jac``), and the weights, which it returns for a weighted
    aggregator. Around it, the two things it does not do:

    - a Jacobian with an inf or a NaN is not aggregated (a solver would fail on it, a stateful
      aggregator's state would be spoiled): its plain row sum (torchjd's ``Sum``), as ``backward``
      gives, so that the GradScaler skips the step, or the trainer reports the non-finite loss;
    - a GradScaler's scale: the aggregator sees the true Jacobian, ``.jac / loss_scale`` (NashMTL,
      FairGrad, ExcessMTL and PCD do not scale along with their input), and its update is scaled
      back before it joins ``.grad`` (which may hold SMART's scaled gradient), for ``unscale_``."""
    if not bool(torch.stack([torch.isfinite(p.jac).all() for p in shared]).all()):
        jac_to_grad(shared, tja.Sum())
        return None
    scale = 1.0 if loss_scale is None else float(loss_scale)
    if scale == 1.0:
        return jac_to_grad(shared, aggregator, optimize_gramian_computation=gramian)
    held = []
    for p in shared:
        p.jac = p.jac / scale
        held.append(p.grad)
        p.grad = None
    weights = jac_to_grad(shared, aggregator, optimize_gramian_computation=gramian)
    for p, grad in zip(shared, held):
        p.grad.mul_(scale)
        if grad is not None:
            p.grad = grad.add_(p.grad)
    return weights


def _leaves_of(tensors: Sequence[Tensor]) -> set[int]:
    """The ids of the leaf tensors (parameters) that ``tensors`` were computed from."""
    return set(_leaves(tensors))


def _leaves(tensors: Sequence[Tensor]) -> dict[int, Tensor]:
    """The leaf tensors (parameters) that ``tensors`` were computed from, by id."""
    leaves = {id(t): t for t in tensors if t.is_leaf and t.requires_grad}
    for node in _graph([t.grad_fn for t in tensors if t.grad_fn is not None]):
        if hasattr(node, "variable"):  # AccumulateGrad: where a leaf's gradient lands
            leaves[id(node.variable)] = node.variable
    return leaves


def _graph(roots: list) -> set:
    """The autograd nodes that ``roots`` reach, themselves included."""
    stack, seen = list(roots), set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return seen


def _nested(features: Sequence[Tensor]) -> bool:
    """Whether a feature is computed from another: BERT's pooled [CLS] vector from its last hidden
    state (jointly encoded pairs), the last layer from the first (first-last-avg pooling). Such
    features are no cut of the graph, which ``mtl_backward`` needs: it would go back through the
    part between them once per feature."""
    nodes = [f.grad_fn for f in features if f.grad_fn is not None]
    return any(other in _graph([child for child, _ in node.next_functions if child is not None])
               for node in nodes for other in nodes if other is not node)


def _jacobian_backward(losses: list[Tensor], shared: list[Tensor]) -> None:
    """What ``mtl_backward`` does, without features: each loss's gradient on the parameters it
    reaches beyond ``shared`` into their ``.grad`` (a head's own task's; a part several heads read,
    their sum), and the Jacobian of the losses on ``shared`` into each one's ``.jac``."""
    ids = {id(p) for p in shared}
    own = [p for i, p in _leaves(losses).items() if i not in ids]
    if own:
        torch.autograd.backward(sum(losses), inputs=own, retain_graph=True)
    autojac_backward(losses, inputs=shared, parallel_chunk_size=1)


# ---- resuming --------------------------------------------------------------------------------------
def aggregator_state(aggregator: tja.Aggregator | None) -> bytes | None:
    """A stateful aggregator's state (``STATEFUL``) for the run's training state, else None.
    torchjd keeps part of it in plain attributes that ``state_dict`` does not see, so the whole
    object is pickled."""
    return pickle.dumps(aggregator) if isinstance(aggregator, Stateful) else None


def load_aggregator_state(aggregator: tja.Aggregator | None, state: bytes | None) -> None:
    """Put back into ``aggregator`` (built by ``build_aggregator`` with the same name) the state
    ``aggregator_state`` returned."""
    if state is None:
        return
    restored = pickle.loads(state)
    if type(restored) is not type(aggregator):
        raise ValueError(f"the saved state is {type(restored).__name__}'s, not {type(aggregator).__name__}'s")
    aggregator.__dict__.update(restored.__dict__)
