"""FP8 linear layers from Python (Note [FP8 linear], Note [Window FP8 weights])."""

import numpy as np

import accrue
from accrue import nn, optim


def test_fp8_linear_rounds_like_fp8_and_refuses_odd_rows():
    rng = np.random.default_rng(0)
    x = accrue.tensor(rng.standard_normal((32, 48)).astype(np.float32))
    w = accrue.tensor((0.1 * rng.standard_normal((16, 48))).astype(np.float32))
    exact = accrue.linear(x, w).numpy()
    fp8 = accrue.fp8_linear(x, w, out_dtype=accrue.f32).numpy()
    err = np.abs(fp8 - exact).max() / np.abs(exact).max()
    assert 0 < err < 0.1, err  # e4m3 keeps 3 mantissa bits
    blocks = accrue.fp8_linear(x, w, out_dtype=accrue.f32, recipe="block").numpy()
    assert 0 < np.abs(blocks - exact).max() / np.abs(exact).max() < 0.1
    try:
        accrue.fp8_linear(accrue.tensor(np.ones((10, 48), np.float32)), w)
    except accrue.Error as e:
        assert "fp8_linear" in str(e) and "multiples of 16" in str(e)
    else:
        raise AssertionError("10 rows were accepted")


def train(fp8, planted=None, delayed=False, compute=None, codes_in_slots=True,
          grad_dtype=accrue.f8e5m2, delayed_grad_dtype=None):
    gen = accrue.Generator(4)
    model = nn.MLP([32, 64, 16], generator=gen)
    weights = nn.use_fp8(model, grad_dtype=grad_dtype) if fp8 else []
    opt = optim.AdamW(1e-2)
    store = optim.ParamStore(model.named_parameters(),
                             optim.ParamStoreOptions(moments=opt.moments_needed(),
                                                     compute_dtype=compute,
                                                     fp8_codes_in_compute_slots=codes_in_slots))
    if weights:
        store.keep_fp8_copies(weights)
    if delayed:
        store.keep_fp8_delayed_scaling(weights, history=2,
                                       grad_dtype=delayed_grad_dtype or grad_dtype)
    window = optim.Window(store, opt, optim.WindowOptions(micro_steps=2))
    rng = np.random.default_rng(1)
    for _ in range(3):
        for _ in range(2):
            xs = rng.standard_normal((16, 32)).astype(np.float32)
            if planted is not None:
                xs[3, 5] = planted
            ys = rng.integers(0, 16, 16)
            x = accrue.tensor(xs)
            if compute is not None:
                x = x.to(compute)
            window.backward(accrue.cross_entropy(model(x), accrue.tensor(ys)))
        window.close()
    return window.report(), store


def test_mlp_in_fp8_trains_with_its_weights_cast_once_per_window():
    plain, _ = train(fp8=False)
    report, store = train(fp8=True)
    assert store.has_fp8_copies and "fp8 copies" in store.memory()
    assert not report.skipped and report.optimizer_steps == 3
    assert report.loss != plain.loss and abs(report.loss - plain.loss) < 0.05 * plain.loss


def test_codes_in_the_compute_slots_train_as_codes_kept_apart():
    # Note [FP8 codes in the compute slots]: with a bf16 compute copy the FP8
    # weights read as their f32 masters, and training gives the same bits.
    apart, apart_store = train(fp8=True, compute=accrue.bf16, codes_in_slots=False)
    report, store = train(fp8=True, compute=accrue.bf16)
    assert "(codes in the compute slots)" in store.memory()
    assert "codes in the" not in apart_store.memory()
    assert not report.skipped and report.loss == apart.loss
    assert report.grad_norm == apart.grad_norm


def test_an_infinity_in_the_input_skips_the_window():
    report, _ = train(fp8=True, planted=np.inf)
    assert report.skipped and report.optimizer_steps == 0


def test_delayed_scaling_trains_and_an_overflow_still_skips():
    current, _ = train(fp8=True)
    report, store = train(fp8=True, delayed=True)
    assert store.has_fp8_delayed_scaling and not current.skipped
    assert not report.skipped and report.optimizer_steps == 3
    # Window 1 is current scaling; windows 2 and 3 cast with the history's scales.
    assert report.loss != current.loss and abs(report.loss - current.loss) < 0.05 * current.loss
    skipped, _ = train(fp8=True, planted=np.inf, delayed=True)
    assert skipped.skipped and skipped.optimizer_steps == 0
    try:
        store.keep_fp8_delayed_scaling([])
    except accrue.Error as e:
        assert "keep_fp8_delayed_scaling" in str(e)
    else:
        raise AssertionError("a second keep_fp8_delayed_scaling was accepted")


def test_e4m3_gradients_train_and_delayed_rows_must_match_them():
    e5m2, _ = train(fp8=True)
    for delayed in (False, True):
        report, _ = train(fp8=True, grad_dtype=accrue.f8e4m3, delayed=delayed)
        assert not report.skipped and report.optimizer_steps == 3
        # Another rounding of the output gradients: another, close, loss.
        assert report.loss != e5m2.loss and abs(report.loss - e5m2.loss) < 0.05 * e5m2.loss
    try:
        train(fp8=True, grad_dtype=accrue.f8e4m3, delayed=True, delayed_grad_dtype=accrue.f8e5m2)
    except accrue.Error as e:
        assert "fp8_linear" in str(e) and "f8e4m3" in str(e) and "f8e5m2" in str(e), str(e)
    else:
        raise AssertionError("delayed-scaling rows in e5m2 were accepted by e4m3 layers")
    for bad, words in (({"recipe": "tile"}, "'tile'"), ({"grad_dtype": accrue.bf16}, "bf16")):
        try:
            nn.use_fp8(nn.MLP([32, 16], generator=accrue.Generator(1)), **bad)
        except accrue.Error as e:
            assert "use_fp8" in str(e) and words in str(e), str(e)
        else:
            raise AssertionError(f"use_fp8({bad}) was accepted")
