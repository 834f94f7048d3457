"""PALBERT mode, model-independent parts (docs/method.md section (b), B3–B9).

Acceptance: p sums to 1 (B4); KL by hand, both directions (B6); Q-exit hand cases (B9); sampled exits
follow p (chi-square); PABEE patience; online == offline for every exit rule; metrics equal
scikit-learn / scipy (B8); GLUE loading gives the documented row counts and label sets; malformed TSVs
raise errors naming file and line.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats
from sklearn import metrics as skm

from adaponder.palbert import glue, metrics
from adaponder.palbert.pondernet import (
    ExitController,
    LambdaLayer,
    exit_distribution,
    expected_prediction,
    gather_at_exit,
    geometric_prior,
    kl_regulariser,
    last_exit,
    log_exit_distribution,
    pabee_exit,
    pabee_loss,
    per_pass_loss,
    pondernet_loss,
    q_exit,
    reconstruction_loss,
    sample_exit,
)

# Same convention as tests/conftest.py: the shared data pack sits next to the repository.
SHARED_DATA = Path(os.environ.get("ADAPONDER_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
GLUE_DIR = SHARED_DATA / "glue"


def _random_lambdas(b: int, n: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """λ in (0, 1) with a share of values within 1e-7 of 0 and 1, plus exact 0s, 1s and 0.5s."""
    g = torch.Generator().manual_seed(seed)
    lam = torch.rand(b, n, generator=g, dtype=torch.float64)
    pick = torch.rand(b, n, generator=g)
    lam = torch.where(pick < 0.1, lam * 1e-7, lam)
    lam = torch.where((pick >= 0.1) & (pick < 0.2), 1 - lam * 1e-7, lam)
    lam = torch.where((pick >= 0.2) & (pick < 0.23), torch.zeros_like(lam), lam)
    lam = torch.where((pick >= 0.23) & (pick < 0.26), torch.ones_like(lam), lam)
    lam = torch.where((pick >= 0.26) & (pick < 0.35), torch.full_like(lam, 0.5), lam)
    return lam.to(dtype)


# ------------------------------------------------------------------------------------------- B3


def test_lambda_layer_palbert_B3_formula_and_shapes() -> None:
    torch.manual_seed(0)
    d = 8
    layer = LambdaLayer(d, dropout=0.1, mode="palbert", init_bias=-2.0).eval()
    linears = [m for m in layer.phi if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 3 and all(m.in_features == m.out_features == 2 * d for m in linears)
    assert sum(isinstance(m, torch.nn.Tanh) for m in layer.phi) == 3
    assert layer.out.in_features == 2 * d and torch.all(layer.out.bias == -2.0)

    c, c_prev = torch.randn(5, d), torch.randn(5, d)
    x = torch.cat([c, c_prev], dim=-1)
    for lin in linears:  # φ = 3 × (Linear 2d→2d, tanh)
        x = torch.tanh(lin(x))
    expected = torch.sigmoid(x @ layer.out.weight[0] + layer.out.bias)
    lam = layer(c, c_prev)
    assert lam.shape == (5,)
    torch.testing.assert_close(lam, expected)
    # c_0 = 0 (B3)
    torch.testing.assert_close(layer(c), layer(c, torch.zeros_like(c)))
    torch.testing.assert_close(layer.logits(c, c_prev).sigmoid(), lam)


def test_lambda_layer_pondernet_baseline_B3() -> None:
    torch.manual_seed(0)
    layer = LambdaLayer(6, dropout=0.0, mode="pondernet", init_bias=0.25)
    assert [type(m) for m in layer.modules()].count(torch.nn.Linear) == 1
    c = torch.randn(3, 4, 6)
    expected = torch.sigmoid(c @ layer.out.weight[0] + 0.25)
    torch.testing.assert_close(layer(c, c_prev=torch.randn(3, 4, 6)), expected)  # c_prev ignored
    with pytest.raises(ValueError):
        LambdaLayer(6, mode="act")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- B4


def test_exit_distribution_B4_hand_example() -> None:
    lam = torch.tensor([[0.5, 0.5, 0.5], [0.2, 0.5, 0.9], [1.0, 0.3, 0.3]])
    p = exit_distribution(lam)
    # p_1 = λ_1, p_2 = λ_2 (1 − λ_1), p_N = (1 − λ_1)(1 − λ_2); λ_N unused
    expected = torch.tensor([[0.5, 0.25, 0.25], [0.2, 0.4, 0.4], [1.0, 0.0, 0.0]])
    torch.testing.assert_close(p, expected)
    torch.testing.assert_close(exit_distribution(torch.tensor([[0.7]])), torch.tensor([[1.0]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exit_distribution_B4_sums_to_one(dtype: torch.dtype) -> None:
    for n in (1, 2, 4, 12):
        lam = _random_lambdas(512, n, seed=n, dtype=dtype)
        p = exit_distribution(lam)
        assert p.shape == lam.shape and torch.all(p >= 0)
        tol = 1e-6 if dtype == torch.float32 else 1e-14
        torch.testing.assert_close(p.sum(dim=1), torch.ones(512, dtype=dtype), atol=tol, rtol=0)
        # Against the B4 product formula evaluated term by term in float64.
        lam64 = lam.double()
        ref = torch.empty_like(lam64)
        for i in range(n):
            surv = torch.prod(1 - lam64[:, :i], dim=1)
            ref[:, i] = surv * lam64[:, i] if i < n - 1 else surv
        torch.testing.assert_close(p.double(), ref, atol=tol, rtol=0)


def test_exit_distribution_B4_gradients_finite_at_saturation() -> None:
    lam = torch.tensor([[1.0, 0.0, 1.0 - 1e-7, 0.5], [0.0, 0.0, 0.0, 0.0]], requires_grad=True)
    p = exit_distribution(lam)
    (p * torch.arange(1.0, 5.0)).sum().backward()
    assert lam.grad is not None and torch.all(torch.isfinite(lam.grad))


def test_log_exit_distribution_B4_matches_and_stays_finite() -> None:
    z = torch.randn(64, 6, dtype=torch.float64) * 3
    torch.testing.assert_close(log_exit_distribution(z).exp(), exit_distribution(torch.sigmoid(z)))
    z_big = torch.tensor([[40.0, 40.0, 40.0], [-40.0, -40.0, -40.0]], requires_grad=True)
    log_p = log_exit_distribution(z_big)
    assert torch.all(torch.isfinite(log_p))
    torch.testing.assert_close(log_p.exp().sum(1), torch.ones(2, dtype=log_p.dtype))
    log_p[:, 1].sum().backward()
    assert torch.all(torch.isfinite(z_big.grad))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- B5–B7


def test_geometric_prior_B6() -> None:
    prior = geometric_prior(4, 0.1, dtype=torch.float64)
    torch.testing.assert_close(prior, torch.tensor([0.1, 0.09, 0.081, 0.729], dtype=torch.float64))
    for n in (1, 3, 12):
        assert abs(geometric_prior(n).sum().item() - 1.0) < 1e-6
    with pytest.raises(ValueError):
        geometric_prior(4, 0.0)


def test_kl_regulariser_B6_hand_computation_both_directions() -> None:
    p = torch.tensor([[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]], dtype=torch.float64)
    prior = torch.tensor([0.1, 0.09, 0.81], dtype=torch.float64)  # geometric_prior(3, 0.1)
    torch.testing.assert_close(geometric_prior(3, 0.1, dtype=torch.float64), prior)

    def kl(a: list[float], b: list[float]) -> float:
        return sum(x * math.log(x / y) for x, y in zip(a, b) if x > 0)

    rows, g = p.tolist(), prior.tolist()
    # KL(p_G ‖ p): PALBERT's code, the default.
    want_prior_to_p = (kl(g, rows[0]) + kl(g, rows[1])) / 2
    # Spelled out for row 0: 0.1 ln(0.1/0.5) + 0.09 ln(0.09/0.25) + 0.81 ln(0.81/0.25)
    row0 = 0.1 * math.log(0.2) + 0.09 * math.log(0.36) + 0.81 * math.log(3.24)
    assert abs(kl(g, rows[0]) - row0) < 1e-15
    want_p_to_prior = (kl(rows[0], g) + kl(rows[1], g)) / 2
    assert abs(kl_regulariser(p, prior).item() - want_prior_to_p) < 1e-12
    assert abs(kl_regulariser(p, prior, "prior_to_p").item() - want_prior_to_p) < 1e-12
    assert abs(kl_regulariser(p, prior, "p_to_prior").item() - want_p_to_prior) < 1e-12
    assert abs(kl_regulariser(p, prior, log_p=p.log()).item() - want_prior_to_p) < 1e-12
    # Matches torch's KLDivLoss(batchmean) as PALBERT's code computes it.
    ref = torch.nn.KLDivLoss(reduction="batchmean")(p.log(), prior.expand_as(p))
    torch.testing.assert_close(kl_regulariser(p, prior), ref)
    assert kl_regulariser(prior[None], prior).abs().item() < 1e-15
    with pytest.raises(ValueError):
        kl_regulariser(p, prior, "forward")  # type: ignore[arg-type]


def test_kl_regulariser_B6_zero_mass_is_finite() -> None:
    p = exit_distribution(torch.tensor([[1.0, 0.5, 0.5]], requires_grad=True))  # p = [1, 0, 0]
    prior = geometric_prior(3)
    for direction in ("prior_to_p", "p_to_prior"):
        val = kl_regulariser(p, prior, direction)  # type: ignore[arg-type]
        assert torch.isfinite(val)
    z = torch.tensor([[30.0, 0.0, 0.0]], requires_grad=True)
    log_p = log_exit_distribution(z)
    val = kl_regulariser(log_p.exp(), prior, log_p=log_p)
    val.backward()
    assert torch.isfinite(val) and torch.all(torch.isfinite(z.grad))  # type: ignore[arg-type]


def test_reconstruction_loss_B5_classification_and_regression() -> None:
    torch.manual_seed(1)
    b, n, c = 4, 3, 5
    logits = torch.randn(b, n, c)
    labels = torch.randint(0, c, (b,))
    p = exit_distribution(torch.rand(b, n))
    want = sum(
        sum(p[bi, i] * F.cross_entropy(logits[bi, i][None], labels[bi][None]) for i in range(n)) for bi in range(b)
    ) / b
    torch.testing.assert_close(reconstruction_loss(logits, labels, p), want)

    preds, y = torch.randn(b, n), torch.rand(b) * 5
    want_mse = ((preds - y[:, None]) ** 2 * p).sum(1).mean()
    torch.testing.assert_close(reconstruction_loss(preds, y, p), want_mse)
    torch.testing.assert_close(reconstruction_loss(preds[..., None], y, p), want_mse)  # [B, N, 1] heads
    assert per_pass_loss(logits, labels).shape == (b, n)


def test_pondernet_loss_B7_defaults() -> None:
    torch.manual_seed(2)
    logits = torch.randn(6, 4, 2)
    labels = torch.randint(0, 2, (6,))
    p = exit_distribution(torch.rand(6, 4))
    total, parts = pondernet_loss(logits, labels, p)
    rec = reconstruction_loss(logits, labels, p)
    reg = kl_regulariser(p, geometric_prior(4, 0.1), "prior_to_p")
    torch.testing.assert_close(parts["rec"], rec)
    torch.testing.assert_close(parts["reg"], reg)
    torch.testing.assert_close(total, rec + 0.5 * reg)  # β = 0.5, λ_p = 0.1
    total2, parts2 = pondernet_loss(logits, labels, p, beta=2.0, lambda_p=0.3, direction="p_to_prior")
    torch.testing.assert_close(total2, rec + 2.0 * kl_regulariser(p, geometric_prior(4, 0.3), "p_to_prior"))


def test_pabee_loss_weighted_by_depth() -> None:
    torch.manual_seed(3)
    logits = torch.randn(5, 4, 3)
    labels = torch.randint(0, 3, (5,))
    l_i = [F.cross_entropy(logits[:, i], labels).item() for i in range(4)]
    want = sum((i + 1) * l for i, l in enumerate(l_i)) / (1 + 2 + 3 + 4)
    assert abs(pabee_loss(logits, labels).item() - want) < 1e-6
    preds, y = torch.randn(5, 4), torch.randn(5)
    want_r = sum((i + 1) * F.mse_loss(preds[:, i], y).item() for i in range(4)) / 10
    assert abs(pabee_loss(preds, y).item() - want_r) < 1e-6


# ------------------------------------------------------------------------------------------- B9 and rules


def test_q_exit_B9_hand_examples() -> None:
    p = torch.tensor(
        [
            [0.6, 0.2, 0.1, 0.1],  # CDF 0.6 > 0.5 at pass 1
            [0.5, 0.25, 0.125, 0.125],  # CDF exactly 0.5 at pass 1 is not > q: pass 2
            [0.1, 0.1, 0.1, 0.7],  # never exceeds before N: last pass
            [0.0, 0.0, 0.0, 1.0],
            [0.2, 0.2, 0.2, 0.4],  # 0.2, 0.4, 0.6: pass 3
        ]
    )
    assert q_exit(p).tolist() == [0, 1, 3, 3, 2]
    assert q_exit(p, q=1.0).tolist() == [3, 3, 3, 3, 3]  # q >= 1 never triggers
    assert q_exit(p, q=0.0).tolist() == [0, 0, 0, 3, 0]
    assert q_exit(p, q=0.7).tolist() == [1, 1, 3, 3, 3]
    # Exact binary tie through B4: λ = 1/2 gives CDF 0.5, 0.75, ... so Q-exit at q = 0.5 is pass 2.
    assert q_exit(exit_distribution(torch.full((1, 5), 0.5))).tolist() == [1]


def test_sample_exit_follows_exit_distribution_chi_square() -> None:
    lam = torch.tensor([0.3, 0.2, 0.5, 0.1, 0.9], dtype=torch.float64)
    p = exit_distribution(lam[None])[0]
    n_samples = 20_000
    g = torch.Generator().manual_seed(1234)
    idx = sample_exit(lam[None].expand(n_samples, -1), generator=g)
    observed = np.bincount(idx.numpy(), minlength=5)
    res = stats.chisquare(observed, f_exp=p.numpy() * n_samples)
    assert res.pvalue > 1e-3, (observed, p)
    # λ = 1 always halts, λ = 0 never does.
    assert sample_exit(torch.tensor([[0.0, 1.0, 0.0]]), torch.Generator().manual_seed(0)).tolist() == [1]
    assert sample_exit(torch.zeros(3, 4), torch.Generator().manual_seed(0)).tolist() == [3, 3, 3]


def test_pabee_exit_patience_hand_sequences() -> None:
    ids = torch.tensor(
        [
            [0, 0, 0, 0, 0],  # counter 0,1,2 -> exits at pass 3 (t = 2)
            [0, 1, 1, 1, 0],  # 0,0,1,2 -> pass 4
            [0, 1, 0, 1, 0],  # never -> N
            [1, 1, 0, 0, 0],  # 0,1,0,1,2 -> pass 5 (reset after a change)
        ]
    )
    assert pabee_exit(ids, patience=2).tolist() == [2, 3, 4, 4]
    assert pabee_exit(ids, patience=1).tolist() == [1, 2, 4, 1]
    assert pabee_exit(ids, patience=4).tolist() == [4, 4, 4, 4]
    logits = F.one_hot(ids, 3).float() * 5 + 0.1 * torch.randn(4, 5, 3)  # argmax == ids
    assert pabee_exit(logits, patience=2).tolist() == [2, 3, 4, 4]
    reg = torch.tensor([[1.0, 1.1, 1.15, 2.0], [1.0, 1.5, 1.6, 1.65], [0.0, 0.3, 0.6, 0.9]])
    # |Δ| < 0.2 counts as unchanged
    assert pabee_exit(reg, 2, regression_threshold=0.2).tolist() == [2, 3, 3]
    assert pabee_exit(reg[..., None], 1, regression_threshold=0.2).tolist() == [1, 2, 3]
    with pytest.raises(ValueError):
        pabee_exit(ids, patience=0)
    with pytest.raises(ValueError):
        pabee_exit(reg, patience=1)  # float [B, N] without a threshold is ambiguous


def test_last_exit_expectation_and_gather() -> None:
    assert last_exit(3, 4).tolist() == [3, 3, 3]
    p = torch.tensor([[0.5, 0.25, 0.25]])
    logits = torch.log(torch.tensor([[[0.9, 0.1], [0.2, 0.8], [0.4, 0.6]]]))
    probs = expected_prediction(logits, p)
    want = [[0.5 * 0.9 + 0.25 * 0.2 + 0.25 * 0.4, 0.5 * 0.1 + 0.25 * 0.8 + 0.25 * 0.6]]  # Σ_i p_i softmax(ŷ_i)
    torch.testing.assert_close(probs, torch.tensor(want))
    torch.testing.assert_close(expected_prediction(torch.tensor([[1.0, 2.0, 4.0]]), p, regression=True),
                               torch.tensor([2.0]))  # 0.5·1 + 0.25·2 + 0.25·4
    out = torch.arange(24.0).view(2, 3, 4)
    torch.testing.assert_close(gather_at_exit(out, torch.tensor([2, 0])), torch.stack([out[0, 2], out[1, 0]]))


def _run_online(rule: str, lambdas: torch.Tensor, preds: torch.Tensor,
                **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Drive ExitController as a model would: feed only running rows, drop exited rows, keep their ŷ."""
    b, n = lambdas.shape
    ctrl = ExitController(rule, n, b, **kw)  # type: ignore[arg-type]
    out = torch.full((b, *preds.shape[2:]), float("nan"), dtype=torch.float64)
    passes = 0
    while not ctrl.done:
        rows, i = ctrl.active, ctrl.pass_idx
        lam_i = None if i == n - 1 else lambdas[rows, i]  # λ_N is never needed
        exits = ctrl.step(lambdas=lam_i, preds=preds[rows, i])
        out[rows[exits]] = preds[rows, i][exits].double()
        passes += 1
    assert passes <= n and torch.all(ctrl.exit_idx >= 0)
    return ctrl.exit_idx, out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("q", [0.5, 0.3, 0.9, 1.0])
