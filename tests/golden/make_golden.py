#!/usr/bin/env python3
"""Generates accrue's golden fixtures from PyTorch (tests/golden/README.md).

    python3 tests/golden/make_golden.py --out tests/golden/fixtures

Writes three small safetensors files (a few tens of KB in all):

  optimizers.safetensors      20-step trajectories of torch.optim.AdamW, Adam and
                              SGD (single-tensor implementation on the CPU, the
                              reference math) from stored initial parameters and
                              a stored gradient sequence assigned as p.grad.
  grad_scaler.safetensors     torch.amp.GradScaler (the real one) over 20 steps
                              whose gradients sometimes hold inf/NaN or overflow
                              when scaled: the scale used, the skip flags, the
                              scale after update() and the parameters.
  clip_grad_norm.safetensors  torch.nn.utils.clip_grad_norm_ on several gradient
                              sets and max_norm values: total norm, clip
                              coefficient and clipped gradients.

Everything is float32 (scales float64, flags int64). Hyperparameters and
settings are in each file's __metadata__ (string -> string), one key per
value, "<case>.<field>", floats written with repr() so they parse back to the
same double. Deterministic: one fixed seed, CPU random numbers.

The torch calls live in TorchBackend; the rest only indexes, scales and stacks
arrays, so the key layout can be checked without torch.
"""

import argparse
import math
import os
import sys

SEED = 20250607
STEPS = 20
SHAPES = [(4, 3), (3,), (5, 2), (2,)]

# Per-step gradient multipliers: the magnitudes rise and fall, so Adam's second
# moment shrinks at times and amsgrad's running max differs from v.
STEP_MULTIPLIERS = [1.0, 2.0, 0.5, 1.0, 3.0, 0.25, 0.1, 1.0, 0.5, 2.0,
                    0.05, 0.3, 1.0, 0.2, 4.0, 0.1, 0.5, 1.0, 0.02, 1.5]
assert len(STEP_MULTIPLIERS) == STEPS

# Every case of optimizers.safetensors. Fields absent from a case do not apply.
OPTIMIZER_CASES = [
    dict(name="adamw", optimizer="AdamW", lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8,
         weight_decay=0.1, amsgrad=False),
    dict(name="adamw_amsgrad", optimizer="AdamW", lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8,
         weight_decay=0.1, amsgrad=True),
    dict(name="adam", optimizer="Adam", lr=1e-2, beta1=0.8, beta2=0.95, eps=1e-6,
         weight_decay=0.05, amsgrad=False),
    dict(name="adam_amsgrad", optimizer="Adam", lr=1e-2, beta1=0.8, beta2=0.95, eps=1e-6,
         weight_decay=0.05, amsgrad=True),
    dict(name="sgd_plain", optimizer="SGD", lr=0.05, momentum=0.0, dampening=0.0,
         weight_decay=0.0, nesterov=False),
    dict(name="sgd_weight_decay", optimizer="SGD", lr=0.05, momentum=0.0, dampening=0.0,
         weight_decay=0.01, nesterov=False),
    dict(name="sgd_momentum", optimizer="SGD", lr=0.01, momentum=0.9, dampening=0.0,
         weight_decay=0.01, nesterov=False),
    dict(name="sgd_momentum_dampening", optimizer="SGD", lr=0.01, momentum=0.9, dampening=0.1,
         weight_decay=0.01, nesterov=False),
    dict(name="sgd_nesterov", optimizer="SGD", lr=0.01, momentum=0.9, dampening=0.0,
         weight_decay=0.01, nesterov=True),
]

