"""The L2 gather floor of per-query index lists (docs/perf-notes.md, "Per-query lists, second
pass"): a Triton kernel that only gathers each query's listed K and V rows (d64 bf16, one kv
head, lists of 1024 drawn in 0..=i as the bench's random lists, ascending, repeats dropped) and
reduces them: no softmax, no MMA. Run on a GPU machine: `python bench/floors/lists_gather.py
[seqlen]`; prints the best of a few launch shapes, and the same over consecutive rows."""
import json
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def gather(K, V, IDX, CNT, OUT, W: tl.constexpr, D: tl.constexpr, BW: tl.constexpr):
    q = tl.program_id(0)
    d = tl.arange(0, D)
    acc = tl.zeros([BW, D], tl.float32)
    n = tl.load(CNT + q)
    for w0 in range(0, n, BW):
        o = w0 + tl.arange(0, BW)
        idx = tl.load(IDX + q * W + o, mask=o < n, other=0).to(tl.int64)
        k = tl.load(K + idx[:, None] * D + d[None, :], mask=(o < n)[:, None], other=0.0)
        v = tl.load(V + idx[:, None] * D + d[None, :], mask=(o < n)[:, None], other=0.0)
        acc += k.to(tl.float32) * v.to(tl.float32)
    tl.store(OUT + q, tl.sum(acc))


def median_ms(f, n=20):
    for _ in range(3):
        f()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        f()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[n // 2]


def main():
    S, W, D = (int(sys.argv[1]) if len(sys.argv) > 1 else 32768), 1024, 64
    torch.manual_seed(0)
    K = torch.randn(S, D, device="cuda", dtype=torch.bfloat16)
    V = torch.randn_like(K)
    hi = torch.arange(1, S + 1, device="cuda")[:, None]
    idx = (torch.rand(S, W, device="cuda") * hi).long().sort(dim=1)[0]
    dup = torch.zeros_like(idx, dtype=torch.bool)
    dup[:, 1:] = idx[:, 1:] == idx[:, :-1]
    cnt = (~dup).sum(1).int()
    idx = torch.where(dup, torch.full_like(idx, 4 * S), idx).sort(dim=1)[0].clamp(max=S - 1).int().contiguous()
    out = torch.empty(S, device="cuda")
    gb = cnt.sum().item() * 2 * D * 2 / 1e9
    res = {f"bw{bw}-nw{nw}": median_ms(lambda: gather[(S,)](K, V, idx, cnt, out, W, D, bw, num_warps=nw)) for bw in (32, 64, 128) for nw in (2, 4, 8)}
    best = min(res, key=res.get)
    print(json.dumps({"seqlen": S, "GB": gb, "best": best, "ms": res[best], "TBps": gb / res[best], "all": res}))
    seq = ((torch.arange(S, device="cuda")[:, None] + torch.arange(W, device="cuda")[None, :]) % S).int().contiguous()
    ms = median_ms(lambda: gather[(S,)](K, V, seq, cnt, out, W, D, 64, num_warps=4))
    print(json.dumps({"consecutive_rows_ms": ms, "TBps": gb / ms}))


if __name__ == "__main__":
    main()
