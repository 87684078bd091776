"""Gradients from Python against finite differences and known formulas."""

import numpy as np
import pytest

import accrue


@pytest.fixture
def rng():
    return np.random.default_rng(99)


def numeric_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = (f(xp) - f(xm)) / (2 * eps)
    return g


def test_composite_function_matches_finite_differences(rng):
    x_np, w_np = rng.standard_normal((4, 3)), rng.standard_normal((3, 5))

    def f_np(x, w):
        h = np.tanh(x @ w)
        return float((h * h).sum() + np.exp(-x).mean())

    x = accrue.tensor(x_np, dtype=accrue.f64, requires_grad=True)
    w = accrue.tensor(w_np, dtype=accrue.f64, requires_grad=True)
    h = (x @ w).tanh()
    y = (h * h).sum() + (-x).exp().mean()
    assert abs(y.item() - f_np(x_np, w_np)) < 1e-12
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), numeric_grad(lambda v: f_np(v, w_np), x_np), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(w.grad.numpy(), numeric_grad(lambda v: f_np(x_np, v), w_np), rtol=1e-6, atol=1e-8)


def test_known_gradients_and_accumulation(rng):
    x_np = rng.standard_normal(6)
    x = accrue.tensor(x_np, dtype=accrue.f64, requires_grad=True)
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * x_np, rtol=1e-15)
    # A second backward adds to .grad; assigning None forgets it.
    (3.0 * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * x_np + 3.0, rtol=1e-15)
    x.grad = None
    assert x.grad is None
    # Slicing is differentiable: the gradient lands in the slice's elements only.
    x[1:4].sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0, 1, 1, 1, 0, 0])
    x.grad = None
    x[::2].sum().backward()  # a strided slice of a tensor that requires grad
    np.testing.assert_array_equal(x.grad.numpy(), [1, 0, 1, 0, 1, 0])


def test_cross_entropy_matches_numpy(rng):
    logits_np = rng.standard_normal((5, 7))
    targets_np = np.array([0, 3, -100, 6, 2])
    logits = accrue.tensor(logits_np, dtype=accrue.f64, requires_grad=True)
    loss = accrue.cross_entropy(logits, accrue.tensor(targets_np))
    s, count = loss
    assert count.item() == 4
    lse = np.log(np.exp(logits_np).sum(1))
    keep = targets_np != -100
    want = (lse[keep] - logits_np[keep, targets_np[keep]]).sum()
    assert abs(s.item() - want) < 1e-12
    assert abs(loss.mean().item() - want / 4) < 1e-12
    s.backward()
    p = np.exp(logits_np) / np.exp(logits_np).sum(1, keepdims=True)
    p[keep, targets_np[keep]] -= 1.0
    p[~keep] = 0.0
    np.testing.assert_allclose(logits.grad.numpy(), p, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: accrue.gelu(a) * b,
        lambda a, b: accrue.softmax(a @ b.T, -1),
        lambda a, b: accrue.layer_norm(a, b[0], b[1]),
        lambda a, b: accrue.cat([a, b], 0).sum(1),
        lambda a, b: accrue.where(accrue.tensor([[True, False, True]]), a, b),
        lambda a, b: accrue.cumsum(accrue.maximum(a, b), 1),
    ],
)
def test_gradcheck(rng, fn):
    a = accrue.tensor(rng.standard_normal((2, 3)), dtype=accrue.f64, requires_grad=True)
    b = accrue.tensor(rng.standard_normal((2, 3)), dtype=accrue.f64, requires_grad=True)
    assert accrue.gradcheck(fn, [a, b])


def test_gradcheck_reports_a_wrong_gradient():
    a = accrue.tensor([0.5, 1.5], dtype=accrue.f64, requires_grad=True)
    # detach() hides the dependence from autograd: the analytic gradient is 0.
    res = accrue.gradcheck(lambda x: x.detach() * 2.0 + x * 0.0, [a], raise_exception=False)
    assert not res.ok and res.message
    with pytest.raises(accrue.Error, match="gradcheck"):
        accrue.gradcheck(lambda x: x.detach() * 2.0 + x * 0.0, [a])


def test_no_grad_records_nothing():
    w = accrue.ones([3], requires_grad=True)
    with accrue.no_grad():
        y = w * 2.0
        assert not accrue.is_grad_enabled()
    assert accrue.is_grad_enabled() and not y.requires_grad
    with pytest.raises(accrue.Error):
        w.copy_(accrue.zeros([3]))  # an in-place write of a leaf that requires grad
    with accrue.no_grad():
        w.copy_(accrue.zeros([3]))
    assert w.tolist() == [0.0, 0.0, 0.0]