def test_online_matches_offline_q_exit(dtype: torch.dtype, q: float) -> None:
    lam = _random_lambdas(1000, 7, seed=11, dtype=dtype)
    preds = torch.randn(1000, 7, 3)
    offline = q_exit(exit_distribution(lam), q)
    online, out = _run_online("q", lam, preds, q=q)
    assert torch.equal(online, offline)
    torch.testing.assert_close(out, gather_at_exit(preds, offline).double())


def test_online_matches_offline_sample() -> None:
    lam = _random_lambdas(1000, 6, seed=12)
    preds = torch.randn(1000, 6, 2)
    for seed in range(3):
        offline = sample_exit(lam, torch.Generator().manual_seed(seed))
        online, out = _run_online("sample", lam, preds, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(online, offline)
        torch.testing.assert_close(out, gather_at_exit(preds, offline).double())
        assert len(set(online.tolist())) > 2  # the comparison exercised several exit points


@pytest.mark.parametrize("patience", [1, 2, 3])
def test_online_matches_offline_pabee(patience: int) -> None:
    g = torch.Generator().manual_seed(13)
    lam = torch.rand(800, 6, generator=g)
    ids = torch.randint(0, 2, (800, 6), generator=g)
    logits = F.one_hot(ids, 2).float() + 0.01 * torch.randn(800, 6, 2, generator=g)
    offline = pabee_exit(logits, patience)
    online, out = _run_online("pabee", lam, logits, patience=patience)
    assert torch.equal(online, offline)
    torch.testing.assert_close(out, gather_at_exit(logits, offline).double())
    assert torch.equal(_run_online("pabee", lam, ids, patience=patience)[0], pabee_exit(ids, patience))
    reg = torch.cumsum(torch.randn(800, 6, generator=g) * 0.2, dim=1)
    offline_r = pabee_exit(reg, patience, regression_threshold=0.2)
    online_r, _ = _run_online("pabee", lam, reg, patience=patience, regression_threshold=0.2)
    assert torch.equal(online_r, offline_r)


@pytest.mark.parametrize("regression", [False, True])
def test_online_matches_offline_expectation(regression: bool) -> None:
    lam = _random_lambdas(300, 5, seed=14)
    preds = torch.randn(300, 5) if regression else torch.randn(300, 5, 3)
    b, n = lam.shape
    ctrl = ExitController("expectation", n, b, regression=regression)
    while not ctrl.done:
        rows, i = ctrl.active, ctrl.pass_idx
        assert rows.numel() == b  # no early exit under the expectation rule
        ctrl.step(lambdas=None if i == n - 1 else lam[rows, i], preds=preds[rows, i])
    assert torch.equal(ctrl.exit_idx, last_exit(b, n))
    assert ctrl.expected is not None
    assert torch.equal(ctrl.expected, expected_prediction(preds, exit_distribution(lam), regression=regression))


def test_online_matches_offline_last_and_misuse() -> None:
    lam = torch.rand(10, 4)
    online, _ = _run_online("last", lam, torch.randn(10, 4, 2))
    assert torch.equal(online, last_exit(10, 4))
    ctrl = ExitController("q", 2, 3)
    with pytest.raises(ValueError):
        ctrl.step()  # Q-exit needs λ before the last pass
    ctrl.step(lambdas=torch.ones(3))
    assert ctrl.done and ctrl.exit_idx.tolist() == [0, 0, 0]
    with pytest.raises(RuntimeError):
        ctrl.step(lambdas=torch.ones(0))
    with pytest.raises(ValueError):
        ExitController("pabee", 3, 2)  # patience required


# ------------------------------------------------------------------------------------------- metrics (B8)


def test_metrics_match_sklearn_scipy_on_random_inputs() -> None:
    """The metrics are scikit-learn / scipy calls (B8); what the module adds is tested here: hand-computed
    values through every accepted input form, and degenerate inputs (a constant prediction, a single class,
    constant or non-finite scores, one example) that get a defined value without any warning."""
    y = np.array([0, 1, 1, 0, 1, 0])
    yhat = [0, 1, 1, 0, 1, 1]  # TP 3, TN 2, FP 1, FN 0
    for form in (yhat, np.array(yhat), torch.tensor(yhat)):
        assert metrics.accuracy(form, y) == pytest.approx(5 / 6)
        assert metrics.matthews_corrcoef(form, y) == pytest.approx(6 / math.sqrt(4 * 3 * 3 * 2))
        assert metrics.f1_binary(form, y) == pytest.approx(6 / 7)
    # multiclass MCC (Gorodkin): c = 4 correct of s = 6, class counts (2, 2, 2) on both sides
    assert metrics.matthews_corrcoef([0, 1, 2, 0, 2, 1], [0, 1, 2, 0, 1, 2]) == pytest.approx(0.5)
    assert metrics.pearson([1, 2, 3], [1, 2, 4]) == pytest.approx(9 / math.sqrt(84))
    # Spearman with ties: ranks (1, 2.5, 2.5, 4) and (1, 3, 2, 4)
    np.testing.assert_array_equal(metrics.rankdata_average([1, 2, 2, 3]), [1, 2.5, 2.5, 4])
    assert metrics.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning spam from the libraries on degenerate inputs
        assert metrics.matthews_corrcoef([1] * 6, y) == 0.0  # constant prediction: CoLA's majority score
        assert metrics.matthews_corrcoef([0] * 6, y) == 0.0
        assert metrics.matthews_corrcoef([1, 1, 1], [1, 1, 1]) == 0.0  # one class everywhere
        assert metrics.glue_metrics("cola", np.zeros((6, 2)), y) == {"matthews_correlation": 0.0}
        assert metrics.f1_binary([0, 0], [0, 0]) == 0.0  # no positives anywhere
        assert metrics.f1_binary([0] * 6, y) == 0.0  # no positive predictions
        assert metrics.glue_metrics("mrpc", [0] * 6, y) == pytest.approx(
            {"accuracy": 0.5, "f1": 0.0, "combined_score": 0.25})
        assert math.isnan(metrics.pearson([2.7] * 5, [1, 2, 3, 4, 5]))  # constant input
        assert math.isnan(metrics.pearson([1, 2, 3], [3, 3, 3]))
        assert math.isnan(metrics.pearson([1.0, float("nan"), 3.0], [1, 2, 3]))  # non-finite
        assert math.isnan(metrics.pearson([1.0], [2.0]))  # one example
        assert math.isnan(metrics.spearman([1, 1, 1], [1, 2, 3]))
        assert math.isnan(metrics.spearman([1.0, float("inf")], [1, 2]))
        stsb = metrics.glue_metrics("stsb", np.full((4, 1), 2.5), [0.5, 1.0, 3.0, 4.5])
        assert all(math.isnan(v) for v in stsb.values())
    with pytest.raises(ValueError, match="differ in length"):
        metrics.accuracy([1, 0], [1])
    with pytest.raises(ValueError, match="empty"):
        metrics.matthews_corrcoef([], [])


def test_glue_metrics_keys_and_main_metric() -> None:
    y = np.array([0, 1, 1, 0, 1])
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])  # argmax 0,1,0,0,1
    m = metrics.glue_metrics("MRPC", logits, y)
    assert set(m) == {"accuracy", "f1", "combined_score"}
    assert m["accuracy"] == pytest.approx(0.8) and m["f1"] == pytest.approx(skm.f1_score(y, [0, 1, 0, 0, 1]))
    assert m["combined_score"] == pytest.approx((m["accuracy"] + m["f1"]) / 2)
    assert set(metrics.glue_metrics("cola", [0, 1, 0, 0, 1], y)) == {"matthews_correlation"}
    s = metrics.glue_metrics("STS-B", np.array([[0.5], [1.0], [2.0]]), np.array([0.4, 1.5, 1.9]))
    assert set(s) == {"pearson", "spearmanr", "combined_score"} and s["spearmanr"] == pytest.approx(1.0)
    expected_main = {"cola": "matthews_correlation", "sst2": "accuracy", "mrpc": "combined_score",
                     "stsb": "combined_score", "rte": "accuracy", "wnli": "accuracy", "qqp": "combined_score"}
    for task, name in expected_main.items():
        assert metrics.main_metric(task) == name
    for spec in glue.GLUE_TASKS.values():
        assert spec.main_metric in spec.metric_names
    with pytest.raises(ValueError):
        metrics.glue_metrics("squad", [1], [1])


