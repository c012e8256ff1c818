"""Tests for bertcf/flow.py: exact invertibility, log-determinants against autograd Jacobians,
ActNorm's data-dependent init and checkpointing, NLL, a small training run, and autocast safety."""

import math

import pytest
import torch
from torch.autograd.functional import jacobian

from bertcf.evaluation.metrics import latent_stats
from bertcf.models.flow import (
    ActNorm,
    AdditiveCoupling,
    FlowBlock,
    Glow,
    InvertibleLinear,
    ReversePermutation,
    flow_loss,
    random_rotation,
)

BLOCKS = ["actnorm", "linear", "reverse", "coupling", "block", "glow", "glow-reverse"]


def build(kind, dim):
    if kind == "actnorm":
        return ActNorm(dim)
    if kind == "linear":
        return InvertibleLinear(dim)
    if kind == "reverse":
        return ReversePermutation(dim)
    if kind == "coupling":
        return AdditiveCoupling(dim, hidden=7)
    if kind == "block":
        return FlowBlock(dim, hidden=7)
    if kind == "glow":
        return Glow(dim, num_blocks=3, hidden=9)
    if kind == "glow-reverse":
        return Glow(dim, num_blocks=3, hidden=9, permutation="reverse")
    raise ValueError(kind)


@torch.no_grad()
def perturb(module, scale=0.3):
    """Add noise to every parameter (including the zero-initialised last coupling layer)."""
    for p in module.parameters():
        p.add_(scale * torch.randn_like(p))


def nontrivial(kind, dim, seed):
    """A float64 module with ActNorms initialised on a shifted/scaled batch, then all parameters
    perturbed, in eval mode."""
    torch.manual_seed(seed)
    m = build(kind, dim).double().train()
    batch = torch.randn(64, dim, dtype=torch.float64) * 2.0 + 1.0
    m(batch)  # data-dependent init of every ActNorm
    perturb(m)
    return m.eval()


# --- invertibility and log-determinants --------------------------------------------------------


