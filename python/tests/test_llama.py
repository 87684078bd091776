"""nn.Llama from Python: configs, batch layouts, training in a Window, the
Hugging Face fixtures and greedy generation against transformers' goldens."""

import pathlib

import numpy as np
import pytest

import accrue
from accrue import nn, optim

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "tests" / "nn" / "fixtures"


def tiny(**changes):
    c = nn.LlamaConfig.from_name("llama-tiny")
    for k, v in changes.items():
        setattr(c, k, v)
    return c


def test_config_presets_and_validation():
    assert "llama-tiny" in nn.LlamaConfig.preset_names()
    c = nn.LlamaConfig.from_name("llama3.2-1b")
    assert c.rope_scaling.type == nn.RopeScaling.Type.llama3 and c.tie_word_embeddings
    assert 1.2e9 < c.parameter_count() < 1.3e9
    bad = tiny(kv_heads=3)
    with pytest.raises(accrue.Error, match="kv_heads"):
        bad.validate()
    with pytest.raises(accrue.Error):
        nn.LlamaConfig.from_name("no-such-model")


def test_batch_layouts_agree():
    gen = accrue.Generator(0)
    model = nn.Llama(tiny(), dtype=accrue.f64, generator=gen)
    idx = accrue.randint(0, 256, [2, 6], generator=gen)
    full = model(idx).detach().numpy()
    assert full.shape == (2, 6, 64)
    # Padded: row 1 holds 4 tokens; its first 4 positions equal the full forward's.
    padded = model(idx, nn.BatchLayout.padded([6, 4])).detach().numpy()
    np.testing.assert_allclose(padded[0], full[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(padded[1, :4], full[1, :4], rtol=1e-12, atol=1e-12)
    # Packed: the two rows as two documents of one row of 12 tokens.
    layout = nn.BatchLayout.packed_documents([6, 6], 1, 12)
    assert layout.is_packed and not layout.is_padded
    packed = model(idx.reshape([1, 12]), layout).detach().numpy()
    np.testing.assert_allclose(packed.reshape(2, 6, 64), full, rtol=1e-12, atol=1e-12)
    # The same from tensors: explicit offsets (positions derived) and lengths.
    cu = accrue.tensor([0, 6, 12])
    explicit = model(idx.reshape([1, 12]), nn.BatchLayout.packed(cu)).detach().numpy()
    np.testing.assert_array_equal(explicit, packed)
    # Documents within rows: row 0 holds documents of 2 and 4 tokens, row 1 one
    # of 6; through the bias, as the packed layout computes them.
    positions = accrue.tensor([[0, 1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])
    within = model(idx, nn.BatchLayout.documents_within_rows(positions)).detach().numpy()
    as_packed = model(idx, nn.BatchLayout.packed(accrue.tensor([0, 2, 6, 12]), positions))
    np.testing.assert_allclose(within, as_packed.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(within[1], full[1], rtol=1e-12, atol=1e-12)
    lens = nn.BatchLayout.padded(accrue.tensor([6, 4]))
    assert lens.is_padded
    np.testing.assert_array_equal(model(idx, lens).detach().numpy(), padded)
    logits = model.logits(idx)
    assert logits.shape == (2, 6, 256)


def test_tiny_llama_trains_in_a_window():
    gen = accrue.Generator(1)
    model = nn.Llama(tiny(), dtype=accrue.f64, generator=gen)
    opt = optim.AdamW(3e-3)
    store = optim.ParamStore(model.named_parameters(),
                             optim.ParamStoreOptions(master_dtype=accrue.f64,
                                                     moments=opt.moments_needed()))
    window = optim.Window(store, opt, optim.WindowOptions(micro_steps=2, max_grad_norm=1.0))
    # One fixed batch of a repeating sequence: the loss must fall.
    idx = accrue.tensor(np.tile(np.arange(9) * 7 % 256, (4, 1))[:, :8])
    targets = accrue.tensor(np.tile(np.arange(9) * 7 % 256, (4, 1))[:, 1:])
    losses = []
    for _ in range(3):
        for m in range(2):
            window.backward(model.loss(idx[m * 2:(m + 1) * 2], targets[m * 2:(m + 1) * 2]))
        window.close()
        losses.append(window.report().loss)
    assert all(np.isfinite(losses)), losses
    assert losses[2] < losses[0], losses


@pytest.mark.skipif(not (FIXTURES / "hf_llama_tiny").exists(), reason="no fixtures")
def test_from_hf_save_hf_roundtrip(tmp_path):
    model = nn.Llama.from_hf(str(FIXTURES / "hf_llama_tiny"), dtype=accrue.f64)
    c = model.config
    assert (c.hidden, c.layers, c.heads, c.kv_heads, c.head_dim) == (32, 2, 4, 2, 8)
    assert c.rope_scaling.type == nn.RopeScaling.Type.llama3
    assert nn.read_hf_config(str(FIXTURES / "hf_llama_tiny" / "config.json")) == c
    model.save_hf(str(tmp_path))
    again = nn.Llama(c, dtype=accrue.f64, generator=accrue.Generator(9))
    again.load_hf(str(tmp_path))
    idx = accrue.tensor([[1, 5, 9, 2]])
    with accrue.no_grad():
        np.testing.assert_array_equal(again.logits(idx).numpy(), model.logits(idx).numpy())


def goldens():
    cases = []
    for line in (FIXTURES / "generate_golden.txt").read_text().splitlines():
        kind, *rest = line.split()
        if kind == "case":
            cases.append({"name": rest[0], "dir": rest[1], "new": int(rest[2]),
                          "prompt": [int(x) for x in rest[3:]]})
        elif kind == "tokens":
            cases[-1]["tokens"] = [int(x) for x in rest]
        elif kind == "logits":
            cases[-1]["logits"] = np.array([float(x) for x in rest[1:]])
        elif kind == "stop":
            k = int(rest[0])
            cases[-1]["eos"] = [int(x) for x in rest[1:1 + k]]
            cases[-1]["stopped"] = [int(x) for x in rest[1 + k:]]
    return cases


@pytest.mark.skipif(not (FIXTURES / "generate_golden.txt").exists(), reason="no fixtures")
def test_generate_greedy_matches_transformers_goldens():
    cases = goldens()
    assert len(cases) == 6
    for c in cases:
        model = nn.Llama.from_hf(str(FIXTURES / c["dir"]), dtype=accrue.f64)
        out = nn.generate_greedy(model, c["prompt"], c["new"])
        assert out == c["tokens"], c["name"]
        stopped = nn.generate_greedy(model, c["prompt"], c["new"], stop_ids=c["eos"])
        assert stopped == c["stopped"], c["name"]
        # The first step's logits, through the KV cache.
        cache = nn.LlamaKVCache(model, 1, len(c["prompt"]) + 1)
        logits = cache(accrue.tensor([c["prompt"]])).numpy()[0, -1]
        assert cache.length == len(c["prompt"])
        np.testing.assert_allclose(logits, c["logits"], rtol=0, atol=1e-10 * max(1, abs(c["logits"]).max()))


def test_layers_composed_in_python_equal_the_forward():
    gen = accrue.Generator(2)
    model = nn.Llama(tiny(), dtype=accrue.f64, generator=gen)
    idx = accrue.randint(0, 256, [2, 5], generator=gen)
    positions = accrue.arange(5)
    with accrue.no_grad():
        x = accrue.embedding(model.embed_tokens, idx)
        normed = model.layer(0).input_layernorm(x)
        for i in range(model.num_layers):
            nxt = model.layer(i + 1).input_layernorm if i + 1 < model.num_layers else model.norm
            x, normed = model.layer(i).forward(x, normed, nxt, positions)
        np.testing.assert_array_equal(normed.numpy(), model(idx).numpy())
        layer = model.layer(1)
        assert layer.self_attn.q_norm is None
        assert layer.mlp.gate_proj.weight.shape == (128, 64)
        assert layer.self_attn(x, positions).shape == (2, 5, 64)
        assert layer.mlp(x).shape == (2, 5, 64)


def test_layers_built_on_their_own_compose_a_model_that_trains():
    # A decoder written in Python from Llama's own layers (no nn.Llama): each
    # layer's parameters as a Llama layer's, the stack trains in a Window.
    cfg = tiny()
    gen = accrue.Generator(4)

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden, dtype=accrue.f64,
                                      generator=gen)
            self.layer0 = nn.LlamaDecoderLayer(cfg, dtype=accrue.f64, generator=gen)
            self.layer1 = nn.LlamaDecoderLayer(cfg, dtype=accrue.f64, generator=gen)
            self.norm = nn.RMSNorm(cfg.hidden, cfg.rms_eps, dtype=accrue.f64)
            self.head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False,
                                  dtype=accrue.f64, generator=gen)

        def forward(self, idx):
            positions = accrue.arange(idx.shape[1])
            x = self.embed(idx)
            layers = [self.layer0, self.layer1]
            normed = layers[0].input_layernorm(x)
            for i, layer in enumerate(layers):
                nxt = layers[i + 1].input_layernorm if i + 1 < 2 else self.norm
                x, normed = layer.forward(x, normed, nxt, positions)
            return self.head(normed)

    model = Decoder()
    layer = nn.LlamaDecoderLayer(cfg, dtype=accrue.f64, generator=gen)
    prefix = "model.layers.0."
    assert [n for n, _ in layer.named_parameters()] == \
        [n[len(prefix):] for n, _ in nn.Llama(cfg, dtype=accrue.f64).named_parameters()
         if n.startswith(prefix)]
    assert nn.LlamaAttention(cfg, dtype=accrue.f64)(
        accrue.randn([1, 3, cfg.hidden], dtype=accrue.f64), accrue.arange(3)).shape == \
        (1, 3, cfg.hidden)
    assert nn.LlamaMLP(cfg, dtype=accrue.f64).up_proj.weight.shape == \
        (cfg.intermediate, cfg.hidden)
    opt = optim.AdamW(1e-2)
    store = optim.ParamStore(model.named_parameters(),
                             optim.ParamStoreOptions(master_dtype=accrue.f64,
                                                     moments=opt.moments_needed()))
    window = optim.Window(store, opt, optim.WindowOptions(micro_steps=2))
    losses = []
    for step in range(8):
        idx = accrue.randint(0, cfg.vocab_size, [2, 9], generator=accrue.Generator(step % 2))
        logits = model(idx[:, :-1].contiguous())
        window.backward(accrue.cross_entropy(logits.reshape([-1, cfg.vocab_size]),
                                             idx[:, 1:].contiguous().reshape([-1])))
        if window.ready():
            window.close()
            losses.append(window.report().loss)
    assert losses[-1] < losses[0]
