"""What the PyTorch decode-step scripts share: the bench shape, random weights, RMSNorm, a
layer's attention with its KV-cache write, a step's inputs at a lane count, the step captured as a CUDA graph, and the median of its
timed replays. Importing it seeds torch's generator, so each script draws the same weights."""
import torch

# The bench checkpoint's shape (`drama fixture --preset bench`).
H, L, NH, NKV, HD = 2048, 24, 16, 4, 128
DENSE, KEPT, K, IE, IS = 6144, 128, 8, 768, 2048
VOCAB, CTX = 4098, 256
dev = torch.device("cuda")
dt = torch.bfloat16
torch.manual_seed(0)


def w(*shape):
    """A random BF16 weight scaled by its input width."""
    return (torch.randn(*shape, device=dev, dtype=dt) * shape[-1] ** -0.5).contiguous()


def rms(x, weight):
    """RMSNorm in FP32, rounded to BF16."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(dt)


def attention(q, k, v, cache, pos, o):
    """One row per lane: this step's keys and values written into `cache` at `pos`, then
    grouped-query attention over it and the output projection `o`, in FP32."""
    b = q.shape[0]
    q, k, v = q.view(b, NH, 1, HD), k.view(b, NKV, 1, HD), v.view(b, NKV, 1, HD)
    kc, vc = cache
    kc.index_copy_(2, pos, k)
    vc.index_copy_(2, pos, v)
    a = torch.nn.functional.scaled_dot_product_attention(q, kc, vc, enable_gqa=True).reshape(b, NH * HD)
    return torch.nn.functional.linear(a, o).float()


def step_inputs(lanes):
    """Random KV caches of CTX positions, one row per lane, and the position written."""
    caches = [
        (
            torch.randn(lanes, NKV, CTX, HD, device=dev, dtype=dt),
            torch.randn(lanes, NKV, CTX, HD, device=dev, dtype=dt),
        )
        for _ in range(L)
    ]
    x = torch.randn(lanes, H, device=dev, dtype=dt)
    return x, caches, torch.tensor([CTX - 1], device=dev)


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
