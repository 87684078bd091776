"""accrue.torch.AccumulationWindow against plain PyTorch on the big batch (Note [Torch bridge])."""

import copy
import io

import pytest

torch = pytest.importorskip("torch")

import accrue  # noqa: E402
from accrue.torch import AccumulationWindow  # noqa: E402

K = 4
WINDOWS = 5
IGNORE = -100


class MLP(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16, dtype=dtype)
        self.norm = torch.nn.LayerNorm(16, dtype=dtype)
        self.fc2 = torch.nn.Linear(16, 5, dtype=dtype)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x))))


class Block(torch.nn.Module):
    """A small pre-norm transformer block with a classifier head."""

    def __init__(self, dtype, d=16, heads=2, vocab=5):
        super().__init__()
        self.embed = torch.nn.Linear(8, d, dtype=dtype)
        self.ln1 = torch.nn.LayerNorm(d, dtype=dtype)
        # No projection biases: the key bias's true gradient is 0 (softmax ignores a shift),
        # so both runs would step Adam on rounding noise, which it scales up to lr.
        self.attn = torch.nn.MultiheadAttention(d, heads, bias=False, batch_first=True, dtype=dtype)
        self.ln2 = torch.nn.LayerNorm(d, dtype=dtype)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(d, 4 * d, dtype=dtype),
            torch.nn.GELU(),
            torch.nn.Linear(4 * d, d, dtype=dtype),
        )
        self.head = torch.nn.Linear(d, vocab, dtype=dtype)

    def forward(self, x):  # x: [B, T, 8] -> logits [B*T, vocab]
        h = self.embed(x)
        a = self.ln1(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        h = h + self.mlp(self.ln2(h))
        return self.head(h).reshape(-1, self.head.out_features)


def micro_batches(gen, dtype, seq=None):
    """K micro-batches of different sizes, some targets ignored (padding)."""
    out = []
    for k in range(K):
        rows = 3 + k
        shape = (rows, seq, 8) if seq else (rows, 8)
        x = torch.randn(*shape, generator=gen, dtype=dtype)
        y = torch.randint(0, 5, (rows * (seq or 1),), generator=gen)
        y[torch.rand(y.shape, generator=gen) < 0.25] = IGNORE
        out.append((x, y))
    return out


def loss_sum(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y, reduction="sum", ignore_index=IGNORE)


def torch_steps(model, opt, batches, max_norm=None, sched=None):
    """Plain PyTorch on the big batch of each window: the token-mean loss, one step."""
    for window in batches:
        opt.zero_grad()
        n = sum(int((y != IGNORE).sum()) for _, y in window)
        (sum(loss_sum(model, x, y) for x, y in window) / n).backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=False)
        opt.step()
        if sched is not None:
            sched.step()


def window_steps(window, model, batches):
    """Each window's micro-batches through `window`, then its close."""
    for batch in batches:
        for x, y in batch:
            window.backward(loss_sum(model, x, y), (y != IGNORE).sum())
        window.close()


def mlp_twins(data_seed, windows=3):
    """An f64 MLP (seed 0), its copy for plain PyTorch, and `windows` windows of micro-batches."""
    torch.manual_seed(0)
    model = MLP(torch.float64)
    gen = torch.Generator().manual_seed(data_seed)
    return model, copy.deepcopy(model), [micro_batches(gen, torch.float64) for _ in range(windows)]


def assert_same_parameters(model, reference, tol):
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert (p.detach() - q.detach()).abs().max().item() <= tol, name


def train_reference(model, batches, lr, wd, max_norm):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        weight_decay=wd,
        foreach=False,
    )
    torch_steps(model, opt, batches, max_norm=max_norm)


def train_window(model, batches, lr, wd, max_norm):
    params = list(model.parameters())
    window = AccumulationWindow(
        model,
        "adamw",
        lr=lr,
        weight_decay=wd,
        no_decay_1d=True,
        micro_steps=K,
        max_grad_norm=max_norm,
    )
    for window_batches in batches:
        for x, y in window_batches:
            window.backward(loss_sum(model, x, y), (y != IGNORE).sum())
        assert window.ready()
        window.close()
    assert all(p is q for p, q in zip(params, model.parameters()))
    return window


