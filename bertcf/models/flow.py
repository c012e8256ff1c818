"""
A Glow-style normalising flow on sentence embeddings, in one file.

References:
1) Glow: Generative Flow with Invertible 1x1 Convolutions. Kingma & Dhariwal, 2018.
   https://arxiv.org/abs/1807.03039  (ActNorm, invertible 1x1 conv in LU form)
2) On the Sentence Embeddings from Pre-trained Language Models (BERT-flow). Li et al., 2020.
   https://arxiv.org/abs/2011.05864  (a flow maps BERT sentence vectors to an isotropic Gaussian)
3) NICE: Non-linear Independent Components Estimation. Dinh et al., 2015.
   https://arxiv.org/abs/1410.8516  (additive coupling, volume preserving)

Convention used everywhere below. The generative direction is u = g(z), z ~ N(0, I); an
embedding u (the encoder's sentence vector, shape [b, D]) is mapped to its latent z = g^{-1}(u).

    forward(u) -> (z, logdet)    z: [b, D], logdet = log|det dz/du| per row: [b]
    inverse(z) -> u              exact inverse of forward
    Glow.nll(u) -> [b]           -log p(u) = 0.5*||z||^2 + 0.5*D*log(2*pi) - logdet
    flow_loss(nll, D, unit)      the batch's objective in nats or in bits per dimension

Vectors are rows; a linear layer with matrix W acts as z = u @ W.T (i.e. z_i = W u_i per row).

This file needs torch and safetensors only: a checkpoint with a flow carries a copy of it beside
its sentence-transformers module (``bertcf/models/st_flow.py``), so the model loads where BERT-CF is not
installed (``bertcf.st_format``).
"""

import json
import math

import torch
import torch.nn as nn


def _is_distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()

# -----------------------------------------------------------------------------


class ActNorm(nn.Module):
    """Per-dimension affine map with data-dependent initialisation (Glow, section 3.1).

    z = (u + bias) * exp(log_scale),   u, z: [b, D];   logdet = sum(log_scale), the same for every row.

    The first time the module sees a batch in training mode, bias and log_scale are set so that
    this batch comes out with zero mean and unit variance per dimension (population std; std + eps
    in the denominator). A dimension that does not vary in the batch (std <= eps) is centred but
    not scaled (log_scale 0): 1 / (std + eps) = 1e6 would turn the optimiser's first step on its
    bias (~lr) into a shift of ~lr * 1e6, and with a fixed permutation, which keeps the dimension
    constant and in place, every later block's ActNorm would scale by 1e6 again what the couplings
    write into it. Real encoders have such dimensions: all-MiniLM-L6-v2's pooled sentence vectors
    are ~1e-32 in two of their 384 and ~1e-9 in a third. The `initialized` buffer records the
    init, so loading a state_dict never re-initialises. Under torch.distributed the batch
    statistics are averaged across ranks (weighted by the per-rank batch size) so every rank gets
    the same init.
    """

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.bias = nn.Parameter(torch.zeros(dim))
        self.log_scale = nn.Parameter(torch.zeros(dim))
        self.register_buffer("initialized", torch.tensor(False))
        # A host-side copy of `initialized`: reading the buffer itself in every forward would
        # synchronise with the GPU once per step. Reset whenever a state_dict is loaded.
        self._known_initialized = False

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._known_initialized = False

    @torch.no_grad()
    def initialize(self, u):
        """Set bias/log_scale from the batch u [b, D] so that forward(u) has mean 0, variance 1."""
        u = u.detach().to(self.bias.dtype)
        n = torch.tensor([float(u.shape[0])], dtype=u.dtype, device=u.device)
        total = u.sum(dim=0)
        if _is_distributed():
            torch.distributed.all_reduce(n)
            torch.distributed.all_reduce(total)
        mean = total / n
        sq = ((u - mean) ** 2).sum(dim=0)
        if _is_distributed():
            torch.distributed.all_reduce(sq)
        std = (sq / n).sqrt()
        self.bias.copy_(-mean)
        self.log_scale.copy_(torch.where(std > self.eps, -torch.log(std + self.eps), 0.0))
        self.initialized.fill_(True)

    def logdet(self, u):
        """log|det dz/du| for each row of u: [b]."""
        return self.log_scale.sum().expand(u.shape[0])

    def forward(self, u):
        if self.training and not self._known_initialized:
            if not bool(self.initialized):
                self.initialize(u)
            self._known_initialized = True
        z = (u + self.bias) * torch.exp(self.log_scale)
        return z, self.logdet(u)

    def inverse(self, z):
        return z * torch.exp(-self.log_scale) - self.bias