# ------------------------------------------------------------------------------------------- GLUE loading

DOCUMENTED = {
    "cola": (8551, 1043), "sst2": (67349, 872), "mrpc": (3668, 408),
    "stsb": (5749, 1500), "rte": (2490, 277), "wnli": (635, 71),
}


@pytest.mark.skipif(not GLUE_DIR.is_dir(), reason="shared GLUE data pack not present")
@pytest.mark.parametrize("task", sorted(DOCUMENTED))
def test_glue_loading_documented_counts_and_labels(task: str) -> None:
    spec = glue.get_task(task)
    splits = glue.load_glue(GLUE_DIR, task)
    assert (len(splits["train"]), len(splits["dev"])) == DOCUMENTED[task]
    for examples in splits.values():
        labels = {ex.label for ex in examples}
        if spec.is_regression:
            assert spec.num_labels == 1 and all(isinstance(y, float) and 0.0 <= y <= 5.0 for y in labels)
            assert len(labels) > 50  # a real range of scores, not a class set
        else:
            assert spec.num_labels == 2 and labels == {0, 1}
            assert all(type(y) is int for y in labels)
        assert all((ex.text_b is not None) == spec.is_pair for ex in examples)
    first = splits["train"][0]
    if task == "cola":  # no header: the first line is data
        assert first.line == 1 and first.text_a.startswith("Our friends won't buy this analysis")
    if task == "mrpc":  # BOM header skipped; quotes kept verbatim (no quoting)
        assert first.line == 2 and first.label == 1 and '"the witness"' in first.text_a
    if task == "rte":  # GLUE / HF: entailment = 0, not_entailment = 1
        assert first.label == 1 and first.text_b == "Weapons of Mass Destruction Found in Iraq."
    if task == "stsb":
        assert first.label == 5.0 and first.text_a == "A plane is taking off."
    if task == "sst2":  # trailing space of the tokenised sentences is kept
        assert first.text_a == "hide new secretions from the parental units "


