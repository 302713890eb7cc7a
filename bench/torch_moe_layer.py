#!/usr/bin/env python3
"""A plain PyTorch expert-parallel MoE layer: the denominator of issue 4's ">= 3x faster than a plain
PyTorch layer (NCCL all_to_all + torch grouped GEMM in BF16)", to be measured in the same device call as
`megamoe bench layer` (docs/perf.md: ratios side by side, not against a figure from another machine).

Per rank (one process per GPU, NCCL): T tokens of H BF16, top-k expert ids (uniform, as bench layer's
default routing) and weights; E / R local experts with W13 [E_local, 2I, H] (gate rows, then up rows) and
W2 [E_local, H, I] in BF16. Forward, as a straightforward torch implementation does it:
  1. every (token, slot) row goes to the rank holding its expert: sort by destination rank, exchange the
     counts (all_to_all_single), then the rows and their local expert ids (all_to_all_single);
  2. sort the received rows by expert; GEMM 1, SiLU(gate) * up, GEMM 2, grouped over experts with
     torch._grouped_mm (--gemm grouped) or one torch.mm per expert (--gemm loop);
  3. rows back to their source rank (all_to_all_single), times the top-k weight, summed per token in fp32.
Timing: CUDA events around whole forwards (host synchronisation for the split sizes included: that is
what a plain layer does), median over --iters after --warmup, rank 0's and the slowest rank's.

  python3 bench/torch_moe_layer.py --ranks 2 --preset dsv3 --tokens 128,2048,8192 --json out.json
  python3 bench/torch_moe_layer.py --ranks 2 --device cpu --preset tiny --check   (gloo; CI-sized check)
"""
import argparse
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# hidden, intermediate, experts, top-k (bench/layer_bench presets; "tiny" for the CPU check).
PRESETS = {
    "dsv3": (7168, 2048, 256, 8),
    "ml3": (7168, 4096, 128, 4),
    "ms4": (4096, 2048, 128, 4),
    "dsv4-flash": (4096, 2048, 256, 6),
    "qwen3-30b": (2048, 768, 128, 8),
    "tiny": (64, 32, 8, 2),
}


def grouped_matmul(x, w, counts, offs, mode):
    """x [rows, K] sorted by expert, w [E, N, K]: rows of expert e times w[e]^T -> [rows, N]."""
    if mode == "grouped":
        return torch._grouped_mm(x, w.transpose(1, 2), offs=offs)
    out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    start = 0
    for e, n in enumerate(counts):
        if n:
            torch.mm(x[start:start + n], w[e].t(), out=out[start:start + n])
        start += n
    return out


def moe_forward(x, ids, weights, w13, w2, ranks, mode):
    tokens, hidden = x.shape
    top_k = ids.shape[1]
    local_experts = w13.shape[0]
    intermediate = w2.shape[2]
    flat_ids = ids.reshape(-1)
    dest = torch.div(flat_ids, local_experts, rounding_mode="floor")
    order = torch.argsort(dest, stable=True)
    send_counts = torch.bincount(dest, minlength=ranks)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send_split, recv_split = send_counts.tolist(), recv_counts.tolist()
    source_token = torch.div(order, top_k, rounding_mode="floor")
    send_rows = x.index_select(0, source_token)
    send_experts = torch.remainder(flat_ids.index_select(0, order), local_experts)
    received = sum(recv_split)
    recv_rows = x.new_empty(received, hidden)
    dist.all_to_all_single(recv_rows, send_rows, recv_split, send_split)
    recv_experts = send_experts.new_empty(received)
    dist.all_to_all_single(recv_experts, send_experts, recv_split, send_split)
    by_expert = torch.argsort(recv_experts, stable=True)
    rows = recv_rows.index_select(0, by_expert)
    counts_t = torch.bincount(recv_experts, minlength=local_experts)
    offs = torch.cumsum(counts_t, 0).to(torch.int32)
    counts = counts_t.tolist() if mode == "loop" else None
    h = grouped_matmul(rows, w13, counts, offs, mode)
    act = torch.nn.functional.silu(h[:, :intermediate]) * h[:, intermediate:]
    y = grouped_matmul(act.contiguous(), w2, counts, offs, mode)
    back_rows = torch.empty_like(y)
    back_rows[by_expert] = y
    back = x.new_empty(tokens * top_k, hidden)
    dist.all_to_all_single(back, back_rows, send_split, recv_split)
    contrib = back.float() * weights.reshape(-1).index_select(0, order).float().unsqueeze(1)
    out = torch.zeros(tokens, hidden, dtype=torch.float32, device=x.device)
    out.index_add_(0, source_token, contrib)
    return out.to(x.dtype)


def expert_weights(expert, hidden, intermediate, device, dtype):
    """Expert `expert`'s W13 [2I, H] and W2 [H, I], from a generator seeded by its global index, so
    every rank (and the check's reference) can rebuild any expert."""
    g = torch.Generator(device="cpu").manual_seed(1000 + expert)
    w13 = torch.randn(2 * intermediate, hidden, generator=g) * hidden ** -0.5
    w2 = torch.randn(hidden, intermediate, generator=g) * intermediate ** -0.5
    return w13.to(device=device, dtype=dtype), w2.to(device=device, dtype=dtype)