@pytest.mark.parametrize("kind", ["mlp", "block"])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_equals_big_batch(kind, dtype, tol):
    torch.manual_seed(0)
    model = MLP(dtype) if kind == "mlp" else Block(dtype)
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    seq = 6 if kind == "block" else None
    batches = [micro_batches(gen, dtype, seq) for _ in range(WINDOWS)]
    # max_norm 0.5 clips some windows and not others.
    train_reference(reference, batches, 1e-2, 0.1, 0.5)
    window = train_window(model, batches, 1e-2, 0.1, 0.5)
    report = window.report()
    assert report.window == WINDOWS and not report.skipped
    for (name, a), (_, b) in zip(model.named_parameters(), reference.named_parameters()):
        assert a.dtype == dtype
        err = (a.detach() - b.detach()).abs().max().item() / b.detach().abs().max().item()
        assert err <= tol, f"{name}: {err}"
    # Each parameter is a view of its master slot: the store's values are the model's.
    for i, p in enumerate(model.parameters()):
        assert torch.equal(torch.from_dlpack(window.store.master_view(i).detach()), p.detach())


def test_report_loss_is_token_mean():
    torch.manual_seed(0)
    model = MLP(torch.float64)
    gen = torch.Generator().manual_seed(2)
    batch = micro_batches(gen, torch.float64)
    with torch.no_grad():
        n = sum(int((y != IGNORE).sum()) for _, y in batch)
        expected = sum(loss_sum(model, x, y).item() for x, y in batch) / n
    window = AccumulationWindow(model, lr=1e-3, micro_steps=K)
    for x, y in batch:
        window.backward(loss_sum(model, x, y), int((y != IGNORE).sum()))
    window.close()
    r = window.report()
    assert r.items == n
    assert abs(r.loss - expected) <= 1e-12 * abs(expected)
    assert r.grad_norm > 0
    # A number count becomes a device tensor once per value (a copy from the host waits for
    # the stream): a second window with the same counts makes none.
    made = dict(window._counts)
    assert len(made) == len({int((y != IGNORE).sum()) for _, y in batch})
    for x, y in batch:
        window.backward(loss_sum(model, x, y), int((y != IGNORE).sum()))
    window.close()
    assert all(window._counts[c] is t for c, t in made.items()) and len(window._counts) == len(made)


def test_resume_is_bitwise():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(3)
    batches = [micro_batches(gen, torch.float32) for _ in range(4)]

    def run(model, window, windows, start_micro=0):
        for w in windows:
            for x, y in w[start_micro:]:
                window.backward(loss_sum(model, x, y), (y != IGNORE).sum())
            start_micro = 0
            window.close()

    base = MLP(torch.float32)
    a = copy.deepcopy(base)
    wa = AccumulationWindow(a, lr=1e-2, micro_steps=K, max_grad_norm=1.0, scaler="dynamic")
    run(a, wa, batches)

    b = copy.deepcopy(base)
    wb = AccumulationWindow(b, lr=1e-2, micro_steps=K, max_grad_norm=1.0, scaler="dynamic")
    run(b, wb, batches[:2])
    # Mid-window: two micro-steps of window 3 done.
    for x, y in batches[2][:2]:
        wb.backward(loss_sum(b, x, y), (y != IGNORE).sum())
    buffer = io.BytesIO()
    torch.save(wb.state_dict(), buffer)  # plain torch tensors: weights_only loads them
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert int(state["micro_step"].item()) == 2

    c = copy.deepcopy(base)  # a fresh model and window, loaded
    wc = AccumulationWindow(c, lr=1e-2, micro_steps=K, max_grad_norm=1.0, scaler="dynamic")
    wc.load_state_dict(state)
    assert wc.micro_step == 2
    run(c, wc, batches[2:], start_micro=2)
    for p, q in zip(a.parameters(), c.parameters()):
        assert torch.equal(p.detach(), q.detach())
    assert wc.report().loss == wa.report().loss


