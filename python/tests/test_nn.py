"""Modules: native ones, modules written in Python, state dicts."""

import numpy as np
import pytest

import accrue
from accrue import nn


class Block(nn.Module):
    def __init__(self, gen):
        super().__init__()
        self.fc = nn.Linear(4, 8, dtype=accrue.f64, generator=gen)
        self.scale = nn.Parameter(accrue.ones([8], dtype=accrue.f64))
        self.register_buffer("steps", accrue.zeros([1], dtype=accrue.f64))
        self.register_buffer("table", accrue.zeros([2]), persistent=False)

    def forward(self, x):
        return accrue.tanh(self.fc(x)) * self.scale


class Net(nn.Module):
    def __init__(self, gen):
        super().__init__()
        self.head = nn.Parameter(accrue.randn([8, 3], dtype=accrue.f64, generator=gen))
        self.block = Block(gen)
        self.norm = nn.LayerNorm(3, dtype=accrue.f64)

    def forward(self, x):
        return self.norm(self.block(x) @ self.head)


def test_python_module_registers_parameters_in_order():
    net = Net(accrue.Generator(0))
    names = [n for n, _ in net.named_parameters()]
    assert names == ["head", "block.scale", "block.fc.weight", "block.fc.bias", "norm.weight", "norm.bias"]
    assert net.parameter_count() == 24 + 8 + 32 + 8 + 3 + 3
    assert [n for n, _ in net.named_buffers()] == ["block.steps", "block.table"]
    assert isinstance(net.norm, nn.Module) and isinstance(net, nn.Module)
    out = net(accrue.randn([5, 4], dtype=accrue.f64))
    assert out.shape == (5, 3)
    out.sum().backward()
    assert all(p.grad is not None for p in net.parameters())


def test_state_dict_round_trip():
    a, b = Net(accrue.Generator(1)), Net(accrue.Generator(2))
    sd = a.state_dict()
    assert set(sd) == {"head", "block.scale", "block.fc.weight", "block.fc.bias", "block.steps",
                       "norm.weight", "norm.bias"}
    b.load_state_dict(sd)
    x = accrue.randn([2, 4], dtype=accrue.f64)
    np.testing.assert_array_equal(a(x).detach().numpy(), b(x).detach().numpy())
    bad = dict(sd)
    bad["head"] = accrue.zeros([3, 3], dtype=accrue.f64)
    with pytest.raises(accrue.Error, match="head"):
        b.load_state_dict(bad)
    del bad["head"]
    with pytest.raises(accrue.Error, match="missing"):
        b.load_state_dict(bad)


def test_train_eval_reaches_native_children():
    net = Net(accrue.Generator(0))
    net.eval()
    assert not net.training and not net.block.training and not net.norm.training
    net.train()
    assert net.norm.training


def test_assignment_before_init_is_an_error():
    class Broken(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(accrue.zeros([1]))

    with pytest.raises(AttributeError, match=r"super\(\)\.__init__\(\)"):
        Broken()


def test_native_modules():
    gen = accrue.Generator(0)
    lin = nn.Linear(3, 2, bias=False, generator=gen)
    assert lin.bias is None and lin.weight.shape == (2, 3)
    emb = nn.Embedding(10, 4, generator=gen)
    assert emb(accrue.tensor([[1, 2, 3]])).shape == (1, 3, 4)
    mlp = nn.MLP([4, 8, 2], generator=gen)
    assert [n for n, _ in mlp.named_parameters()][0] == "0.weight" or mlp.parameter_count() == 58
    seq = nn.Sequential(nn.Linear(4, 4, generator=gen), nn.GELU())
    assert seq(accrue.randn([2, 4])).shape == (2, 4)


def test_gpt2_tiny():
    cfg = nn.GPT2Config()
    cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.vocab_size = 2, 2, 16, 8, 50
    model = nn.GPT2(cfg, generator=accrue.Generator(0))
    assert model.config.padded_vocab() == 128
    idx = accrue.randint(0, 50, [2, 8])
    loss = model.loss(idx, idx)
    assert loss.count.item() == 16
    assert abs(loss.mean().item() - np.log(50)) < 0.5
    assert model.logits(idx).shape == (2, 8, 50)
    assert nn.GPT2Config.d12().n_embd == 768 and nn.GPT2Config.from_name("gpt2-medium").n_layer == 24
    cfg.n_head = 3
    with pytest.raises(accrue.Error):
        cfg.validate()


def test_to_dtype_moves_in_place():
    net = Net(accrue.Generator(0))
    head = net.head
    net.head.grad = accrue.ones([8, 3], dtype=accrue.f64)
    before = net.state_dict()["head"].numpy().copy()
    net.to(accrue.f32)
    assert head.dtype == accrue.f32 and net.block.fc.weight.dtype == accrue.f32
    assert net.norm.weight.dtype == accrue.f32 and head.grad.dtype == accrue.f32
    assert head.requires_grad and head.is_leaf
    np.testing.assert_allclose(head.detach().numpy(), before, rtol=1e-6)
    assert net(accrue.randn([2, 4])).dtype == accrue.f32
    net.to("cpu")
    with pytest.raises(accrue.Error, match="device"):
        net.to("gpu")


def test_to_refuses_a_parameter_a_store_holds():
    from accrue import optim

    net = Net(accrue.Generator(0))
    store = optim.ParamStore(net.named_parameters(), optim.ParamStoreOptions(master_dtype=accrue.f64))
    with pytest.raises(accrue.Error, match="'head' is held by a ParamStore"):
        net.to(accrue.f32)
    assert net.head.dtype == accrue.f64 and len(store) == 6
