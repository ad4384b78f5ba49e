"""A stronger PyTorch/CUDA peer of one Drama 3 decode step at the bench shape.

The step of `pytorch_baseline.py` (same weights, shapes and routing), but with the routed
experts read in place: the step's slots are sorted by expert on the GPU and one grouped GEMM
per projection (`torch._grouped_mm`, CUTLASS on sm90) reads each chosen expert's weights
where they lie, gate and up stacked into one weight; no gathered copies. Timed two ways, at
1, 2 and 8 lanes: captured as a CUDA graph and replayed (eager kernels), and with
`--compile` compiled by `torch.compile` with max-autotune's kernel search (autotuning takes
minutes) and captured as a CUDA graph too. Weights are random: only speed is measured. The
compiled step's logits are checked against the eager step's.

Run on the GPU machine:  python3 bench/pytorch_peer.py [--compile] [--lanes 1,2,8] > peer.json
"""
import json
import sys
import time

import torch
import torch.nn.functional as F

from torch_step import (
    CTX, DENSE, H, HD, IE, IS, K, KEPT, L, NH, NKV, VOCAB, attention, captured, dev, dt, median_ms, rms, step_inputs,
    w,
)
if not hasattr(torch, "_grouped_mm"):
    raise SystemExit(f"torch {torch.__version__} has no torch._grouped_mm")


layers = []
for i in range(L):
    layer = {
        "n1": torch.ones(H, device=dev, dtype=dt),
        "n2": torch.ones(H, device=dev, dtype=dt),
        "qkv": w((NH + 2 * NKV) * HD, H),
        "qkvb": torch.zeros((NH + 2 * NKV) * HD, device=dev, dtype=dt),
        "o": w(H, NH * HD),
    }
    if i == 0:
        layer.update(gu=w(2 * DENSE, H), d=w(H, DENSE))
    else:
        # Experts as grouped GEMM operands: [expert, in, out], read in place.
        layer.update(
            router=w(KEPT, H),
            egu=w(KEPT, 2 * IE, H).transpose(1, 2),
            ed=w(KEPT, H, IE).transpose(1, 2),
            sgu=w(2 * IS, H),
            sd=w(H, IS),
            sgate=w(1, H),
        )
    layers.append(layer)
final_norm = torch.ones(H, device=dev, dtype=dt)
head = w(VOCAB, H)


def swiglu(gu):
    g, u = gu.chunk(2, -1)
    return F.silu(g) * u


def experts(n, ly):
    """The routed experts of rows `n`: slots sorted by expert, grouped GEMMs in place."""
    b = n.shape[0]
    p = torch.softmax(F.linear(n, ly["router"]).float(), -1)
    wts, idx = p.topk(K, -1)
    wts = (wts / wts.sum(-1, keepdim=True)).to(dt)
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(KEPT, device=dev, dtype=torch.int32).scatter_add_(0, flat.int(), torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    xs = n.repeat_interleave(K, 0)[order]
    a = swiglu(torch._grouped_mm(xs, ly["egu"], offs=offs))
    e = torch._grouped_mm(a, ly["ed"], offs=offs)
    back = torch.empty_like(e).index_copy_(0, order, e).view(b, K, H)
    return (back * wts.unsqueeze(-1)).sum(1)


def step(x, caches, pos):
    h = x.float()
    for i, ly in enumerate(layers):
        n = rms(h, ly["n1"])
        q, k, v = F.linear(n, ly["qkv"], ly["qkvb"]).split([NH * HD, NKV * HD, NKV * HD], -1)
        h = h + attention(q, k, v, caches[i], pos, ly["o"])
        n = rms(h, ly["n2"])
        if i == 0:
            out = F.linear(swiglu(F.linear(n, ly["gu"])), ly["d"])
        else:
            shared = F.linear(swiglu(F.linear(n, ly["sgu"])), ly["sd"])
            out = experts(n, ly) + torch.sigmoid(F.linear(n, ly["sgate"])) * shared
        h = h + out.float()
    return F.linear(rms(h, final_norm), head).float()


arguments = sys.argv[1:]
compile_too = "--compile" in arguments
lane_counts = [int(n) for n in arguments[arguments.index("--lanes") + 1].split(",")] if "--lanes" in arguments else [1, 2, 8]
# Inductor's own CUDA graphs skip a step that writes its inputs (the KV caches), so the
# compiled step is autotuned without them and then captured as a graph here.
compiled_step = torch.compile(step, mode="max-autotune-no-cudagraphs", fullgraph=False) if compile_too else None
results = []
for lanes in lane_counts:
    x, caches, pos = step_inputs(lanes)
    # Eager kernels replayed as a CUDA graph.
    graph, eager_logits = captured(step, x, caches, pos)
    graph_ms, graph_min = median_ms(graph.replay)
    entry = {"lanes": lanes, "cuda_graph_ms_median": graph_ms, "cuda_graph_ms_min": graph_min}
    if compile_too:
        # torch.compile max-autotune, replayed as a CUDA graph.
        started = time.perf_counter()
        compiled_step(x, caches, pos)
        torch.cuda.synchronize()
        entry["compile_s"] = time.perf_counter() - started
        compiled_graph, compiled_logits = captured(compiled_step, x, caches, pos)
        entry["compiled_ms_median"], entry["compiled_ms_min"] = median_ms(compiled_graph.replay)
        graph.replay()
        compiled_graph.replay()
        torch.cuda.synchronize()
        entry["compiled_vs_eager_max_rel"] = float((compiled_logits - eager_logits).abs().max() / eager_logits.abs().max())
    entry["finite"] = bool(torch.isfinite(eager_logits).all())
    results.append(entry)
    print(f"lanes {lanes}: {json.dumps(entry)}", file=sys.stderr)
print(json.dumps({
    "peer": "PyTorch BF16, experts in place (grouped GEMM), CUDA graph; and torch.compile max-autotune",
    "torch": torch.__version__,
    "device": torch.cuda.get_device_name(0),
    "context": CTX,
    "steps": results,
}, indent=2))