# GradScaler settings and the optimizers stepped under it.
SCALER = dict(init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
SCALER_CASES = [
    dict(name="scaler_sgd", optimizer="SGD", lr=0.01, momentum=0.9, dampening=0.0,
         weight_decay=0.01, nesterov=False),
    dict(name="scaler_adamw", optimizer="AdamW", lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8,
         weight_decay=0.1, amsgrad=False),
]
# (step, param, element index, value) written into the scaler's gradient
# sequence. Step 0 skips (so the first real step comes after a skip: SGD's
# momentum buffer and Adam's step count must start there), 4 and 5 skip back to
# back, 11 is NaN, and 15 is finite but overflows float32 once multiplied by the
# scale (>= 16 there), as a real fp16/bf16 overflow would.
OVERFLOW_VALUE = 3.0e37
SCALER_INJECTIONS = [
    (0, 0, (1, 2), math.inf),
    (4, 2, (4, 0), -math.inf),
    (5, 1, (0,), math.inf),
    (11, 3, (1,), math.nan),
    (15, 0, (0, 1), OVERFLOW_VALUE),
    (18, 2, (2, 1), math.inf),
]

# clip_grad_norm_ cases: how the gradients are scaled (per parameter) and max_norm,
# and whether the case must clip (checked here, so a case never silently changes kind).
CLIP_CASES = [
    dict(name="clip_unit", multipliers=[1.0, 1.0, 1.0, 1.0], max_norm=1.0, clips=True),
    dict(name="no_clip", multipliers=[1.0, 1.0, 1.0, 1.0], max_norm=50.0, clips=False),
    dict(name="no_clip_tiny", multipliers=[1e-4, 1e-4, 1e-4, 1e-4], max_norm=0.5, clips=False),
    dict(name="clip_huge", multipliers=[1e3, 1e3, 1e3, 1e3], max_norm=0.25, clips=True),
    dict(name="clip_mixed_scales", multipliers=[100.0, 0.01, 1.0, 0.1], max_norm=3.0, clips=True),
]
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


def meta_value(v):
    """A metadata string: repr for floats (round-trips to the same double)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def case_metadata(meta, case, skip=("name",)):
    for key, value in case.items():
        if key not in skip:
            meta[f"{case['name']}.{key}"] = meta_value(value)


def common_metadata(backend, args_line):
    return {
        "generated_by": "tests/golden/make_golden.py",
        "command": args_line,
        "torch_version": backend.torch_version(),
        "seed": str(SEED),
        "steps": str(STEPS),
        "shapes": ";".join("x".join(str(d) for d in s) for s in SHAPES),
        "num_params": str(len(SHAPES)),
    }


def make_grads(backend, multipliers):
    """grads[i]: [STEPS, *SHAPES[i]], step t of it randn * multipliers[t]."""
    grads = []
    for shape in SHAPES:
        steps = [backend.randn(shape) * float(multipliers[t]) for t in range(STEPS)]
        grads.append(backend.stack(steps))
    return grads


def optimizer_file(backend, args_line):
    init = [backend.randn(s) for s in SHAPES]
    grads = make_grads(backend, STEP_MULTIPLIERS)
    tensors, meta = {}, common_metadata(backend, args_line)
    for i in range(len(SHAPES)):
        tensors[f"init.{i}"] = init[i]
        tensors[f"grads.{i}"] = grads[i]
    meta["cases"] = ",".join(c["name"] for c in OPTIMIZER_CASES)
    meta["implementation"] = "foreach=False fused=False (single-tensor), CPU"
    for case in OPTIMIZER_CASES:
        case_metadata(meta, case)
        trajectory, state = backend.run_optimizer(case, init, grads)
        for i in range(len(SHAPES)):
            tensors[f"{case['name']}.params.{i}"] = trajectory[i]
            for key, value in state[i].items():
                tensors[f"{case['name']}.{key}.{i}"] = value
    return tensors, meta


def scaler_file(backend, args_line):
    init = [backend.randn(s) for s in SHAPES]
    grads = make_grads(backend, STEP_MULTIPLIERS)
    for step, param, index, value in SCALER_INJECTIONS:
        grads[param][(step,) + index] = value
    tensors, meta = {}, common_metadata(backend, args_line)
    for i in range(len(SHAPES)):
        tensors[f"init.{i}"] = init[i]
        tensors[f"grads.{i}"] = grads[i]
    meta["cases"] = ",".join(c["name"] for c in SCALER_CASES)
    meta["scaler_device"] = backend.scaler_device_name()
    meta["implementation"] = ("torch.amp.GradScaler(device); loss = sum((p * g).sum()); "
                              "scaler.scale(loss).backward(); scaler.step(opt); scaler.update(); "
                              "optimizer foreach=False")
    meta["injections"] = ";".join(f"step {s} param {p} index {i} value {v!r}"
                                  for s, p, i, v in SCALER_INJECTIONS)
    for key, value in SCALER.items():
        meta[f"scaler.{key}"] = meta_value(value)
    for case in SCALER_CASES:
        case_metadata(meta, case)
        result = backend.run_scaler(case, init, grads)
        name = case["name"]
        tensors[f"{name}.scale_used"] = result["scale_used"]
        tensors[f"{name}.scale_after"] = result["scale_after"]
        tensors[f"{name}.skipped"] = result["skipped"]
        for i in range(len(SHAPES)):
            tensors[f"{name}.params.{i}"] = result["params"][i]
        # The injections above must be exactly the skipped steps (the overflow
        # one needs a scale large enough to overflow).
        skipped = [t for t in range(STEPS) if int(result["skipped"][t]) != 0]
        expected = sorted({s for s, _, _, _ in SCALER_INJECTIONS})
        if skipped != expected:
            raise RuntimeError(f"{name}: skipped steps {skipped}, expected {expected}")
    return tensors, meta


def clip_file(backend, args_line):
    tensors, meta = {}, common_metadata(backend, args_line)
    meta["cases"] = ",".join(c["name"] for c in CLIP_CASES)
    meta["clip_eps"] = meta_value(CLIP_EPS)
    meta["implementation"] = "torch.nn.utils.clip_grad_norm_(norm_type=2.0, foreach=False), CPU"
    for case in CLIP_CASES:
        name = case["name"]
        grads = [backend.randn(s) * float(m) for s, m in zip(SHAPES, case["multipliers"])]
        meta[f"{name}.max_norm"] = meta_value(case["max_norm"])
        meta[f"{name}.multipliers"] = ",".join(meta_value(m) for m in case["multipliers"])
        result = backend.run_clip(grads, case["max_norm"])
        meta[f"{name}.foreach_true"] = result["foreach_true"]
        clip_coef = float(result["clip_coef"])
        if (clip_coef < 1.0) != case["clips"]:
            raise RuntimeError(f"{name}: clip_coef {clip_coef}, expected clips={case['clips']}")
        tensors[f"{name}.total_norm"] = result["total_norm"]
        tensors[f"{name}.clip_coef"] = result["clip_coef"]
        for i in range(len(SHAPES)):
            tensors[f"{name}.grads.{i}"] = grads[i]
            tensors[f"{name}.clipped.{i}"] = result["clipped"][i]
    return tensors, meta


def write_all(out_dir, backend, save, args_line):
    os.makedirs(out_dir, exist_ok=True)
    for file_name, build in (("optimizers.safetensors", optimizer_file),
                             ("grad_scaler.safetensors", scaler_file),
                             ("clip_grad_norm.safetensors", clip_file)):
        tensors, meta = build(backend, args_line)
        path = os.path.join(out_dir, file_name)
        save({k: backend.to_host(v) for k, v in tensors.items()}, path, meta)
        print(f"wrote {path}: {len(tensors)} tensors, {os.path.getsize(path)} bytes")


class TorchBackend:
    """The only code that calls torch."""

    def __init__(self, torch, scaler_device):
        self.torch = torch
        self.scaler_device = scaler_device
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(SEED)

    def torch_version(self):
        return self.torch.__version__

    def scaler_device_name(self):
        if self.scaler_device == "cuda":
            return f"cuda ({self.torch.cuda.get_device_name()})"
        return self.scaler_device

    def randn(self, shape):
        return self.torch.randn(shape, generator=self.generator, dtype=self.torch.float32)

    def stack(self, tensors):
        return self.torch.stack(tensors)

    def to_host(self, t):
        # save_file wants contiguous CPU tensors that share no memory.
        return t.detach().to("cpu").contiguous().clone()

    def make_optimizer(self, case, params):
        optim = self.torch.optim
        if case["optimizer"] == "SGD":
            return optim.SGD(params, lr=case["lr"], momentum=case["momentum"],
                             dampening=case["dampening"], weight_decay=case["weight_decay"],
                             nesterov=case["nesterov"], foreach=False)
        cls = {"Adam": optim.Adam, "AdamW": optim.AdamW}[case["optimizer"]]
        return cls(params, lr=case["lr"], betas=(case["beta1"], case["beta2"]), eps=case["eps"],
                   weight_decay=case["weight_decay"], amsgrad=case["amsgrad"], foreach=False,
                   fused=False)

    def final_state(self, opt, params):
        state = []
        for p in params:
            s = {}
            for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"):
                value = opt.state[p].get(key)
                if isinstance(value, self.torch.Tensor):
                    s[key] = value.detach().clone()
            state.append(s)
        return state

    def run_optimizer(self, case, init, grads):
        params = [t.clone().requires_grad_(True) for t in init]
        opt = self.make_optimizer(case, params)
        trajectory = [[] for _ in params]
        for t in range(STEPS):
            for p, g in zip(params, grads):
                p.grad = g[t].clone()
            opt.step()
            for i, p in enumerate(params):
                trajectory[i].append(p.detach().clone())
        return [self.torch.stack(x) for x in trajectory], self.final_state(opt, params)

    def run_scaler(self, case, init, grads):
        torch, dev = self.torch, self.scaler_device
        params = [t.to(dev).clone().requires_grad_(True) for t in init]
        opt = self.make_optimizer(case, params)
        scaler = torch.amp.GradScaler(dev, init_scale=SCALER["init_scale"],
                                      growth_factor=SCALER["growth_factor"],
                                      backoff_factor=SCALER["backoff_factor"],
                                      growth_interval=SCALER["growth_interval"])
        scale_used, scale_after, skipped = [], [], []
        trajectory = [[] for _ in params]
        for t in range(STEPS):
            opt.zero_grad(set_to_none=True)
            step_grads = [g[t].to(dev) for g in grads]
            loss = (params[0] * step_grads[0]).sum()
            for p, g in zip(params[1:], step_grads[1:]):
                loss = loss + (p * g).sum()
            used = scaler.get_scale()
            scaler.scale(loss).backward()  # p.grad = scale * g
            nonfinite = not all(bool(torch.isfinite(p.grad).all()) for p in params)
            scaler.step(opt)
            scaler.update()
            after = scaler.get_scale()
            # GradScaler skips exactly when a scaled gradient is non-finite, and
            # then (only then) backs the scale off.
            if nonfinite != (after < used):
                raise RuntimeError(f"{case['name']} step {t}: non-finite={nonfinite} but "
                                   f"scale {used} -> {after}")
            scale_used.append(used)
            scale_after.append(after)
            skipped.append(1 if nonfinite else 0)
            for i, p in enumerate(params):
                trajectory[i].append(p.detach().to("cpu").clone())
        return {
            "scale_used": torch.tensor(scale_used, dtype=torch.float64),
            "scale_after": torch.tensor(scale_after, dtype=torch.float64),
            "skipped": torch.tensor(skipped, dtype=torch.int64),
            "params": [torch.stack(x) for x in trajectory],
        }

    def clip_once(self, grads, max_norm, foreach):
        torch = self.torch
        params = [torch.zeros(g.shape, dtype=torch.float32, requires_grad=True) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=2.0,
                                               error_if_nonfinite=False, foreach=foreach)
        return total.detach().clone(), [p.grad.detach().clone() for p in params]

    def run_clip(self, grads, max_norm):
        torch = self.torch
        total, clipped = self.clip_once(grads, max_norm, foreach=False)
        # torch's own coefficient, in float32, as clip_grad_norm_ forms it.
        clip_coef = torch.clamp(max_norm / (total + CLIP_EPS), max=1.0)
        # foreach=True should agree; the metadata says whether it did.
        try:
            total_fe, clipped_fe = self.clip_once(grads, max_norm, foreach=True)
            pairs = [(total_fe, total)] + list(zip(clipped_fe, clipped))
            if all(torch.equal(a, b) for a, b in pairs):
                foreach_true = "bitwise equal to foreach=False"
            else:
                worst = max(float(((a.double() - b.double()).abs() / b.double().abs()
                                   .clamp(min=1e-30)).max()) for a, b in pairs)
                foreach_true = f"differs from foreach=False: max relative difference {worst:.3g}"
                print(f"warning: clip_grad_norm_ foreach=True {foreach_true}", file=sys.stderr)
        except RuntimeError as e:  # foreach unsupported here: say so, keep foreach=False's
            foreach_true = f"unavailable: {e}".replace("\n", " ")[:200]
        return {"total_norm": total, "clip_coef": clip_coef, "clipped": clipped,
                "foreach_true": foreach_true}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory to write the fixtures into")
    parser.add_argument("--scaler-device", choices=["auto", "cuda", "cpu"], default="auto",
                        help="device of the GradScaler run (auto: cuda when available)")
    args = parser.parse_args()

    import torch
    try:
        from safetensors.torch import save_file
    except ImportError:
        sys.exit("make_golden.py needs the safetensors package (pip install safetensors)")

    device = args.scaler_device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = TorchBackend(torch, device)
    args_line = f"python3 tests/golden/make_golden.py --scaler-device {args.scaler_device}"

    def save(tensors, path, meta):
        save_file(tensors, path, metadata=meta)

    write_all(args.out, backend, save, args_line)


if __name__ == "__main__":
    main()