def test_bf16_parameters_fp32_master():
    torch.manual_seed(0)
    model = MLP(torch.bfloat16)
    params = list(model.parameters())
    gen = torch.Generator().manual_seed(4)
    window = AccumulationWindow(model, lr=1e-2, micro_steps=K, max_grad_norm=1.0)
    for x, y in micro_batches(gen, torch.bfloat16):
        window.backward(loss_sum(model, x, y), (y != IGNORE).sum())
        assert all(p.grad is None for p in params)  # moved into the f32 arena by the hook
    assert window.store.grads.dtype == accrue.f32
    assert float(torch.from_dlpack(window.store.grads.detach()).abs().sum()) > 0
    before = [p.detach().clone() for p in params]
    window.close()
    assert all(p is q for p, q in zip(params, model.parameters()))
    assert all(p.dtype == torch.bfloat16 for p in params)
    # The 16-bit parameters are the compute copy of the f32 master, written by the close.
    assert any(not torch.equal(p.detach(), b) for p, b in zip(params, before))
    for i, p in enumerate(params):
        master = torch.from_dlpack(window.store.master_view(i).detach())
        assert torch.equal(master.to(torch.bfloat16), p.detach())


def test_param_groups_equal_torch():
    # torch.optim's groups: per-group lr and weight decay, AdamW in f64.
    model, reference, batches = mlp_twins(data_seed=8)

    def groups(m):
        return [{"params": [m.fc1.weight, m.fc2.weight], "lr": 2e-2, "weight_decay": 0.1},
                {"params": [m.fc1.bias, m.fc2.bias], "weight_decay": 0.0}]

    opt = torch.optim.AdamW(groups(reference) + [{"params": list(reference.norm.parameters())}],
                            lr=1e-2, weight_decay=0.05, foreach=False)
    torch_steps(reference, opt, batches)
    # The norm's parameters are in no group: the window's lr and weight_decay.
    window = AccumulationWindow(model, lr=1e-2, weight_decay=0.05, micro_steps=K,
                                param_groups=groups(model))
    window_steps(window, model, batches)
    assert_same_parameters(model, reference, 1e-12)

    m = MLP(torch.float64)
    with pytest.raises(ValueError, match="not both"):
        AccumulationWindow(m, no_decay_1d=True, param_groups=groups(m))
    with pytest.raises(ValueError, match=r"param_groups\[0\] has \['betas'\]"):
        AccumulationWindow(m, param_groups=[{"params": [m.fc1.weight], "betas": (0.9, 0.95)}])
    with pytest.raises(ValueError, match=r"'fc1.weight' is in param_groups\[0\] and \[1\]"):
        AccumulationWindow(m, param_groups=[{"params": [m.fc1.weight]},
                                            {"params": [m.fc1.weight]}])
    with pytest.raises(ValueError, match=r"shape \(3,\) that is not a trainable parameter"):
        AccumulationWindow(m, param_groups=[{"params": [torch.zeros(3)]}])
    with pytest.raises(ValueError, match="must be a dict with 'params'"):
        AccumulationWindow(m, param_groups=[[m.fc1.weight]])


def test_refusals():
    m = MLP(torch.float32)
    m.fc2.to(torch.float64)
    with pytest.raises(ValueError, match="several dtypes"):
        AccumulationWindow(m)
    with pytest.raises(ValueError, match="no parameter that requires grad"):
        AccumulationWindow(MLP(torch.float32).requires_grad_(False))
    m = MLP(torch.float32)
    m.fc2.to("meta")
    with pytest.raises(ValueError, match="several devices.*fc2.weight on meta"):
        AccumulationWindow(m)
    with pytest.raises(ValueError, match="parameters on meta"):
        AccumulationWindow(MLP(torch.float32).to("meta"))
    with pytest.raises(ValueError, match="optimizer must be"):
        AccumulationWindow(MLP(torch.float32), "lion")

    model = MLP(torch.float64)
    window = AccumulationWindow(model, micro_steps=2)
    x, y = torch.randn(3, 8, dtype=torch.float64), torch.randint(0, 5, (3,))
    window.backward(loss_sum(model, x, y), 3)
    with pytest.raises(RuntimeError, match="1 of 2 micro-steps"):
        window.close()
    model.fc1.weight.data = model.fc1.weight.data.clone()
    with pytest.raises(RuntimeError, match="fc1.weight.*no longer lives"):
        window.backward(loss_sum(model, x, y), 3)

    with torch.no_grad():
        detached = loss_sum(model, x, y)
    window = AccumulationWindow(MLP(torch.float64))
    with pytest.raises(RuntimeError, match="does not require grad.*nothing was counted"):
        window.backward(detached, 3)
    assert window.micro_step == 0

    model = MLP(torch.float64)
    window = AccumulationWindow(model)
    model.extra = torch.nn.Linear(2, 2, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="parameters changed"):
        window.backward(loss_sum(model, x, y), 3)

    model = MLP(torch.float64)
    window = AccumulationWindow(model)
    model.fc2.bias.grad = torch.zeros_like(model.fc2.bias)
    with pytest.raises(RuntimeError, match="fc2.bias.*not its slot"):
        window.backward(loss_sum(model, x, y), 3)