@pytest.mark.skipif(not GLUE_DIR.is_dir(), reason="shared GLUE data pack not present")
def test_majority_baseline() -> None:
    d = glue.load_glue(GLUE_DIR, "cola")
    assert glue.majority_label(d["train"]) == 1
    assert glue.majority_baseline("cola", d["train"], d["dev"]) == {"matthews_correlation": 0.0}
    rte = glue.load_glue(GLUE_DIR, "rte")
    acc = glue.majority_baseline("rte", rte["train"], rte["dev"])["accuracy"]
    maj = glue.majority_label(rte["train"])
    assert acc == pytest.approx(sum(ex.label == maj for ex in rte["dev"]) / len(rte["dev"]))


def test_malformed_tsv_errors_name_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "RTE" / "train.tsv"
    bad.parent.mkdir()
    header = "index\tsentence1\tsentence2\tlabel\n"
    bad.write_text(header + "0\tA.\tB.\tentailment\n1\tonly three\tfields\n")
    with pytest.raises(glue.GlueDataError, match=r"train\.tsv:3: expected 4 tab-separated fields.*got 3") as err:
        glue.load_glue_split(tmp_path, "rte", "train")
    assert err.value.line == 3 and err.value.path == str(bad)
    assert isinstance(err.value, ValueError)

    bad.write_text(header + "0\tA.\tB.\tentailment\n1\tC.\tD.\tcontradiction\n")
    with pytest.raises(glue.GlueDataError, match=r"train\.tsv:3: unknown label 'contradiction'"):
        glue.read_glue_tsv(bad, "rte")
    bad.write_text("idx\tsentence1\tsentence2\tlabel\n")
    with pytest.raises(glue.GlueDataError, match=r"train\.tsv:1: unexpected header"):
        glue.read_glue_tsv(bad, "rte")
    with pytest.raises(glue.GlueDataError, match=r"dev\.tsv: file not found"):
        glue.load_glue_split(tmp_path, "rte", "dev")

    stsb = tmp_path / "stsb.tsv"
    head = "\t".join(glue.GLUE_TASKS["stsb"].header or ()) + "\n"
    stsb.write_text(head + "0\tg\tf\ty\t0\tn\tn\tA.\tB.\t5.5\n")
    with pytest.raises(glue.GlueDataError, match=r"stsb\.tsv:2: score '5.5' outside"):
        glue.read_glue_tsv(stsb, "stsb")
    cola = tmp_path / "cola.tsv"
    cola.write_text("src\t1\t\tFine.\nsrc\tx\t\tBad label.\n")
    with pytest.raises(glue.GlueDataError, match=r"cola\.tsv:2: unknown label 'x'"):
        glue.read_glue_tsv(cola, "CoLA")
    # CRLF files and quotes inside fields load unchanged.
    cola.write_bytes(b'src\t1\t\t"Quoted" word.\r\nsrc\t0\t*\tOther.\r\n')
    rows = glue.read_glue_tsv(cola, "cola")
    assert [(r.text_a, r.label, r.line) for r in rows] == [('"Quoted" word.', 1, 1), ("Other.", 0, 2)]


