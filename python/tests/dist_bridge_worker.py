"""One rank of test_dist.py's data-parallel bridge run (torchrun), or, with
--single, the one-process reference on the whole batch: an f64 MLP on CUDA
trained 3 windows by accrue.torch.AccumulationWindow; prints or writes each
rank's final parameters and losses as JSON. --bf16-transport: the buckets
travel in bf16 and are 1 KiB each (bucket_cap_mb, grad_transport)."""

import json
import os
import sys

import torch

from accrue.torch import AccumulationWindow

K, ROWS, WINDOWS = 2, 8, 3  # per rank: K micro-batches of ROWS rows


def batches(world_windows):
    gen = torch.Generator().manual_seed(7)
    return [(torch.randn(2 * K * ROWS, 6, generator=gen, dtype=torch.float64),
             torch.randint(0, 5, (2 * K * ROWS,), generator=gen)) for _ in range(world_windows)]


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 5)).double().cuda()


def main():
    single = "--single" in sys.argv
    zero1 = "--zero1" in sys.argv
    small_bf16 = {"bucket_cap_mb": 0.001, "grad_transport": "bf16"} \
        if "--bf16-transport" in sys.argv else {}
    if single:
        rank, world, group = 0, 1, None
        torch.cuda.set_device(0)
    else:
        import torch.distributed as dist

        dist.init_process_group("nccl")
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.cuda.set_device(rank)
        group = dist.group.WORLD
    # Ranks start from different weights: the window broadcasts rank 0's.
    net = model(seed=1 + rank)
    micro = 2 * K if single else K
    window = AccumulationWindow(net, "adamw", lr=1e-2, weight_decay=0.1, micro_steps=micro,
                                max_grad_norm=0.5, process_group=group, zero1=zero1,
                                **small_bf16)
    losses = []
    for x, y in batches(WINDOWS):
        rows = range(0, 2 * K * ROWS) if single else range(rank * K * ROWS, (rank + 1) * K * ROWS)
        x, y = x[list(rows)].cuda(), y[list(rows)].cuda()
        for m in range(micro):
            xs, ys = x[m * ROWS:(m + 1) * ROWS], y[m * ROWS:(m + 1) * ROWS]
            loss = torch.nn.functional.cross_entropy(net(xs), ys, reduction="sum")
            window.backward(loss, ys.numel())
        window.close()
        losses.append(window.report().loss)
    params = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).cpu().tolist()
    # Note [Torch bridge data parallelism]: the last micro-step's buckets go during its backward.
    sent = 0 if window.reducer is None else window.reducer.buckets_sent_in_backward
    result = {"rank": rank, "params": params, "losses": losses, "sent_in_backward": sent}
    if single:
        print(json.dumps(result))
        return
    import torch.distributed as dist

    everyone = [None] * world
    dist.all_gather_object(everyone, result)
    if rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(everyone, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
