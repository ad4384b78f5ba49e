"""The markdown tables of docs/performance.md from one call's results files, so the page's
figures are one call's and anyone can regenerate them:

    python3 bench/tables.py h200-vulkan.json --pytorch h200-pytorch.json \
        --serve h200-serve-load-1.json h200-serve-load-4.json

Prints the decode steps against their floors and PyTorch, where a profiled step's time goes,
the linear kernels against the roofline, and prefill, synthesis, the codec and serving.
Parts a results file lacks (`drama bench --only`) are left out."""
import argparse
import json

from summarize import gathered_us

parser = argparse.ArgumentParser()
parser.add_argument("results", help="a `drama bench` results file")
parser.add_argument("--pytorch", help="bench/pytorch_baseline.py's output from the same call")
parser.add_argument("--serve", nargs="*", default=[], help="bench/load_test.py outputs")
args = parser.parse_args()
d = json.load(open(args.results))
# The run's own context; `--more-contexts` adds steps at others.
RUN_CONTEXT = d["options"]["context"]


def table(header, rows):
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")
    print()


STEP_NAMES = {1: "1 lane", 2: "guidance pair", 4: "4 lanes (two pairs)", 8: "8 lanes (four pairs)"}


def step_name(step):
    """A decode step's name in the page's tables: its lanes, and its context where it is not
    the run's (`--more-contexts`)."""
    name = STEP_NAMES.get(step["lanes"], f"{step['lanes']} lanes")
    if step["context"] != RUN_CONTEXT:
        name += f" at {step['context']} positions"
    return name


def decode_table(steps, pytorch):
    torch_ms = {s["lanes"]: s["ms_median"] for s in pytorch["steps"]} if pytorch else {}
    rows = []
    for s in steps:
        # PyTorch's steps are at the run's context.
        torch = torch_ms.get(s["lanes"]) if s["context"] == RUN_CONTEXT else None
        rows.append([
            step_name(s),
            f"{s['gpu_ms']:.3f} ms",
            f"{torch:.3f} ms" if torch else "-",
            f"{s['floor_ms']:.3f} ms",
            f"{s['ratio_to_floor']:.1f}x",
            f"{s['waiting_dispatches']} of {s['dispatches']}, {s['launch_floor_ms']:.3f} ms",
            f"{s['ratio_to_floors']:.2f}x",
            f"{s['gpu_ms'] / torch:.2f}" if torch else "-",
        ])
    moe = [s["moe_layer"] for s in steps if s["lanes"] in (1, 2, 8) and s["context"] == RUN_CONTEXT]
    rows.append([
        "one MoE layer alone, 1 / 2 / 8 lanes",
        " / ".join(f"{m['gpu_us']:.1f}" for m in moe) + " us",
        "-",
        " / ".join(f"{m['floor_us']:.1f}" for m in moe) + " us",
        " / ".join(f"{m['ratio_to_floor']:.1f}x" for m in moe),
        f"{moe[0]['dispatches']} in all",
        "-",
        "-",
    ])
    table(["step", "drama", "PyTorch BF16, CUDA graph", "floor (bytes / bandwidth)", "drama / floor",
           "waiting launches, their floor", "drama / both floors", "drama / PyTorch"], rows)


def profile_table(steps, prefill):
    shapes = [(step_name(s), s["profile"]) for s in steps]
    if prefill:
        shapes.append((f"prefill of {prefill['rows']} rows", prefill["profile"]))
    kernels = []
    for _, profile in shapes:
        for p in profile:
            if p["kernel"] not in kernels:
                kernels.append(p["kernel"])
    rows = []
    for kernel in kernels:
        row = [f"`{kernel}`"]
        for _, profile in shapes:
            p = next((p for p in profile if p["kernel"] == kernel), None)
            row.append(f"{p['launches']}, {p['total_us']:.0f}" if p else "-")
        rows.append(row)
    table(["kernel"] + [f"{name}: launches, us" for name, _ in shapes], rows)