def test_zero_grad_set_to_none_keeps_the_arena():
    model = MLP(torch.float64)
    window = AccumulationWindow(model, micro_steps=1)
    x, y = torch.randn(3, 8, dtype=torch.float64), torch.randint(0, 5, (3,))
    model.zero_grad()  # set_to_none=True: the window puts its views back
    window.backward(loss_sum(model, x, y), 3)
    assert model.fc1.weight.grad.data_ptr() == window._grads[0].data_ptr()
    assert float(model.fc1.weight.grad.abs().sum()) > 0
    window.close()


def test_docs_snippet_runs(capsys):
    import pathlib
    import re

    doc = pathlib.Path(__file__).resolve().parents[2] / "docs" / "PYTHON.md"
    blocks = re.findall(r"```python torch\n(.*?)```", doc.read_text(), re.S)
    assert len(blocks) == 1
    scope = {}
    exec(compile(blocks[0], str(doc), "exec"), scope)
    printed = capsys.readouterr().out
    assert printed.count("WindowReport(window=") == 2
    assert scope["window"].windows_closed == 2
    assert all(isinstance(p, torch.nn.Parameter) for p in scope["model"].parameters())


def test_dynamic_scaler_seeds_torch_backward():
    torch.manual_seed(0)
    model = MLP(torch.float32)
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(5)
    batch = micro_batches(gen, torch.float32)
    plain = AccumulationWindow(reference, lr=1e-2, micro_steps=K)
    scaled = AccumulationWindow(model, lr=1e-2, micro_steps=K, scaler="dynamic")
    for x, y in batch:
        plain.backward(loss_sum(reference, x, y), (y != IGNORE).sum())
        scaled.backward(loss_sum(model, x, y), (y != IGNORE).sum())
    # The arena holds the gradient times the scale (65536, a power of two: exact).
    g = model.fc1.weight.grad
    assert torch.equal(g, reference.fc1.weight.grad * 65536.0)
    plain.close()
    scaled.close()
    assert scaled.report().loss_scale == 65536.0
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p.detach(), q.detach())


def test_unused_parameters_are_named():
    x, y = torch.randn(3, 8, dtype=torch.float64), torch.randint(0, 5, (3,))
    check = accrue.optim.UnusedParameterCheck.error
    model = MLP(torch.float64)
    window = AccumulationWindow(model, micro_steps=2, unused_parameter_check=check)
    for _ in range(2):
        window.backward(loss_sum(model, x, y), 3)
    window.close()  # every parameter had a gradient: no error

    model = MLP(torch.float64)
    model.spare = torch.nn.Linear(2, 2, dtype=torch.float64)  # never in the forward
    window = AccumulationWindow(model, micro_steps=2, unused_parameter_check=check)
    for _ in range(2):
        window.backward(loss_sum(model, x, y), 3)
    with pytest.raises(accrue.Error, match="spare.weight"):
        window.close()


