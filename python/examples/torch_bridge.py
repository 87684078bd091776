"""A PyTorch model trained through accrue's accumulation window, beside the
usual PyTorch recipe on the same data: a small causal transformer language
model (torch.nn.TransformerEncoder with a causal mask), padded micro-batches
of different lengths, K micro-batches a window, AdamW, the norm clipped at 1.

    python python/examples/torch_bridge.py                       # CPU or GPU, 20 windows
    python python/examples/torch_bridge.py --cuda-graphs         # each window replayed (CUDA)

The PyTorch recipe divides each micro-batch's loss by its own token count
(the mean of means, what a per-micro-batch `reduction="mean"` loss gives);
accrue.torch.AccumulationWindow divides the window's summed loss by the
window's token count once (the big batch's mean). With padding the two
differ; with --equal-lengths they train the same model, and the script
prints both runs' losses side by side and their largest parameter
difference. The last line is JSON.
"""

import argparse
import copy
import json

import torch
import torch.nn.functional as F

from accrue.torch import AccumulationWindow

PAD = -100


class TinyLM(torch.nn.Module):
    def __init__(self, vocab, width, layers, heads, seq):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.pos = torch.nn.Parameter(torch.randn(seq, width) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                                 batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, x):
        t = x.shape[1]
        h = self.embed(x) + self.pos[:t]
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        return self.head(h)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--windows", type=int, default=20)
    p.add_argument("--accum", type=int, default=4, help="K micro-batches a window")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--equal-lengths", action="store_true",
                   help="no padding: both recipes then compute the same update")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="record one window into a torch.cuda.CUDAGraph and replay it")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.cuda_graphs and not args.device.startswith("cuda"):
        p.error("--cuda-graphs needs --device cuda")
    for name in ("windows", "accum", "micro_batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.seq_len < 2:
        p.error("--seq-len must be at least 2")
    return args


def batches(args, vocab):
    """Windows of K (inputs, targets): a fixed map of the input is the target, so the loss
    falls; without --equal-lengths each row's tail is padding of a random length."""
    gen = torch.Generator().manual_seed(args.seed + 1)
    out = []
    for _ in range(args.windows):
        window = []
        for _ in range(args.accum):
            x = torch.randint(0, vocab, (args.micro_batch, args.seq_len), generator=gen)
            y = (3 * x + 1) % vocab
            if not args.equal_lengths:
                lengths = torch.randint(args.seq_len // 4, args.seq_len + 1,
                                        (args.micro_batch, 1), generator=gen)
                y = y.masked_fill(torch.arange(args.seq_len) >= lengths, PAD)
            window.append((x.to(args.device), y.to(args.device)))
        out.append(window)
    return out


def loss_sum(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                           reduction="sum", ignore_index=PAD)


def train_torch(model, data, args):
    """The usual recipe: each micro-batch's mean loss / K, clip, AdamW; the window's loss
    reported as the mean of the micro-batches' means."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    losses = []
    for window in data:
        opt.zero_grad()
        total = 0.0
        for x, y in window:
            loss = loss_sum(model, x, y) / (y != PAD).sum()
            (loss / args.accum).backward()
            total += loss.item() / args.accum
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(total)
    return losses


def train_accrue(model, data, args):
    """accrue's window: the loss sum and its token count per micro-batch, one close."""
    window = AccumulationWindow(model, "adamw", lr=args.lr, weight_decay=0.1,
                                micro_steps=args.accum, max_grad_norm=1.0)
    losses = []
    graph = None
    statics = None
    for w, batch in enumerate(data):
        if args.cuda_graphs and w >= 1:  # the first window eagerly: workspaces, plans
            if graph is None:
                statics = [(x.clone(), y.clone(), (y != PAD).sum().double()) for x, y in batch]
                graph = torch.cuda.CUDAGraph()
                with window.capture(graph):
                    for x, y, n in statics:
                        window.backward(loss_sum(model, x, y), n)
                    window.close()
            for (x, y), (sx, sy, sn) in zip(batch, statics):
                sx.copy_(x)
                sy.copy_(y)
                sn.copy_((y != PAD).sum())
            window.replay(graph)
        else:
            for x, y in batch:
                window.backward(loss_sum(model, x, y), (y != PAD).sum())
            window.close()
        losses.append(window.report().loss)  # the one host read a window
    return losses


def main(argv=None):
    args = parse(argv)
    torch.manual_seed(args.seed)
    vocab = 64
    model = TinyLM(vocab, width=64, layers=2, heads=4, seq=args.seq_len).to(args.device)
    reference = copy.deepcopy(model)
    data = batches(args, vocab)
    torch_losses = train_torch(reference, data, args)
    accrue_losses = train_accrue(model, data, args)
    for w, (a, b) in enumerate(zip(torch_losses, accrue_losses)):
        print(f"window {w + 1:3d}  PyTorch {a:.4f}  accrue {b:.4f}")
    diff = max((p.detach() - q.detach()).abs().max().item()
               for p, q in zip(model.parameters(), reference.parameters()))
    print(json.dumps({"example": "torch_bridge", "device": args.device,
                      "equal_lengths": args.equal_lengths, "cuda_graphs": args.cuda_graphs,
                      "torch_first_loss": torch_losses[0], "torch_last_loss": torch_losses[-1],
                      "accrue_first_loss": accrue_losses[0],
                      "accrue_last_loss": accrue_losses[-1], "max_parameter_difference": diff}))


if __name__ == "__main__":
    main()