class InvertibleLinear(nn.Module):
    """The invertible 1x1 convolution of Glow (section 3.2), for vectors, in LU form.

    W = P @ L @ (U + diag(sign_s * exp(log_abs_s))),   W: [D, D]
      P  fixed permutation matrix (buffer)
      L  unit lower triangular: only the strictly-lower part is learned (masked)
      U  strictly upper triangular (masked)
      sign_s fixed signs (buffer), log_abs_s learned.
    z = u @ W.T (row i: z_i = W u_i), logdet = sum(log_abs_s) for every row.
    The inverse uses the permutation and two triangular solves; no general matrix inverse.
    Initialised as a random orthogonal matrix (|det W| = 1), see `random_rotation`.
    """

    def __init__(self, dim):
        super().__init__()
        self.dim = dim
        w0 = random_rotation(dim)
        P, L, U = torch.linalg.lu(w0)  # w0 = P @ L @ U, float64
        s = torch.diagonal(U)
        self.register_buffer("perm", P.float())
        self.register_buffer("sign_s", torch.sign(s).float())
        self.lower = nn.Parameter(torch.tril(L, -1).float())
        self.upper = nn.Parameter(torch.triu(U, 1).float())
        self.log_abs_s = nn.Parameter(torch.log(s.abs()).float())
        # masks are derived, not state: keep them out of the checkpoint
        self.register_buffer("lower_mask", torch.tril(torch.ones(dim, dim), -1), persistent=False)
        self.register_buffer("eye", torch.eye(dim), persistent=False)

    def l_matrix(self):
        return self.lower * self.lower_mask + self.eye

    def u_matrix(self):
        """U + diag(sign_s * exp(log_abs_s)): upper triangular with the learned diagonal."""
        return self.upper * self.lower_mask.T + torch.diag(self.sign_s * torch.exp(self.log_abs_s))

    def weight(self):
        """W = P @ L @ (U + diag(s)): [D, D]."""
        return self.perm @ self.l_matrix() @ self.u_matrix()

    def logdet(self, u):
        return self.log_abs_s.sum().expand(u.shape[0])

    def forward(self, u):
        z = u @ self.weight().T
        return z, self.logdet(u)

    def inverse(self, z):
        # u_i = (U+S)^{-1} L^{-1} P^T z_i; with rows: P^T z_i  <->  z @ P
        y = (z @ self.perm).T  # [D, b]
        y = torch.linalg.solve_triangular(self.l_matrix(), y, upper=False, unitriangular=True)
        u = torch.linalg.solve_triangular(self.u_matrix(), y, upper=True)
        return u.T