def test_a_parameter_used_in_one_micro_step_is_used():
    # Note [Torch bridge]: an f32/f64 parameter has no hook; its .grad's version counter says
    # whether a backward added to it. A branch taken in the second micro-step only must count
    # as used, and take the same step as torch's sum over the micro-steps.
    x, y = torch.randn(3, 8, dtype=torch.float64), torch.randint(0, 5, (3,))
    check = accrue.optim.UnusedParameterCheck.error

    def build():
        torch.manual_seed(3)
        model = MLP(torch.float64)
        model.extra = torch.nn.Linear(5, 5, dtype=torch.float64)
        return model

    def loss(model, k):
        out = model(x)
        if k == 1:
            out = model.extra(out)
        return torch.nn.functional.cross_entropy(out, y, reduction="sum")

    model, reference = build(), build()
    window = AccumulationWindow(model, "sgd", lr=0.1, micro_steps=2,
                                unused_parameter_check=check)
    assert window._handles == []  # no hook on an f64 parameter without a process group
    for k in range(2):
        window.backward(loss(model, k), 3)
    window.close()  # every parameter had a gradient in some micro-step: no error
    for k in range(2):
        (loss(reference, k) / 6).backward()
    with torch.no_grad():
        for q in reference.parameters():
            q -= 0.1 * q.grad
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=1e-14, msg=name)


@pytest.mark.parametrize("dampening,nesterov", [(0.0, False), (0.3, False), (0.0, True)])
def test_sgd_and_schedule_equal_torch(dampening, nesterov):
    model, reference, batches = mlp_twins(data_seed=6)

    def factor(step):
        return 1.0 / (1 + step)

    opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01,
                          dampening=dampening, nesterov=nesterov, foreach=False)
    torch_steps(reference, opt, batches, sched=torch.optim.lr_scheduler.LambdaLR(opt, factor))
    window = AccumulationWindow(model, "sgd", lr=0.1, momentum=0.9, dampening=dampening,
                                nesterov=nesterov, weight_decay=0.01, micro_steps=K,
                                lr_schedule=factor)
    window_steps(window, model, batches)
    assert_same_parameters(model, reference, 1e-12)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_model_trains_as_the_eager_one(backend):
    # torch.compile with the bridge's hooks, three windows in f64: aot_eager,
    # and the default backend (inductor: generated C++ on the CPU).
    model, reference, batches = mlp_twins(data_seed=7)
    window = AccumulationWindow(model, lr=1e-2, micro_steps=K)
    compiled = torch.compile(model, backend=backend)
    plain = AccumulationWindow(reference, lr=1e-2, micro_steps=K)
    try:
        compiled(batches[0][0][0])
    except Exception as e:  # no C++ toolchain for inductor here
        pytest.skip(f"torch.compile's {backend} backend does not run here: {type(e).__name__}")
    window_steps(window, compiled, batches)
    window_steps(plain, reference, batches)
    assert_same_parameters(model, reference, 1e-12)


def test_bf16_sum_in_f32_then_adamw_on_the_master():
    torch.manual_seed(0)
    model = MLP(torch.bfloat16)
    twin = copy.deepcopy(model)
    master = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
    gen = torch.Generator().manual_seed(8)
    batch = micro_batches(gen, torch.bfloat16)
    window = AccumulationWindow(model, lr=1e-2, weight_decay=0.1, micro_steps=K)
    sums = [torch.zeros_like(m) for m in master]
    n = 0
    for x, y in batch:
        window.backward(loss_sum(model, x, y), (y != IGNORE).sum())
        twin.zero_grad()
        loss_sum(twin, x, y).backward()
        for s, p in zip(sums, twin.parameters()):
            s.add_(p.grad.float())
        n += int((y != IGNORE).sum())
    # The window's f32 slots hold the bf16 gradients summed in f32, in the same order.
    for i, s in enumerate(sums):
        assert torch.equal(torch.from_dlpack(window.store.grad_view(i).detach()), s)
    window.close()
    opt = torch.optim.AdamW(master, lr=1e-2, weight_decay=0.1, foreach=False)
    for m, s in zip(master, sums):
        m.grad = s / n
    opt.step()
    for i, (m, p) in enumerate(zip(master, model.parameters())):
        stored = torch.from_dlpack(window.store.master_view(i).detach())
        assert (stored - m.detach()).abs().max().item() <= 1e-5 * m.detach().abs().max().item()
        assert torch.equal(p.detach(), stored.to(torch.bfloat16))


cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and accrue.cuda_is_available()),
    reason="needs CUDA in both torch and accrue",
)


# f64 proves the accumulation exact on the GPU. In f32, cuBLAS and the
# attention kernels round a micro-batch and the big batch differently, and
# AdamW turns that rounding of near-zero gradients into parameter differences:
# the block measured 1.6e-4 on an H200 (the CPU's f32 kernels meet 1e-5).
@cuda
@pytest.mark.parametrize("kind", ["mlp", "block"])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-3)])
def test_cuda_equals_big_batch(kind, dtype, tol):
    torch.manual_seed(0)
    model = (MLP(dtype) if kind == "mlp" else Block(dtype)).cuda()
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    seq = 6 if kind == "block" else None
    batches = [
        [(x.cuda(), y.cuda()) for x, y in micro_batches(gen, dtype, seq)]
        for _ in range(WINDOWS)
    ]
    train_reference(reference, batches, 1e-2, 0.1, 0.5)
    window = train_window(model, batches, 1e-2, 0.1, 0.5)
    assert window.store.grads.device == accrue.Device("cuda:0")
    for (name, a), (_, b) in zip(model.named_parameters(), reference.named_parameters()):
        err = (a.detach() - b.detach()).abs().max().item() / b.detach().abs().max().item()
        assert err <= tol, f"{name}: {err}"