@pytest.mark.parametrize("kind", BLOCKS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_inverse_roundtrip(kind, seed):
    dim = 7 if seed % 2 else 8
    m = nontrivial(kind, dim, seed)
    u = torch.randn(32, dim, dtype=torch.float64) * 3
    z, logdet = m(u)
    assert z.shape == u.shape and logdet.shape == (32,)
    assert not torch.allclose(z, u, atol=1e-2), "parameters should make the map non-trivial"
    assert torch.allclose(m.inverse(z), u, atol=1e-5, rtol=0)
    # and the other way round
    assert torch.allclose(m(m.inverse(z))[0], z, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", BLOCKS)
@pytest.mark.parametrize("dim", [4, 5, 6])
def test_logdet_matches_jacobian(kind, dim):
    m = nontrivial(kind, dim, seed=dim)
    u = torch.randn(3, dim, dtype=torch.float64)
    _, logdet = m(u)
    for i in range(u.shape[0]):
        J = jacobian(lambda v: m(v[None])[0][0], u[i])
        sign, logabsdet = torch.linalg.slogdet(J)
        assert sign != 0
        assert torch.allclose(logdet[i], logabsdet, atol=1e-8), (kind, dim, i)
    if kind in ("coupling", "reverse"):  # volume preserving
        assert torch.all(logdet == 0)
    else:
        assert logdet.abs().max() > 1e-3, "perturbed parameters should give a non-zero logdet"


# --- InvertibleLinear --------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [3, 8, 16])
def test_invertible_linear_starts_as_rotation(dim):
    torch.manual_seed(123)
    layer = InvertibleLinear(dim)
    torch.manual_seed(123)
    rotation = random_rotation(dim)
    W = layer.weight().double()
    # the LU parametrisation reconstructs exactly the sampled rotation (up to float32 storage)
    assert torch.allclose(W, rotation, atol=1e-6)
    assert torch.allclose(W @ W.T, torch.eye(dim, dtype=torch.float64), atol=1e-5)
    assert abs(torch.linalg.det(W).abs().item() - 1.0) < 1e-5
    u = torch.randn(4, dim)
    z, logdet = layer(u)
    assert torch.allclose(logdet, torch.zeros(4), atol=1e-5)
    assert torch.allclose(z.norm(dim=1), u.norm(dim=1), atol=1e-4)  # rotations preserve norms
    # structure of the factors
    L, U = layer.l_matrix(), layer.u_matrix()
    assert torch.equal(torch.diagonal(L), torch.ones(dim))
    assert torch.equal(torch.triu(L, 1), torch.zeros(dim, dim))
    assert torch.equal(torch.tril(U, -1), torch.zeros(dim, dim))
    assert torch.equal(layer.perm @ layer.perm.T, torch.eye(dim))


def test_invertible_linear_masks_ignore_dead_entries():
    torch.manual_seed(0)
    layer = InvertibleLinear(5).double()
    W0 = layer.weight().clone()
    with torch.no_grad():  # entries outside the learned triangles must not change W
        layer.lower.add_(torch.triu(torch.randn(5, 5, dtype=torch.float64)))
        layer.upper.add_(torch.tril(torch.randn(5, 5, dtype=torch.float64)))
    assert torch.equal(layer.weight(), W0)


# --- ActNorm ------------------------------------------------------------------------------------


def test_actnorm_data_dependent_init():
    torch.manual_seed(0)
    x = torch.randn(256, 6) * torch.tensor([0.1, 1.0, 10.0, 100.0, 1.0, 3.0]) + 5.0
    x[:, 4] = 3.0  # a constant dimension
    an = ActNorm(6).train()
    assert not bool(an.initialized)
    z, logdet = an(x)
    assert bool(an.initialized)
    assert torch.isfinite(z).all() and torch.isfinite(logdet).all()
    assert torch.isfinite(an.log_scale).all()
    live = [0, 1, 2, 3, 5]
    assert torch.allclose(z.mean(0), torch.zeros(6), atol=1e-4)
    assert torch.allclose(z[:, live].var(0, unbiased=False), torch.ones(5), atol=1e-4)
    assert torch.allclose(z[:, 4], torch.zeros(256), atol=1e-4)
    assert an.log_scale[4] == 0  # a dimension that does not vary is centred, not scaled by 1 / eps
    tiny = ActNorm(2).train()
    tiny(torch.stack([torch.randn(64) * 1e-32, torch.randn(64) * 1e-3], dim=1))
    assert tiny.log_scale[0] == 0 and tiny.log_scale[1] > 6  # 1e-32 is dead; 1e-3 is scaled to unit variance
    # a second, different batch does not re-initialise
    params = [p.detach().clone() for p in an.parameters()]
    z2, _ = an(x * 2 + 1)
    assert all(torch.equal(a, b) for a, b in zip(params, an.parameters()))
    assert not torch.allclose(z2[:, live].mean(0), torch.zeros(5), atol=1e-2)


def test_actnorm_no_init_in_eval_mode():
    an = ActNorm(4).eval()
    x = torch.randn(8, 4) * 5 + 2
    z, logdet = an(x)
    assert not bool(an.initialized)
    assert torch.equal(z, x) and torch.equal(logdet, torch.zeros(8))


def test_actnorm_state_dict_roundtrip():
    torch.manual_seed(1)
    x = torch.randn(64, 5) * 4 - 1
    an = ActNorm(5).train()
    an(x)
    state = an.state_dict()
    assert "initialized" in state and state["initialized"].dim() == 0
    fresh = ActNorm(5).train()
    fresh.load_state_dict(state)
    assert bool(fresh.initialized)
    y = torch.randn(16, 5) * 10 + 3  # different statistics: would change params if re-initialised
    z_ref, ld_ref = an(y)
    z, ld = fresh(y)
    assert torch.equal(z, z_ref) and torch.equal(ld, ld_ref)
    assert torch.equal(fresh.bias, an.bias) and torch.equal(fresh.log_scale, an.log_scale)


def test_glow_save_load(tmp_path):
    torch.manual_seed(2)
    g = Glow(6, num_blocks=2, hidden=5).train()
    g(torch.randn(40, 6) * 3 + 1)
    perturb(g, 0.1)
    path = tmp_path / "flow.safetensors"
    g.save(path)
    loaded = Glow.load(path, map_location="cpu")
    assert loaded.config() == g.config() == dict(dim=6, num_blocks=2, hidden=5, permutation="lu")
    actnorms = [m for m in loaded.modules() if isinstance(m, ActNorm)]
    assert len(actnorms) == 2 * 3 and all(bool(a.initialized) for a in actnorms)
    loaded.train()
    before = {k: v.clone() for k, v in loaded.state_dict().items()}
    y = torch.randn(10, 6) * 7 - 2
    z_ref, ld_ref = g(y)
    z, ld = loaded(y)
    assert torch.equal(z, z_ref) and torch.equal(ld, ld_ref)
    assert all(torch.equal(before[k], v) for k, v in loaded.state_dict().items())
    assert torch.equal(loaded.inverse(z), g.inverse(z))
    # from_config rebuilds the same architecture
    assert Glow.from_config(g.config()).state_dict().keys() == g.state_dict().keys()
    reverse = Glow(6, num_blocks=2, hidden=5, permutation="reverse")
    reverse.save(tmp_path / "reverse.safetensors")
    assert Glow.load(tmp_path / "reverse.safetensors").config()["permutation"] == "reverse"
    assert not any(isinstance(m, InvertibleLinear) for m in reverse.modules())


def test_flow_loss_units_by_hand():
    """nats: the batch mean of the NLL; bits per dimension: that / (D ln 2)."""
    nll = torch.tensor([10.0, 20.0, 60.0])
    assert flow_loss(nll, 4, "nats").item() == pytest.approx(30.0)
    assert flow_loss(nll, 4, "bits-per-dim").item() == pytest.approx(30.0 / (4 * 0.6931471805599453))
    g = nontrivial("glow", 5, seed=7)
    u = torch.randn(9, 5, dtype=torch.float64)
    nats = flow_loss(g.nll(u), 5, "nats")
    assert torch.allclose(flow_loss(g.nll(u), 5, "bits-per-dim"), nats / (5 * math.log(2)), rtol=1e-12)
    with pytest.raises(ValueError):
        flow_loss(nll, 4, "bits")


# --- init behaviour, NLL ------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [5, 8])
def test_fresh_coupling_is_identity(dim):
    torch.manual_seed(3)
    g = Glow(dim).train()
    u = torch.randn(16, dim)
    for block in g.blocks:
        z, logdet = block.coupling(u)
        assert torch.equal(z, u) and torch.equal(logdet, torch.zeros(16))
    # so a fresh Glow is linear: ActNorm and a rotation per block
    g.eval()
    z1, _ = g(u)
    z2, _ = g(2 * u)
    z0, _ = g(torch.zeros(1, dim))
    assert torch.allclose(z2 - z0, 2 * (z1 - z0), atol=1e-4)


def test_nll_matches_multivariate_normal():
    g = nontrivial("glow", 6, seed=4)
    u = torch.randn(20, 6, dtype=torch.float64) * 2
    z, logdet = g(u)
    prior = torch.distributions.MultivariateNormal(
        torch.zeros(6, dtype=torch.float64), torch.eye(6, dtype=torch.float64)
    )
    expected = -prior.log_prob(z) - logdet
    nll = g.nll(u)
    assert nll.shape == (20,)
    assert torch.allclose(nll, expected, atol=1e-10)


def test_latent_stats():
    torch.manual_seed(5)
    z = torch.randn(4000, 4)
    s = latent_stats(z)
    assert abs(s["mean_norm"] - z.norm(dim=1).mean().item()) < 1e-5
    assert 1.0 <= s["eig_ratio"] < 1.3
    z = z * torch.tensor([1.0, 1.0, 1.0, 10.0])  # variance ratio 100
    s = latent_stats(z)
    assert 70 < s["eig_ratio"] < 130
    assert abs(s["log10_eig_ratio"] - math.log10(s["eig_ratio"])) < 1e-12


# --- training ------------------------------------------------------------------------------------


def test_training_whitens_correlated_gaussian():
    torch.manual_seed(0)
    dim, n = 8, 4096
    rotation = random_rotation(dim)
    eigvals = torch.logspace(0, 3, dim, dtype=torch.float64)  # covariance spread 1e3
    A = rotation * eigvals.sqrt()  # cov = A A^T = R diag(eig) R^T: strongly correlated coordinates
    data = (torch.randn(n, dim, dtype=torch.float64) @ A.T + 4.0).float()
    data_cov = torch.cov(data.double().T)
    data_eig = torch.linalg.eigvalsh(data_cov)
    data_spread = (data_eig.max() / data_eig.min()).item()
    # the best any density can do on average here is the Gaussian's entropy
    entropy = 0.5 * torch.logdet(2 * math.pi * math.e * data_cov).item()

    g = Glow(dim, num_blocks=3).train()
    with torch.no_grad():
        nll_start = g.nll(data).mean().item()  # the first call also runs the ActNorm init
    opt = torch.optim.Adam(g.parameters(), lr=1e-2)
    for _ in range(300):
        batch = data[torch.randint(0, n, (256,))]
        loss = g.nll(batch).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    g.eval()
    with torch.no_grad():
        z, _ = g(data)
        nll_end = g.nll(data).mean().item()
    stats = latent_stats(z)

    assert math.isfinite(nll_end)
    gap_start, gap_end = nll_start - entropy, nll_end - entropy
    assert gap_start > 1.0, gap_start  # the ActNorm init alone cannot decorrelate the data
    assert gap_end < 0.1 * gap_start, (nll_start, nll_end, entropy)
    assert data_spread > 500
    assert stats["eig_ratio"] < data_spread / 100, (stats["eig_ratio"], data_spread)
    # inverse still exact after training
    assert torch.allclose(g.inverse(z), data, atol=1e-3)


@pytest.mark.parametrize("permutation", ["lu", "reverse"])
def test_training_on_embeddings_with_dead_dimensions_stays_stable(permutation):
    """Real-scale inputs: D = 384 rows of unit norm (per-dimension std ~0.05), batches of 32 (the
    joint stage's two views of 16), with all-MiniLM-L6-v2's dead dimensions (its sentence vectors
    are ~1e-32 in dimensions 127 and 223 and ~1e-9 in 319). With ActNorm scaling such a dimension by
    1 / (std + 1e-6), one AdamW step at the joint stage's lr took L_flow from -2.5 to ~600
    bits/dim (lu: the first ActNorm's bias step, times 1e6) or 3e26 (reverse: every block's ActNorm
    scales the dimension by 1e6 again, and the couplings write into it)."""
    torch.manual_seed(0)
    g = Glow(384, permutation=permutation).train()
    opt = torch.optim.AdamW(g.parameters(), lr=3e-4)
    losses = []
    for _ in range(4):
        u = torch.nn.functional.normalize(torch.randn(32, 384), dim=1)
        u[:, [127, 223]] = 1e-32 * torch.randn(32, 2)
        u[:, 319] = 1e-9 * torch.randn(32)
        loss = flow_loss(g.nll(u), 384)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses), losses
    assert max(losses) < losses[0] + 1.0, losses  # bits per dimension
    first = g.blocks[0].actnorm
    assert first.log_scale[[127, 223, 319]].abs().max() < 0.01  # centred, not scaled (drifts by lr)


# --- precision ------------------------------------------------------------------------------------


def test_float32_under_autocast():
    torch.manual_seed(6)
    g = Glow(16).train()
    u = torch.randn(8, 16)
    g(u)
    perturb(g, 0.1)
    g.eval()
    z_ref, ld_ref = g(u)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.nn.Linear(16, 16)(u).dtype == torch.bfloat16  # autocast is really on
        z, ld = g(u)
        nll = g.nll(u)
        back = g.inverse(z)
        z_bf, _ = g(u.bfloat16())
    assert z.dtype == torch.float32 and ld.dtype == torch.float32
    assert nll.dtype == torch.float32 and back.dtype == torch.float32
    assert z_bf.dtype == torch.float32
    assert torch.allclose(z, z_ref, atol=1e-6) and torch.allclose(ld, ld_ref, atol=1e-6)
    assert torch.allclose(back, u, atol=1e-4)


def test_actnorm_loading_an_uninitialised_state_initialises_again():
    """The host-side copy of the flag must follow a loaded state, both ways."""
    torch.manual_seed(2)
    x = torch.randn(64, 5) * 4 - 1
    an = ActNorm(5).train()
    an(x)
    an.load_state_dict(ActNorm(5).state_dict())  # back to an uninitialised state
    assert not bool(an.initialized)
    z, _ = an(x * 3 + 2)
    assert bool(an.initialized)
    assert torch.allclose(z.mean(0), torch.zeros(5), atol=1e-4)
