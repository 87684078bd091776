"""The accumulation Window driven from Python."""

import numpy as np
import pytest

import accrue
from accrue import nn, optim


class Model(nn.Module):
    """A Python module over a native child: Linear -> tanh -> a Python-held weight."""

    def __init__(self, seed):
        super().__init__()
        gen = accrue.Generator(seed)
        self.fc = nn.Linear(6, 16, dtype=accrue.f64, generator=gen)
        self.out = nn.Parameter(accrue.randn([16, 5], dtype=accrue.f64, generator=gen) * 0.3)

    def forward(self, x):
        return accrue.tanh(self.fc(x)) @ self.out


def make_data(windows, batch, seed=5):
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((windows, batch, 6))
    ys = rng.integers(0, 5, (windows, batch))
    ys[:, ::7] = -100  # ignored targets: the item count, not the batch size, normalizes
    return xs, ys


def train(k, windows=4, batch=16, optimizer=None):
    model = Model(seed=3)
    opt = optimizer() if optimizer else optim.AdamW(1e-2, weight_decay=0.1)
    store = optim.ParamStore(
        model.named_parameters(),
        optim.ParamStoreOptions(master_dtype=accrue.f64, moments=opt.moments_needed()),
    )
    window = optim.Window(store, opt, optim.WindowOptions(micro_steps=k, max_grad_norm=0.5))
    xs, ys = make_data(windows, batch)
    b = batch // k
    reports, params = [], []
    for w in range(windows):
        for m in range(k):
            x = accrue.tensor(xs[w, m * b:(m + 1) * b], dtype=accrue.f64)
            y = accrue.tensor(ys[w, m * b:(m + 1) * b])
            window.backward(accrue.cross_entropy(model(x), y))
        assert window.ready()
        window.close()
        reports.append(window.report())
        params.append(np.concatenate([p.detach().numpy().ravel().copy() for p in model.parameters()]))
    return reports, params


def test_k_micro_batches_equal_the_big_batch():
    small, p_small = train(k=4)
    big, p_big = train(k=1)
    for w, (a, b) in enumerate(zip(p_small, p_big)):
        err = np.abs(a - b).max() / np.abs(b).max()
        assert err < 1e-12, f"window {w}: {err}"
    for a, b in zip(small, big):
        assert a.items == b.items == 13.0  # 16 targets, 3 ignored
        assert abs(a.loss - b.loss) < 1e-12 and abs(a.grad_norm - b.grad_norm) < 1e-12
    assert small[-1].window == 4 and small[-1].optimizer_steps == 4
    assert small[-1].loss < small[0].loss


def test_parameters_change_and_report_fields():
    reports, params = train(k=2, windows=2, optimizer=lambda: optim.SGD(0.1, momentum=0.9))
    assert not np.array_equal(params[0], params[1])
    r = reports[-1]
    assert r.items == 13.0 and not r.skipped and r.clip_coef <= 1.0
    assert "WindowReport" in repr(r)


def test_python_schedule_and_param_groups():
    class Halve(optim.LRSchedule):
        def __init__(self):
            super().__init__()
            self.seen = []

        def factor(self, step):
            self.seen.append(step)
            return 0.5

    sched = Halve()

    def make():
        opt = optim.AdamW(1e-2)
        opt.set_schedule(sched)
        return opt

    train(k=2, windows=3, optimizer=make)
    assert sched.seen[:3] == [0, 1, 2]
    opt = optim.Optimizer(optim.AdamWOptions(1e-3).betas(0.9, 0.95).weight_decay(0.1))
    m = Model(0)
    opt.add_param_group([m.fc.bias], weight_decay=0.0)
    assert opt.kind == optim.OptimizerKind.AdamW and opt.moments_needed() == 2
    assert optim.WarmupCosine(10, 100, 0.1).factor(5) == pytest.approx(0.6)


def test_verify_accumulation_from_python():
    xs, ys = make_data(3, 8)

    class Run:
        def __init__(self, k):
            self.model = Model(seed=1)
            opt = optim.AdamW(1e-2)
            self.store = optim.ParamStore(
                self.model.named_parameters(),
                optim.ParamStoreOptions(master_dtype=accrue.f64, moments=opt.moments_needed()),
            )
            self.opt = opt
            self.window = optim.Window(self.store, opt, optim.WindowOptions(micro_steps=k))

        def micro_step(self, window, begin, end):
            x = accrue.tensor(xs[window, begin:end], dtype=accrue.f64)
            y = accrue.tensor(ys[window, begin:end])
            self.window.backward(accrue.cross_entropy(self.model(x), y))

        def close(self):
            self.window.close()

        def parameters(self):
            return self.store.master.numpy()

    report = optim.verify_accumulation(Run, windows=3, micro_steps=4, batch=8)
    assert report.passed, report.table()
    assert len(report.parameter_error) == 3 and "PASS" in report.table()