class _SlowGrad(torch.autograd.Function):
    """The identity, whose backward first keeps torch's stream busy (about 0.1 s)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        torch.cuda._sleep(200_000_000)
        return g


# Note [Torch bridge streams]: accrue's work runs in torch's stream order. The
# last micro-step's gradient kernels wait behind a long kernel on torch's
# stream; a close not ordered after them would read gradients that have not
# landed. The weights must equal those of a run without the delay, bit for
# bit, on the default stream and on a side stream, with no host read between
# windows.
@cuda
@pytest.mark.skipif(not hasattr(torch.cuda, "_sleep"), reason="needs torch.cuda._sleep")
def test_cuda_close_follows_the_backward_on_torchs_stream():
    torch.manual_seed(0)
    base = MLP(torch.float32).cuda()
    gen = torch.Generator().manual_seed(3)
    batches = [
        [(x.cuda(), y.cuda()) for x, y in micro_batches(gen, torch.float32)] for _ in range(3)
    ]

    def run(stream, slow):
        model = copy.deepcopy(base)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            window = AccumulationWindow(model, lr=1e-2, micro_steps=K, max_grad_norm=0.5)
            for w in batches:
                for k, (x, y) in enumerate(w):
                    logits = model(x)
                    if slow and k == K - 1:
                        logits = _SlowGrad.apply(logits)
                    loss = torch.nn.functional.cross_entropy(
                        logits, y, reduction="sum", ignore_index=IGNORE
                    )
                    window.backward(loss, (y != IGNORE).sum())
                window.close()
            params = [p.detach().clone() for p in model.parameters()]
        torch.cuda.synchronize()
        return params

    expected = run(torch.cuda.current_stream(), slow=False)
    for stream in (torch.cuda.current_stream(), torch.cuda.Stream()):
        for a, b in zip(run(stream, slow=True), expected):
            assert torch.equal(a, b)


@cuda
def test_cuda_bf16_dynamic_scaler_and_resume():
    torch.manual_seed(0)
    base = MLP(torch.bfloat16).cuda()
    gen = torch.Generator().manual_seed(9)
    batches = [
        [(x.cuda(), y.cuda()) for x, y in micro_batches(gen, torch.bfloat16)] for _ in range(3)
    ]

    def run(model, window, windows):
        for w in windows:
            for x, y in w:
                window.backward(loss_sum(model, x, y), (y != IGNORE).sum())
            window.close()

    a = copy.deepcopy(base)
    wa = AccumulationWindow(a, lr=1e-2, micro_steps=K, max_grad_norm=1.0, scaler="dynamic")
    run(a, wa, batches)
    assert not wa.report().skipped and all(p.grad is None for p in a.parameters())
    b = copy.deepcopy(base)
    wb = AccumulationWindow(b, lr=1e-2, micro_steps=K, max_grad_norm=1.0, scaler="dynamic")
    run(b, wb, batches[:1])
    c = copy.deepcopy(base)
    wc = AccumulationWindow(c, lr=1e-2, micro_steps=K, max_grad_norm=1.0, scaler="dynamic")
    wc.load_state_dict(wb.state_dict())
    run(c, wc, batches[1:])
    for p, q in zip(a.parameters(), c.parameters()):
        assert torch.equal(p.detach(), q.detach())


# Note [Window captured whole]: a window recorded whole into a torch CUDA
# graph and replayed gives the eager windows' weights and report bit for bit,
# with an LR schedule that moves every window (each replay stores its rates).
@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_replays_the_eager_windows_bitwise(dtype):
    torch.manual_seed(0)
    base = MLP(dtype).cuda()
    gen = torch.Generator().manual_seed(11)
    batches = [[(x.cuda(), y.cuda()) for x, y in micro_batches(gen, dtype)] for _ in range(6)]

    def make(model):
        return AccumulationWindow(model, lr=1e-2, micro_steps=K, max_grad_norm=0.5,
                                  lr_schedule=lambda step: 1.0 / (1 + step))

    eager = copy.deepcopy(base)
    we = make(eager)
    window_steps(we, eager, batches)

    graphed = copy.deepcopy(base)
    wg = make(graphed)
    side = torch.cuda.Stream()  # torch.cuda.graph's advice: warm up on a side stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        window_steps(wg, graphed, batches[:2])
    torch.cuda.current_stream().wait_stream(side)
    xs = [x.clone() for x, _ in batches[2]]
    ys = [y.clone() for _, y in batches[2]]
    counts = [(y != IGNORE).sum().to(torch.float64) for y in ys]
    graph = torch.cuda.CUDAGraph()
    with wg.capture(graph):
        for k in range(K):
            wg.backward(loss_sum(graphed, xs[k], ys[k]), counts[k])
        wg.close()
    assert (wg.windows_closed, wg.micro_step) == (2, 0)  # the capture ran nothing
    for w in batches[2:]:
        for k, (x, y) in enumerate(w):
            xs[k].copy_(x)
            ys[k].copy_(y)
            counts[k].copy_((y != IGNORE).sum())
        wg.replay(graph)
    assert wg.windows_closed == we.windows_closed == 6
    for (name, a), b in zip(graphed.named_parameters(), eager.parameters()):
        assert torch.equal(a.detach(), b.detach()), name
    ra, rb = wg.report(), we.report()
    assert (ra.loss, ra.items, ra.grad_norm) == (rb.loss, rb.items, rb.grad_norm)


@cuda
def test_cuda_graph_capture_refusals():
    torch.manual_seed(0)
    model = MLP(torch.float32).cuda()
    window = AccumulationWindow(model, lr=1e-2, micro_steps=K)
    x, y = micro_batches(torch.Generator().manual_seed(1), torch.float32)[0]
    x, y = x.cuda(), y.cuda()
    # A number count never seen eagerly cannot be copied to the device inside a capture.
    with pytest.raises(RuntimeError, match="count of .* while a CUDA graph records"):
        with window.capture(torch.cuda.CUDAGraph()):
            window.backward(loss_sum(model, x, y), 17)
    assert window.micro_step == 0  # the host state is back
    # A block that is not one whole window.
    with pytest.raises(Exception, match="exactly 4 backward"):
        with window.capture(torch.cuda.CUDAGraph()):
            window.backward(loss_sum(model, x, y), (y != IGNORE).sum())
    assert window.micro_step == 0
    with pytest.raises(RuntimeError, match="not recorded by this window"):
        window.replay(torch.cuda.CUDAGraph())


def test_capture_is_cuda_only():
    model = MLP(torch.float64)
    window = AccumulationWindow(model, lr=1e-2, micro_steps=K)
    with pytest.raises(RuntimeError, match="CUDA graphs are CUDA's"):
        with window.capture(object()):
            pass
    with pytest.raises(RuntimeError, match="not recorded by this window"):
        window.replay(object())
