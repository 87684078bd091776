"""GPT-2 trained from a Python loop: accrue's native GPT2, the accumulation
Window (optionally replayed as CUDA graphs), AdamW with a warmup + cosine
schedule and the token-shard loader, as accrue_train_gpt2 runs them in C++.

    python python/examples/train_gpt2.py --model d12 --micro-batch 8 --accum 4 --windows 20
    python python/examples/train_gpt2.py --model tiny --device cpu --windows 3   # a smoke run

Without --shards the tokens are random (a speed run); with --shards PATTERN
they come from llm.c-format shards (tools/make_shards.py). Each window prints
its loss and tokens/s (with --log-every N, every N windows: the print reads
the report, the one host synchronization, so the host runs ahead in
between); the last line is JSON
(tokens_per_s_median over the spans after --warmup), for a side-by-side with
`accrue_train_gpt2 --bench`.
"""

import argparse
import json
import statistics
import time

import accrue
from accrue import nn, optim


def config(name):
    if name == "tiny":  # a few layers, for the CPU
        c = nn.GPT2Config.d12()
        c.n_layer, c.n_head, c.n_embd, c.block_size = 2, 2, 64, 64
        c.vocab_size = c.padded_vocab_size = 512
        return c
    return nn.GPT2Config.from_name(name)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="d12", help="tiny, d12, d24, d36 or d48")
    p.add_argument("--device", default="cuda" if accrue.cuda_is_available() else "cpu")
    p.add_argument("--dtype", choices=["bf16", "f32"], default=None,
                   help="the forward's weights (default: bf16 on a GPU, f32 on the CPU)")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=None, help="default: the model's block size")
    p.add_argument("--accum", type=int, default=8, help="K micro-batches a window")
    p.add_argument("--windows", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="windows left out of the median")
    p.add_argument("--log-every", type=int, default=1,
                   help="read the report (a host synchronization) every N windows counted "
                        "from the warm-up's end, and at the last; the rates span the windows "
                        "between")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--shards", default=None, help="llm.c token shards (a glob); default: random")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="replay each micro-step and the close as CUDA graphs (GraphedWindow)")
    p.add_argument("--concurrent-micro-batches", type=int, default=1, metavar="N",
                   help="with --cuda-graphs: N micro-steps in flight, each on its own stream "
                        "(Note [Concurrent micro-batches]; the same bits)")
    p.add_argument("--weight-grad-branch", type=int, default=0, metavar="LAG",
                   help="with --cuda-graphs: the Linear, LayerNorm and classifier parameter gradients on a side "
                        "stream, at most LAG pending (Note [Weight gradients on a branch]; the "
                        "same bits); 0: inline")
    p.add_argument("--close-under-forward", action="store_true",
                   help="step the parameters layer by layer beside the next window's forward "
                        "(WindowOptions.close_under_forward)")
    p.add_argument("--close-max-blocks", type=int, default=0, metavar="N",
                   help="with --close-under-forward: the most thread blocks each range's step "
                        "launches, leaving the other SMs to the forward (0: one full wave)")
    p.add_argument("--fp8", action="store_true",
                   help="each block's projections in FP8, the weights cast once per window "
                        "(GPT2.use_fp8, ParamStore.keep_fp8_copies; docs/FP8.md)")
    p.add_argument("--fp8-recipe", choices=["tensor", "block"], default="tensor",
                   help="with --fp8: a scale per tensor, or per 1 x 128 tile and 128 x 128 block")
    p.add_argument("--fp8-scaling", choices=["current", "delayed"], default="current",
                   help="with --fp8 (tensor recipe): scales from this tensor's amax, or from "
                        "earlier windows' (ParamStore.keep_fp8_delayed_scaling)")
    p.add_argument("--fp8-grad-dtype", choices=["e5m2", "e4m3"], default="e5m2",
                   help="with --fp8: the output gradients' codes")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    fp8_options = (args.fp8_recipe != "tensor" or args.fp8_scaling != "current"
                   or args.fp8_grad_dtype != "e5m2")
    if fp8_options and not args.fp8:
        p.error("--fp8-recipe, --fp8-scaling and --fp8-grad-dtype need --fp8")
    if args.fp8_scaling == "delayed" and args.fp8_recipe != "tensor":
        p.error("--fp8-scaling delayed needs --fp8-recipe tensor")
    for name in ("micro_batch", "accum", "windows", "log_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.close_max_blocks < 0:
        p.error(f"--close-max-blocks must be at least 0, got {args.close_max_blocks}")
    if args.close_max_blocks and not args.close_under_forward:
        p.error("--close-max-blocks needs --close-under-forward")
    if not 0 <= args.warmup < args.windows:
        p.error(f"--warmup ({args.warmup}) must be below --windows ({args.windows})")
    return args


def main(argv=None, on_window=None):
    """on_window(w): called after window w's close (a profiler's step, say)."""
    args = parse(argv)
    cfg = config(args.model)
    seq = args.seq_len or cfg.block_size
    dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "f32")
    gen = accrue.Generator(args.seed)
    model = nn.GPT2(cfg, device=args.device, generator=gen)

    opt = optim.AdamW(args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    params = [p for _, p in model.named_parameters()]
    opt.add_param_group([p for p in params if p.dim() < 2], weight_decay=0.0)
    opt.set_schedule(optim.WarmupCosine(0, args.windows, 0.1))
    store = optim.ParamStore(model.named_parameters(), optim.ParamStoreOptions(
        master_dtype=accrue.f32, compute_dtype=accrue.bf16 if dtype == "bf16" else None,
        moments=opt.moments_needed()))
    if args.fp8:  # kept before the Window, whose close recasts them
        grad_dtype = accrue.f8e4m3 if args.fp8_grad_dtype == "e4m3" else accrue.f8e5m2
        fp8_weights = model.use_fp8(recipe=args.fp8_recipe, grad_dtype=grad_dtype)
        store.keep_fp8_copies(fp8_weights, recipe=args.fp8_recipe)
        if args.fp8_scaling == "delayed":
            store.keep_fp8_delayed_scaling(fp8_weights, grad_dtype=grad_dtype)
    window = optim.Window(store, opt, optim.WindowOptions(
        micro_steps=args.accum, max_grad_norm=args.max_grad_norm,
        close_under_forward=args.close_under_forward, close_max_blocks=args.close_max_blocks))
    graphed = optim.GraphedWindow(window, model.loss) if args.cuda_graphs else None
    if graphed is not None:
        graphed.concurrent_micro_batches = args.concurrent_micro_batches
        graphed.weight_grad_branch = args.weight_grad_branch

    if args.shards:
        shards = accrue.data.TokenShards(args.shards)
        loader = accrue.data.DataLoader(shards, args.micro_batch, seq, vocab_size=cfg.vocab_size)

        def next_batch():
            x, y = loader.next_batch()
            return x.to(accrue.i64).to(args.device), y.to(accrue.i64).to(args.device)
    else:
        def next_batch():
            x = accrue.randint(0, cfg.vocab_size, [args.micro_batch, seq + 1], device=args.device,
                               generator=gen)
            return x[:, :-1].contiguous(), x[:, 1:].contiguous()

    tokens = args.micro_batch * seq * args.accum
    print(f"GPT-2 {args.model} on {args.device} ({dtype}): {sum(p.numel() for p in params):,} "
          f"parameters, "
          f"{args.micro_batch} x {seq} tokens x K = {args.accum} a window")
    rates = []
    last, last_done = time.perf_counter(), 0
    for w in range(args.windows):
        for _ in range(args.accum):
            x, y = next_batch()
            if graphed:
                graphed.backward([x, y])
            else:
                window.backward(model.loss(x, y))
        (graphed or window).close()
        if on_window:
            on_window(w)
        done = w + 1
        if (done - args.warmup) % args.log_every and done != args.windows:
            continue  # no host read: the host runs ahead of the device
        report = window.report()  # the one host read: the time spans the windows since the last
        now = time.perf_counter()
        rate = tokens * (done - last_done) / (now - last)
        if last_done >= args.warmup:
            rates.append(rate)
        last, last_done = now, done
        print(f"window {done:4d}  loss {report.loss:.4f}  grad-norm {report.grad_norm:.4f}  "
              f"{rate:,.0f} tok/s")
    print(json.dumps({"impl": "accrue-python", "model": args.model, "device": args.device,
                      "dtype": dtype, "micro_batch": args.micro_batch, "K": args.accum,
                      "seq_len": seq, "cuda_graphs": args.cuda_graphs,
                      "concurrent_micro_batches": args.concurrent_micro_batches,
                      "weight_grad_branch": args.weight_grad_branch,
                      "close_under_forward": args.close_under_forward,
                      "close_max_blocks": args.close_max_blocks,
                      "fp8": (f"{args.fp8_recipe}, {args.fp8_scaling} scaling, "
                              f"{args.fp8_grad_dtype} gradients") if args.fp8 else None,
                      "tokens_per_s_median": statistics.median(rates),
                      "final_loss": report.loss}))


if __name__ == "__main__":
    main()
