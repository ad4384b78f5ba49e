"""One line per `drama bench` results file: decode steps, their attention and gathered-expert profile,
the MoE layer alone, prefill, the codec chunk and synthesis (for comparing runs of one call).
Parts a run left out (`drama bench --only`) are left out here too."""
import json
import sys


def gathered_us(profile):
    """The routed experts' microseconds of a profile (their gathered or grouped launches)."""
    return sum(p["total_us"] for p in profile if p["kernel"].startswith("Gathered"))


def attention_us(profile):
    """Attention's microseconds of a profile (its launches, combining or not)."""
    return sum(p["total_us"] for p in profile if p["kernel"].startswith("Attend"))


def main():
    for path in sys.argv[1:]:
        d = json.load(open(path))
        parts = [f"{path}: {d['machine']['commit']}"]
        steps = d.get("decode")
        if steps:
            parts.append("steps " + " / ".join(f"{s['gpu_ms']:.3f}" for s in steps) + " ms")
            parts.append(
                "lanes@context ms/attention us "
                + " ".join(f"{s['lanes']}@{s['context']}={s['gpu_ms']:.3f}/{attention_us(s['profile']):.0f}" for s in steps)
            )
            parts.append("gathered " + " / ".join(f"{gathered_us(s['profile']):.0f}" for s in steps) + " us")
            parts.append("moe " + " / ".join(f"{s['moe_layer']['gpu_us']:.1f}" for s in steps) + " us")
        if "prefill" in d:
            pre = d["prefill"]
            parts.append(f"prefill {pre['gpu_ms']:.2f} ms (experts {gathered_us(pre['profile']) / 1000:.1f})")
        if "codec" in d:
            parts.append(f"codec {d['codec']['gpu_ms']:.3f} ms")
        if "synthesis" in d:
            parts.append(f"synthesis {d['synthesis']['wall_s']:.3f} s")
        parts.append(f"roofline {d['roofline']['gb_per_s']:.0f} GB/s")
        print(", ".join(parts))
        if d.get("kernels"):
            kernels = ", ".join(
                ("routed " if k.get("kernel") == "routed_expert" else "")
                + f"{k['format']} {k['rows']}x{k['cols']}x{k['lanes']} {k['us']:.1f}"
                + (f" ({k['overlapped_us']:.2f} overlapped)" if "overlapped_us" in k else "")
                for k in d["kernels"]
            )
            print(f"  kernels (us): {kernels}")
        if steps:
            pair = next(s for s in steps if s["lanes"] == 2)
            profile = ", ".join(f"{p['kernel']} {p['total_us']:.0f}" for p in pair["profile"])
            print(f"  pair profile (us): {profile}")


if __name__ == "__main__":
    main()