def kernel_table(kernels):
    rows = []
    for k in kernels:
        name = ("routed expert, " if k["kernel"] == "routed_expert" else "") + k["format"]
        rows.append([
            name,
            f"{k['rows']} x {k['cols']}",
            k["lanes"],
            f"{k['us']:.1f}",
            f"{100 * k['fraction_of_roofline']:.1f}%",
            f"{k['stream_us']:.1f} us",
            f"{k['overlapped_us']:.2f}",
            f"{100 * k['overlapped_fraction_of_roofline']:.0f}%",
            f"{k['overlapped_stream_us']:.2f} us",
        ])
    table(["kernel", "rows x cols", "lanes", "chained us", "of the roofline", "stream, chained",
           "overlapped us", "of the roofline", "stream, overlapped"], rows)


def other_table(d, serve):
    rows = [
        ["read bandwidth (the roofline kernel)", f"{d['roofline']['gb_per_s']:.0f} GB/s"],
        ["a launch that waits for the one before / for nothing",
         f"{d['launch']['dependent_us']:.2f} / {d['launch']['independent_us']:.2f} us"],
    ]
    if "prefill" in d:
        p = d["prefill"]
        experts = gathered_us(p["profile"])
        rows.append([f"prefill of {p['rows']} rows",
                     f"{p['gpu_ms']:.2f} ms (routed experts {experts / 1000:.1f} ms of its profile)"])
    if "synthesis" in d:
        s = d["synthesis"]
        rows.append([f"synthesis of {s['audio_s']:.0f} s of audio ({s['tokens']} tokens, a guidance pair)",
                     f"{s['wall_s']:.3f} s: real-time factor {s['real_time_factor']:.3f}, "
                     f"{s['tokens_per_s']:.0f} tokens/s, first audio after {s['first_audio_s']:.3f} s"])
        # Files before the thirty-third session count the inputs in the submit.
        inputs = f"{s['inputs_s']:.3f} / " if "inputs_s" in s else ""
        rows.append([f"of which forwards ({'inputs / ' if inputs else ''}submit / record / wait), sampling, codec",
                     f"{s['forward_s']:.3f} s ({inputs}{s['submit_s']:.3f} / {s['record_s']:.3f} / "
                     f"{s['wait_s']:.3f}), {s['sampling_s']:.3f} s, {s['codec_s']:.3f} s"])
    if "codec" in d:
        c = d["codec"]
        parts = ", ".join(f"{p['kernel']} {p['launches']}: {p['total_us']:.0f} us" for p in c["profile"])
        rows.append([f"one codec chunk ({c['codes']} codes, {c['samples']} samples)",
                     f"{c['gpu_ms']:.3f} ms in {c['dispatches']} launches ({parts})"])
    for path in serve:
        s = json.load(open(path))
        rows.append([f"`drama serve`, {s['clients']} client(s), {s['requests_per_client']} requests each",
                     f"{s['audio_seconds_per_second']:.2f} s of audio per second, first audio after "
                     f"{s['ttfa_s_median']:.3f} s (median), {len(s['errors'])} errors"])
    table(["measurement", d["machine"]["adapter"]["adapter"]], rows)


print(f"<!-- {args.results}: commit {d['machine']['commit']}, {d['machine']['adapter']['adapter']}, "
      f"{d['machine']['adapter']['driver']}, wgpu {d['machine']['wgpu']} -->\n")
pytorch = json.load(open(args.pytorch)) if args.pytorch else None
if d.get("decode"):
    decode_table(d["decode"], pytorch)
    profile_table(d["decode"], d.get("prefill"))
if d.get("kernels"):
    kernel_table([k for k in d["kernels"] if k["kernel"] != "routed_expert"])
    kernel_table([k for k in d["kernels"] if k["kernel"] == "routed_expert"])
other_table(d, args.serve)
