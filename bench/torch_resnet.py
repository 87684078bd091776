#!/usr/bin/env python3
"""torchvision's ResNet trained in PyTorch: the twin of accrue_resnet_bench.

    python3 bench/torch_resnet.py --model resnet50 --micro-batch 64 --k 4 [--compile]

The same protocol as accrue_resnet_bench: synthetic images (two micro-batches
drawn before the timed windows, alternated), random labels, K micro-batches
per window with the loss divided by K (PyTorch's accumulation recipe), then
one optimizer step: SGD with momentum 0.9 (fused on CUDA), bf16 autocast,
channels_last with --channels-last, torch.compile of the model with
--compile. Windows are timed with CUDA events after the warm-up windows; the
last line is one JSON object: images/s and window time (medians) and the peak
of torch.cuda.max_memory_allocated.
"""
import argparse
import json
import statistics
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50", choices=["resnet50", "resnet18"])
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--micro-batch", type=int, default=64)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--cpu", action="store_true", help="run on the CPU (a smoke test)")
    args = p.parse_args()
    if args.micro_batch < 1 or args.k < 1 or args.windows < 1 or args.warmup < 0:
        p.error("--micro-batch, --k and --windows must be >= 1, --warmup >= 0")
    return args


def main():
    args = parse_args()
    import torch
    import torch.nn.functional as F
    import torchvision

    device = torch.device("cpu" if args.cpu or not torch.cuda.is_available() else "cuda")
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)(num_classes=args.classes).to(device)
    layout = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=layout)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=cuda)
    net = torch.compile(model) if args.compile else model
    autocast = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": None}[args.dtype]
    scaler = torch.amp.GradScaler(device.type) if args.dtype == "f16" else None

    gen = torch.Generator(device=device)
    gen.manual_seed(1)
    b, s = args.micro_batch, args.image_size
    batches = [(torch.randn(b, 3, s, s, device=device, generator=gen).to(memory_format=layout),
                torch.randint(0, args.classes, (b,), device=device, generator=gen))
               for _ in range(2)]
    step = [0]

    def run_window():
        for _ in range(args.k):
            x, y = batches[step[0] % 2]
            step[0] += 1
            with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
                loss = F.cross_entropy(net(x), y) / args.k
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        run_window()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    window_ms = []
    for _ in range(args.windows):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss = run_window()
            end.record()
            end.synchronize()
            window_ms.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            loss = run_window()
            window_ms.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median(window_ms)
    print(json.dumps({
        "bench": "torch_resnet",
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "images_per_s_median": b * args.k / (ms / 1e3),
        "window_ms_median": ms,
        "window_ms_min": min(window_ms),
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "final_loss": float(loss) * args.k,
        "config": {"model": args.model, "image_size": s, "micro_batch": b, "micro_steps": args.k,
                   "dtype": args.dtype, "channels_last": args.channels_last,
                   "compile": args.compile, "torch": torch.__version__,
                   "warmup_windows": args.warmup, "timed_windows": args.windows},
    }))


if __name__ == "__main__":
    main()
