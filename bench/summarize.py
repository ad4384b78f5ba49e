"""One line per `drama bench` results file: decode steps, their gathered-expert profile,
the MoE layer alone, prefill, the codec chunk and synthesis (for comparing runs of one call)."""
import json
import sys

for path in sys.argv[1:]:
    d = json.load(open(path))
    steps = " / ".join(f"{s['gpu_ms']:.3f}" for s in d["decode"])
    gathered = " / ".join(
        f"{sum(p['total_us'] for p in s['profile'] if p['kernel'].startswith('Gathered')):.0f}"
        for s in d["decode"]
    )
    moe = " / ".join(f"{s['moe_layer']['gpu_us']:.1f}" for s in d["decode"])
    pre = d["prefill"]
    pre_g = sum(p["total_us"] for p in pre["profile"] if p["kernel"].startswith("Gathered"))
    print(
        f"{path}: {d['machine']['commit']} steps {steps} ms, gathered {gathered} us, "
        f"moe {moe} us, prefill {pre['gpu_ms']:.2f} ms (experts {pre_g / 1000:.1f}), "
        f"codec {d['codec']['gpu_ms']:.3f} ms, synthesis {d['synthesis']['wall_s']:.3f} s, "
        f"roofline {d['roofline']['gb_per_s']:.0f} GB/s"
    )
    kernels = ", ".join(
        f"{k['format']} {k['rows']}x{k['cols']}x{k['lanes']} {k['us']:.1f}" for k in d["kernels"]
    )
    print(f"  kernels (us): {kernels}")
    pair = next(s for s in d["decode"] if s["lanes"] == 2)
    profile = ", ".join(f"{p['kernel']} {p['total_us']:.0f}" for p in pair["profile"])
    print(f"  pair profile (us): {profile}")