def random_rotation(dim):
    """A random orthogonal matrix [dim, dim] (float64): QR of a Gaussian matrix drawn from torch's
    global RNG, with the signs of R's diagonal folded into Q (Haar-distributed). |det| = 1."""
    q, r = torch.linalg.qr(torch.randn(dim, dim, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


class ReversePermutation(nn.Module):
    """A fixed reversal of the dimensions, z = u[:, ::-1] (logdet 0): the permutation of the
    BERT-flow implementations the report cites (RealNVP/Glow's "reverse" option), offered beside the
    learned 1x1 map to compare with (``Glow(..., permutation="reverse")``)."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, u):
        return u.flip(1), u.new_zeros(u.shape[0])

    def inverse(self, z):
        return z.flip(1)


PERMUTATIONS = {"lu": InvertibleLinear, "reverse": ReversePermutation}


class AdditiveCoupling(nn.Module):
    """NICE additive coupling (Dinh et al. 2015), as used in Glow.

    u = [u1, u2] with u1: [b, d], d = dim // 2, u2: [b, dim - d]
    z = [u1, u2 + t(u1)],   t: Linear(d, h) -> ActNorm -> ReLU -> Linear(h, h) -> ActNorm -> ReLU
                               -> Linear(h, dim - d), last layer zero-initialised (identity at init).
    logdet = 0 (volume preserving). The ActNorms live inside the shift network t, so they do not
    enter the flow's Jacobian; the layer stays exactly invertible: u2 = z2 - t(z1).
    """

    def __init__(self, dim, hidden):
        super().__init__()
        assert dim >= 2, "coupling needs at least two dimensions"
        self.dim = dim
        self.d = dim // 2
        self.net = nn.Sequential(
            nn.Linear(self.d, hidden),
            ActNorm(hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            ActNorm(hidden),
            nn.ReLU(),
            nn.Linear(hidden, dim - self.d),
        )
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def shift(self, u1):
        out = u1
        for layer in self.net:
            out = layer(out)
            if isinstance(out, tuple):  # ActNorm returns (h, logdet); the logdet is not used here
                out = out[0]
        return out

    def forward(self, u):
        u1, u2 = u[:, : self.d], u[:, self.d :]
        z = torch.cat([u1, u2 + self.shift(u1)], dim=1)
        return z, u.new_zeros(u.shape[0])

    def inverse(self, z):
        z1, z2 = z[:, : self.d], z[:, self.d :]
        return torch.cat([z1, z2 - self.shift(z1)], dim=1)


class FlowBlock(nn.Module):
    """One step of flow (Glow, figure 2a): ActNorm -> InvertibleLinear (or ReversePermutation) ->
    AdditiveCoupling. forward(u [b, D]) -> (z [b, D], logdet [b]) summing the three logdets;
    inverse runs backwards."""

    def __init__(self, dim, hidden, permutation="lu"):
        super().__init__()
        self.actnorm = ActNorm(dim)
        self.linear = PERMUTATIONS[permutation](dim)
        self.coupling = AdditiveCoupling(dim, hidden)

    def forward(self, u):
        logdet = 0
        x = u
        for layer in (self.actnorm, self.linear, self.coupling):
            x, ld = layer(x)
            logdet = logdet + ld
        return x, logdet

    def inverse(self, z):
        x = z
        for layer in (self.coupling, self.linear, self.actnorm):
            x = layer.inverse(x)
        return x


class Glow(nn.Module):
    """A stack of `num_blocks` FlowBlocks (hidden width defaults to dim) mapping embeddings u [b, D]
    to latents z [b, D] with a standard normal prior (BERT-flow, Li et al. 2020).

    Numerics: forward/inverse/nll compute in float32 (float64 if the input is float64, e.g. in tests;
    then the module must be `.double()` too) with autocast disabled, so bf16/fp16 autocast in the
    surrounding code never reaches the flow. Outputs are in that compute dtype.
    """

    def __init__(self, dim, num_blocks=3, hidden=None, permutation="lu"):
        super().__init__()
        if permutation not in PERMUTATIONS:
            raise ValueError(f"permutation must be one of {tuple(PERMUTATIONS)}, not {permutation!r}")
        self.dim = dim
        self.num_blocks = num_blocks
        self.hidden = dim if hidden is None else hidden
        self.permutation = permutation
        self.blocks = nn.ModuleList([FlowBlock(dim, self.hidden, permutation) for _ in range(num_blocks)])

    # --- config / checkpoint -------------------------------------------------------------------

    def config(self):
        return dict(dim=self.dim, num_blocks=self.num_blocks, hidden=self.hidden, permutation=self.permutation)

    @classmethod
    def from_config(cls, d):
        return cls(dim=d["dim"], num_blocks=d.get("num_blocks", 3), hidden=d.get("hidden"),
                   permutation=d.get("permutation", "lu"))

    def save(self, path):
        """Write the state_dict to a safetensors file with the config JSON in metadata['config'].
        (BERT-CF's checkpoints write it through ``bertcf.utils.files.atomic_path``.)"""
        from safetensors.torch import save_file

        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(path), metadata={"config": json.dumps(self.config())})

    @classmethod
    def load(cls, path, map_location="cpu"):
        """A flow written by :meth:`save`; a missing, truncated or corrupt file is a ValueError
        naming it."""
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                config = json.loads(f.metadata()["config"])
                state = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as e:  # SafetensorError, a missing file or an unreadable config
            raise ValueError(f"{path} is truncated or corrupt ({type(e).__name__}: {str(e)[:120]}); "
                             f"write it again from its run, or use another checkpoint") from None
        model = cls.from_config(config)
        dtype = next((v.dtype for v in state.values() if v.is_floating_point()), torch.float32)
        model.to(dtype).load_state_dict(state)
        return model.to(torch.device(map_location) if map_location is not None else torch.device("cpu"))

    # --- the flow ------------------------------------------------------------------------------

    @staticmethod
    def _compute_dtype(x):
        return torch.float64 if x.dtype == torch.float64 else torch.float32

    def forward(self, u):
        """u [b, D] -> (z [b, D], logdet [b]) with logdet = log|det dz/du|."""
        with torch.autocast(device_type=u.device.type, enabled=False):
            x = u.to(self._compute_dtype(u))
            logdet = x.new_zeros(x.shape[0])
            for block in self.blocks:
                x, ld = block(x)
                logdet = logdet + ld
            return x, logdet

    def inverse(self, z):
        """z [b, D] -> u [b, D]."""
        with torch.autocast(device_type=z.device.type, enabled=False):
            x = z.to(self._compute_dtype(z))
            for block in reversed(self.blocks):
                x = block.inverse(x)
            return x

    def nll(self, u):
        """-log p(u) per row [b] = 0.5*||z||^2 + 0.5*D*log(2*pi) - logdet (in nats)."""
        with torch.autocast(device_type=u.device.type, enabled=False):
            return gaussian_nll(*self(u))


def gaussian_nll(z, logdet):
    """-log N(z; 0, I) - logdet per row [b]: the flow's NLL from an existing forward pass."""
    return 0.5 * (z**2).sum(dim=1) + 0.5 * z.shape[1] * math.log(2 * math.pi) - logdet


FLOW_LOSS_UNITS = ("bits-per-dim", "nats")


def flow_loss(nll, dim, unit="bits-per-dim"):
    """L_flow, the batch mean of the per-row NLL [b] (nats, summed over the D = ``dim`` dimensions):
    in "nats" as it is, in "bits-per-dim" divided by D * ln 2. Bits per dimension is the unit of
    the BERT-flow implementations (Li et al. 2020; UKPLab's pytorch-bertflow), so a fixed weight
    on another loss beside it (BERT-CF's 0.3 * L_mirror) means the same at every D."""
    if unit not in FLOW_LOSS_UNITS:
        raise ValueError(f"unit must be one of {FLOW_LOSS_UNITS}, not {unit!r}")
    mean = nll.mean()
    return mean / (dim * math.log(2)) if unit == "bits-per-dim" else mean