# ------------------------------------------------------------------------------------------- batching


def _toy_encode(text: str) -> list[int]:
    """Word-level toy tokenizer: id = 10 + word length (any str -> list[int] callable works)."""
    return [10 + len(w) for w in text.split()]


def test_tokenize_batch_pairs_truncation_and_padding() -> None:
    ex = [
        glue.GlueExample("a bb ccc", "dddd", 1, 2),
        glue.GlueExample("x", "y z", 0, 3),
    ]
    batch = glue.tokenize_batch(ex, _toy_encode, pad_id=1, sep_ids=[0])
    assert batch["input_ids"].tolist() == [[11, 12, 13, 0, 14], [11, 0, 11, 11, 1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [1, 0]
    assert glue.tokenize_batch(ex, _toy_encode, pad_id=1, sep_ids=[0], pad_to=8)["input_ids"].shape == (2, 8)

    # Longest-first truncation to max_length, separator and suffix kept.
    long_a, long_b = " ".join(["aa"] * 200), " ".join(["b"] * 50)
    ids = glue.encode_pair(_toy_encode, long_a, long_b, sep_ids=[0, 0], suffix_ids=[9])
    assert len(ids) == 128 and ids[-1] == 9
    a_len = ids.index(0)
    assert ids[a_len : a_len + 2] == [0, 0]
    assert (a_len, len(ids) - a_len - 3) == (75, 50)  # only the longer side is trimmed
    ids = glue.encode_pair(_toy_encode, long_a, " ".join(["b"] * 100), sep_ids=[0, 0], suffix_ids=[9])
    a_len = ids.index(0)
    assert (a_len, len(ids) - a_len - 3) == (63, 62)  # both trimmed to balance; ties trim text_b
    assert glue.encode_pair(_toy_encode, "a bb", "c dd", sep_ids=[0], max_length=4) == [11, 12, 0, 11]  # tie trims b
    assert len(glue.encode_pair(_toy_encode, long_a, None, sep_ids=[0], max_length=16)) == 16

    reg = [glue.GlueExample("a", "b", 3.8, 2), glue.GlueExample("c c", "d", 0.0, 3)]
    batches = list(glue.iter_batches(reg * 3, _toy_encode, pad_id=1, sep_ids=[0], batch_size=4))
    assert [b["labels"].shape[0] for b in batches] == [4, 2]
    assert batches[0]["labels"].dtype == torch.float32
    assert batches[0]["labels"].tolist() == pytest.approx([3.8, 0.0, 3.8, 0.0])
    with pytest.raises(ValueError):
        glue.encode_pair(_toy_encode, "a", "b", sep_ids=[0] * 128)


TOKENIZER_JSON = SHARED_DATA / "tokenizers" / "gpt-neox-20b" / "tokenizer.json"


@pytest.mark.skipif(not TOKENIZER_JSON.is_file() or not GLUE_DIR.is_dir(),
                    reason="shared tokenizer / GLUE data not present")
def test_batches_with_the_pythia_tokenizer() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(TOKENIZER_JSON))

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    dev = glue.load_glue_split(GLUE_DIR, "rte", "dev")
    # pad_id 1 = <|padding|>, separator 0 = <|endoftext|>
    batches = list(glue.iter_batches(dev, encode, pad_id=1, sep_ids=[0], batch_size=32))
    assert sum(b["input_ids"].shape[0] for b in batches) == len(dev) == 277
    for b in batches:
        ids, mask = b["input_ids"], b["attention_mask"]
        assert ids.shape[1] <= 128 and mask.sum(1).min() > 0
        lengths = mask.sum(1)
        # Right padding: the mask is a prefix of ones and every padded slot holds pad_id.
        assert torch.equal(mask, (torch.arange(ids.shape[1])[None] < lengths[:, None]).long())
        assert torch.all(ids[mask == 0] == 1)
        assert torch.all((ids == 0).sum(1) == 1)  # exactly one separator per pair
    assert max(b["attention_mask"].sum(1).max().item() for b in batches) == 128  # long RTE pairs are truncated
    first = dev[0]
    want = encode(first.text_a) + [0] + encode(first.text_b or "")
    assert batches[0]["input_ids"][0, : len(want)].tolist() == want[:128]
