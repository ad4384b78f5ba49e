"""PyTorch/CUDA baseline of one Drama 3 decode step at the bench shape.

The same step `drama bench` times (24 layers: layer 0 dense, 23 MoE layers with 128 kept
experts, top-8 softmax routing, a gated shared expert; GQA attention over a 256-position KV
cache; the audio head), with the routed experts dequantized to BF16 and every other weight
BF16. Experts are gathered per token on the GPU (no host round trip) and the whole step is
captured once as a CUDA graph and replayed. Weights are random: only speed is measured.

Run on the GPU machine:  python3 bench/pytorch_baseline.py > pytorch.json
"""
import json
import sys

import torch
import torch.nn.functional as F

from torch_step import (
    CTX, DENSE, H, HD, IE, IS, K, KEPT, L, NH, NKV, VOCAB, attention, captured, dev, dt, median_ms, rms, step_inputs,
    w,
)


layers = []
for i in range(L):
    layer = {
        "n1": torch.ones(H, device=dev, dtype=dt),
        "n2": torch.ones(H, device=dev, dtype=dt),
        "q": w(NH * HD, H), "qb": torch.zeros(NH * HD, device=dev, dtype=dt),
        "k": w(NKV * HD, H), "kb": torch.zeros(NKV * HD, device=dev, dtype=dt),
        "v": w(NKV * HD, H), "vb": torch.zeros(NKV * HD, device=dev, dtype=dt),
        "o": w(H, NH * HD),
    }
    if i == 0:
        layer.update(g=w(DENSE, H), u=w(DENSE, H), d=w(H, DENSE))
    else:
        layer.update(
            router=w(KEPT, H), eg=w(KEPT, IE, H), eu=w(KEPT, IE, H), ed=w(KEPT, H, IE),
            sg=w(IS, H), su=w(IS, H), sd=w(H, IS), sgate=w(1, H),
        )
    layers.append(layer)
final_norm = torch.ones(H, device=dev, dtype=dt)
head = w(VOCAB, H)


def weight_bytes(lanes):
    per_layer_attn = 2 * (2 * NH * HD * H + 2 * NKV * HD * H)
    dense = 2 * 3 * DENSE * H
    moe = 2 * (KEPT * H + 2 * IS * H + IS * H + H) + min(KEPT, K * lanes) * 2 * 3 * IE * H
    return L * per_layer_attn + dense + (L - 1) * moe + 2 * VOCAB * H


def step(x, caches, pos):
    b = x.shape[0]
    h = x.float()
    for i, ly in enumerate(layers):
        n = rms(h, ly["n1"])
        q, k, v = (F.linear(n, ly[name], ly[name + "b"]) for name in "qkv")
        h = h + attention(q, k, v, caches[i], pos, ly["o"])
        n = rms(h, ly["n2"])
        if i == 0:
            out = F.linear(F.silu(F.linear(n, ly["g"])) * F.linear(n, ly["u"]), ly["d"])
        else:
            p = torch.softmax(F.linear(n, ly["router"]).float(), -1)
            wts, idx = p.topk(K, -1)
            wts = (wts / wts.sum(-1, keepdim=True)).to(dt)
            flat = idx.reshape(-1)
            xn = n.repeat_interleave(K, 0).unsqueeze(-1)
            g = torch.bmm(ly["eg"].index_select(0, flat), xn)
            u = torch.bmm(ly["eu"].index_select(0, flat), xn)
            e = torch.bmm(ly["ed"].index_select(0, flat), F.silu(g) * u).view(b, K, H)
            out = (e * wts.unsqueeze(-1)).sum(1)
            shared = F.linear(F.silu(F.linear(n, ly["sg"])) * F.linear(n, ly["su"]), ly["sd"])
            out = out + torch.sigmoid(F.linear(n, ly["sgate"])) * shared
        h = h + out.float()
    return F.linear(rms(h, final_norm), head).float()


results = []
for lanes in (1, 2, 8):
    x, caches, pos = step_inputs(lanes)
    graph, logits = captured(step, x, caches, pos)
    ms_median, ms_min = median_ms(graph.replay)
    results.append({
        "lanes": lanes,
        "ms_median": ms_median,
        "ms_min": ms_min,
        "bf16_weight_bytes": weight_bytes(lanes),
        "finite": bool(torch.isfinite(logits).all()),
    })
    print(f"lanes {lanes}: {ms_median:.3f} ms", file=sys.stderr)

print(json.dumps({
    "baseline": "PyTorch BF16, gathered experts, CUDA graph replay",
    "torch": torch.__version__,
    "device": torch.cuda.get_device_name(0),
    "context": CTX,
    "steps": results,
}, indent=2))
