"""What the PyTorch decode-step scripts share: a step's inputs at a lane count, the step
captured as a CUDA graph, and the median of its timed replays."""
import torch


def step_inputs(lanes, layers, kv_heads, context, head_dim, hidden, dtype):
    """Random KV caches of `context` positions, one row per lane, and the position written."""
    dev = torch.device("cuda")
    caches = [
        (
            torch.randn(lanes, kv_heads, context, head_dim, device=dev, dtype=dtype),
            torch.randn(lanes, kv_heads, context, head_dim, device=dev, dtype=dtype),
        )
        for _ in range(layers)
    ]
    x = torch.randn(lanes, hidden, device=dev, dtype=dtype)
    return x, caches, torch.tensor([context - 1], device=dev)


def captured(step, *args):
    """`step(*args)` warmed on a side stream, then captured as a CUDA graph: (graph, its output)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = step(*args)
    return graph, output


def median_ms(run, repeats=30):
    """Median and minimum milliseconds of `run()`, by CUDA events, after five warm runs."""
    for _ in range(5):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2], times[0]