def make_inputs(rank, tokens, hidden, experts, top_k, device, dtype, seed):
    g = torch.Generator(device="cpu").manual_seed(seed * 7919 + rank)
    x = torch.randn(tokens, hidden, generator=g).to(device=device, dtype=dtype)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]) if tokens else \
        torch.empty(0, top_k, dtype=torch.int64)
    weights = torch.rand(tokens, top_k, generator=g)
    weights = (weights / weights.sum(dim=1, keepdim=True).clamp_min(1e-6)).to(device=device, dtype=dtype)
    return x, ids.to(device=device, dtype=torch.int64), weights


def reference(x, ids, weights, hidden, intermediate, device):
    """fp32, token by token over its k experts (rebuilt from their seeds)."""
    out = torch.zeros(x.shape[0], hidden, dtype=torch.float32, device=device)
    cache = {}
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e not in cache:
                cache[e] = expert_weights(e, hidden, intermediate, device, torch.float32)
            w13, w2 = cache[e]
            h = w13 @ x[t].float()
            a = torch.nn.functional.silu(h[:intermediate]) * h[intermediate:]
            out[t] += float(weights[t, j]) * (w2 @ a)
    return out


def worker(rank, args):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=args.ranks)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dtype = torch.bfloat16
    hidden, intermediate, experts, top_k = PRESETS[args.preset]
    if experts % args.ranks:
        raise SystemExit(f"experts = {experts} must be a multiple of --ranks = {args.ranks}")
    local = experts // args.ranks
    first = rank * local
    w13 = torch.empty(local, 2 * intermediate, hidden, dtype=dtype, device=device)
    w2 = torch.empty(local, hidden, intermediate, dtype=dtype, device=device)
    for e in range(local):
        if args.check:
            w13[e], w2[e] = expert_weights(first + e, hidden, intermediate, device, dtype)
        else:  # timing only: random bits generated on the device (seconds instead of minutes at dsv3 size)
            w13[e].normal_(0.0, hidden ** -0.5)
            w2[e].normal_(0.0, intermediate ** -0.5)
    mode = args.gemm
    if mode == "grouped" and not (cuda and hasattr(torch, "_grouped_mm")):
        mode = "loop"
    results = []
    for tokens in args.tokens:
        x, ids, weights = make_inputs(rank, tokens, hidden, experts, top_k, device, dtype, args.seed)
        if args.check:
            got = moe_forward(x, ids, weights, w13, w2, args.ranks, mode).float()
            ref = reference(x, ids, weights, hidden, intermediate, device)
            rel = float((got - ref).norm() / ref.norm().clamp_min(1e-30))
            print(f"rank {rank} tokens {tokens}: rel-L2 vs fp32 reference {rel:.3g}", flush=True)
            if not rel < 2e-2:
                raise SystemExit(f"rank {rank}: rel-L2 {rel} >= 2e-2")
            continue
        times = []
        for i in range(args.warmup + args.iters):
            dist.barrier()
            if cuda:
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                moe_forward(x, ids, weights, w13, w2, args.ranks, mode)
                stop.record()
                torch.cuda.synchronize()
                if i >= args.warmup:
                    times.append(start.elapsed_time(stop) * 1000.0)
        median = statistics.median(times) if times else 0.0
        all_medians = [None] * args.ranks
        dist.all_gather_object(all_medians, median)
        if rank == 0:
            row = {"tokens": tokens, "median_us": median, "slowest_rank_median_us": max(all_medians),
                   "rank_medians_us": all_medians, "min_us": min(times) if times else 0.0,
                   "iter_us": times}  # rank 0's forwards in order, as `megamoe bench layer` records them
            results.append(row)
            print(f"torch layer {args.preset} bf16 gemm={mode} ranks={args.ranks} tokens {tokens:6d}: "
                  f"rank 0 median {median:10.1f} us, slowest rank {max(all_medians):10.1f} us", flush=True)
    if rank == 0 and args.json and not args.check:
        with open(args.json, "w") as f:
            json.dump({"bench": "torch_moe_layer", "preset": args.preset, "hidden": hidden,
                       "intermediate": intermediate, "experts": experts, "top_k": top_k, "ranks": args.ranks,
                       "gemm": mode, "torch": torch.__version__, "iters": args.iters, "cases": results}, f, indent=1)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--preset", choices=sorted(PRESETS), default="dsv3")
    p.add_argument("--tokens", default="128,2048,8192", help="tokens per rank, comma-separated")
    p.add_argument("--gemm", choices=["grouped", "loop"], default="grouped")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--check", action="store_true", help="compare with an fp32 per-token reference (small shapes)")
    p.add_argument("--json")
    args = p.parse_args()
    args.tokens = [int(t) for t in args.tokens.split(",") if t]
    if any(t < 0 for t in args.tokens):
        p.error("--tokens must be >= 0")
    mp.spawn(worker, args=(args,), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    sys.exit(main())