def test_window_refuses_a_bad_state():
    model = Model(0)
    opt = optim.SGD(0.1)
    store = optim.ParamStore(model.named_parameters(), optim.ParamStoreOptions(master_dtype=accrue.f64, moments=0))
    window = optim.Window(store, opt, optim.WindowOptions(micro_steps=2))
    with pytest.raises(accrue.Error):
        window.close()  # not ready: no micro-step yet
    with pytest.raises(accrue.Error):
        optim.ParamStore(model.named_parameters())  # already held by `store`


def test_layer_monitor_reads_each_layers_norm_and_update_ratio():
    # Note [Layer monitor] from Python: per parameter, the gradient norms make
    # up the report's (root-sum-square), the update ratio is ||delta|| / ||p||
    # as numpy computes it from the weights before and after, and both ways of
    # summing (separate passes, the optimizer's fused pass) agree.
    def build():
        gen = accrue.Generator(3)
        model = nn.MLP([8, 16, 4], generator=gen, dtype=accrue.f64)
        opt = optim.AdamW(1e-2, weight_decay=0.1)
        opt.add_param_group([p for _, p in model.named_parameters() if p.dim() < 2],
                            weight_decay=0.0)
        store = optim.ParamStore(model.named_parameters(), optim.ParamStoreOptions(
            master_dtype=accrue.f64, moments=opt.moments_needed()))
        window = optim.Window(store, opt, optim.WindowOptions(micro_steps=2, max_grad_norm=0.5))
        return model, opt, store, window

    figures = []
    for fused in (False, True):
        model, opt, store, window = build()
        monitor = optim.LayerMonitor(store, opt) if fused else optim.LayerMonitor(store)
        gen = accrue.Generator(5)
        for _ in range(2):
            x = accrue.randn([6, 8], generator=gen, dtype=accrue.f64)
            y = accrue.randint(0, 4, [6], generator=gen)
            window.backward(accrue.cross_entropy(model(x), y))
        before = [p.detach().numpy().copy() for p in model.parameters()]
        monitor.before_close()
        window.close()
        monitor.after_close()
        report = window.report()
        layers = monitor.read(report)
        after = [p.detach().numpy() for p in model.parameters()]
        assert [l.name for l in layers] == [n for n, _ in model.named_parameters()]
        norm = np.sqrt(sum(l.grad_norm ** 2 for l in layers))
        assert abs(norm - report.grad_norm) <= 1e-12 * report.grad_norm
        for l, b, a in zip(layers, before, after):
            expected = np.linalg.norm(a - b) / np.linalg.norm(b)
            assert abs(l.update_ratio - expected) <= 1e-10 * expected, l
        groups = monitor.groups(opt.slot_groups(store))
        assert [g.group for g in groups] == [0, 1]
        figures.append([(l.grad_norm, l.update_ratio) for l in layers])
    np.testing.assert_allclose(figures[0], figures[1], rtol=1e-12)


class AwaitingModel(Model):
    """Model, awaiting each layer's parameters before it reads them (or not)."""

    def __init__(self, seed, awaits):
        super().__init__(seed)
        self.awaits = awaits

    def forward(self, x):
        if self.awaits:
            accrue.await_parameters(list(self.fc.parameters()))
        h = accrue.tanh(self.fc(x))
        if self.awaits:
            accrue.await_parameters([self.out])
        return h @ self.out


def train_closing_under_forward(awaits, **window_options):
    model = AwaitingModel(seed=3, awaits=awaits)
    opt = optim.AdamW(1e-2, weight_decay=0.1)
    store = optim.ParamStore(
        model.named_parameters(),
        optim.ParamStoreOptions(master_dtype=accrue.f64, moments=opt.moments_needed()),
    )
    window = optim.Window(store, opt, optim.WindowOptions(micro_steps=2, **window_options))
    xs, ys = make_data(3, 8)
    for w in range(3):
        for m in range(2):
            x = accrue.tensor(xs[w, m * 4:(m + 1) * 4], dtype=accrue.f64)
            y = accrue.tensor(ys[w, m * 4:(m + 1) * 4])
            window.backward(accrue.cross_entropy(model(x), y))
        window.close()
    state = window.state_dict()  # joins the last close's steps
    return state["master"].numpy().copy()


def test_the_close_under_the_forward_gives_the_sequential_bits():
    sequential = train_closing_under_forward(awaits=True)
    # The test mode steps each layer only when the forward awaits it.
    lazy = train_closing_under_forward(
        awaits=True, close_under_forward=True, close_layer_elements=1, close_steps_on_first_read=True
    )
    assert np.array_equal(lazy, sequential)
    with pytest.raises(accrue.Error, match="the forward awaited none of the store's parameters"):
        train_closing_under_forward(
            awaits=False, close_under_forward=True, close_steps_on_first_read=True
        )
