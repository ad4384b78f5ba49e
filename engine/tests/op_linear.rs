//! GPU linear kernels (BF16, NVFP4, FP8 block-scaled; dense and expert-gathered) against the
//! FP64 reference on fresh random inputs at odd sizes, with poisoned outputs.

mod common;

use common::*;
use drama_engine::exec::{LinearIo, linear_launches, linear_pair_launch, route_launch};
use drama_engine::weights::GpuLinear;
use drama_kernels::flags::{self, bit};
use drama_kernels::{
    EXPERT_GROUP_SLOTS, ElementwiseParams, GroupParams, Kernel, LINEAR_PASS_ROWS, LinearInput, LinearParams,
    LinearWidth, RouterParams, WeightFormat,
};
use drama_reference::stored::{self, StoredWeights as Weights};
use rand_chacha::ChaCha8Rng;
use rand_core::Rng;

/// Random weights of `format` (`drama_reference::stored`), NVFP4 with a random per-tensor
/// factor.
fn random_weights(rng: &mut ChaCha8Rng, format: WeightFormat, rows: usize, cols: usize) -> Weights {
    let tensor_scale = 0.001 + (rng.next_u32() % 1000) as f32 * 1e-4;
    stored::random_weights(rng, format, rows, cols, tensor_scale)
}

/// Adds to `dispatches` a `pack_bf16` launch packing the `values` BF16 values of `x` into
/// pairs; returns its parameter block and the pairs' buffer (poisoned first).
fn packed_on_gpu(
    gpu: &drama_engine::gpu::Gpu,
    x: &wgpu::Buffer,
    values: usize,
    dispatches: &mut Vec<drama_engine::gpu::Dispatch>,
) -> (wgpu::Buffer, wgpu::Buffer) {
    let words = values / 2;
    let pairs = poisoned(gpu, "x pairs", words);
    let params = gpu.uniform(
        "pack params",
        &ElementwiseParams {
            count: words as u32,
            ..Default::default()
        },
    );
    let grid = [words.div_ceil(64) as u32, 1, 1];
    dispatches.push(dispatch(gpu, Kernel::PackBf16, &[&params, x, &pairs], grid));
    (params, pairs)
}

/// What a grouped routed-expert launch reads besides its weights: the slots' blocks and
/// order (`group_slots`) and its input as BF16 pairs (`pack_bf16`), each poisoned first.
struct Grouping {
    /// The blocks' entries (the grid's rows).
    count: usize,
    blocks: wgpu::Buffer,
    order: wgpu::Buffer,
    pairs: wgpu::Buffer,
    grouped: bool,
    _params: [wgpu::Buffer; 2],
}

impl Grouping {
    /// The buffers for the `slots` slots of `ids` (routed among `experts`) reading the
    /// `values` BF16 values of `x`, and the launches a step's dispatches start with: with
    /// `grouped` the packing and grouping that fill them, else none.
    fn on_gpu(
        gpu: &drama_engine::gpu::Gpu,
        ids: &wgpu::Buffer,
        slots: usize,
        experts: usize,
        x: &wgpu::Buffer,
        values: usize,
        grouped: bool,
    ) -> (Grouping, Vec<drama_engine::gpu::Dispatch>) {
        let count = slots.div_ceil(EXPERT_GROUP_SLOTS) + experts;
        let (blocks, order) = (poisoned(gpu, "blocks", 4 * count), poisoned(gpu, "order", slots));
        let group_params = gpu.uniform(
            "group params",
            &GroupParams {
                slots: slots as u32,
                experts: experts as u32,
                blocks: count as u32,
                pad: 0,
            },
        );
        let mut launches = Vec::new();
        let (pack_params, pairs) = packed_on_gpu(gpu, x, values, &mut launches);
        launches.push(dispatch(
            gpu,
            Kernel::GroupSlots,
            &[&group_params, ids, &blocks, &order],
            [1, 1, 1],
        ));
        if !grouped {
            launches.clear();
        }
        let grouping = Grouping {
            count,
            blocks,
            order,
            pairs,
            grouped,
            _params: [group_params, pack_params],
        };
        (grouping, launches)
    }

    /// What the expert launches read: the pairs when grouped, else `x` itself.
    fn input<'a>(&'a self, x: &'a wgpu::Buffer) -> &'a wgpu::Buffer {
        if self.grouped { &self.pairs } else { x }
    }
}

struct Run {
    y: Vec<f32>,
    want: Vec<f64>,
    scale: Vec<f64>,
}

/// Runs the dense linear kernel on `rows` rows of x read as `input` (BF16 pairs packed on
/// the GPU first), with the weight split in two row segments (as the engine splits weights
/// past the binding limit), optionally adding a residual stream to the outputs, and computes
/// the reference.
fn run_linear(
    w: &Weights,
    x: &[f32],
    rows: usize,
    bias: Option<&[f32]>,
    round: bool,
    residual: Option<&[f32]>,
    input: LinearInput,
) -> Run {
    let gpu = gpu();
    let split = match w.format {
        WeightFormat::Fp8Block if w.rows > 128 => 128,
        WeightFormat::Fp8Block => w.rows,
        _ => w.rows.div_ceil(2),
    };
    let xb = gpu.buffer_with("x", &f32_bytes(x));
    let bias_bytes = bias.map(pack_bf16).unwrap_or_else(|| vec![0; 4]);
    let bb = gpu.buffer_with("bias", &bias_bytes);
    let rb = gpu.buffer_with("residual", &f32_bytes(residual.unwrap_or(&[0.0])));
    let y = poisoned(gpu, "y", rows * w.rows);
    let kernel = Kernel::Linear(w.format, input);
    let mut dispatches = Vec::new();
    let packed = packed_on_gpu(gpu, &xb, x.len(), &mut dispatches);
    let xb = match input {
        LinearInput::F32 => &xb,
        LinearInput::Bf16Pairs => &packed.1,
    };
    for (start, end) in [(0, split), (split, w.rows)] {
        if start == end {
            continue;
        }
        let (codes, scales) = match w.format {
            WeightFormat::Bf16 => (w.packed[start * w.cols * 2..end * w.cols * 2].to_vec(), vec![0; 4]),
            WeightFormat::Nvfp4 => (
                w.packed[start * w.cols / 2..end * w.cols / 2].to_vec(),
                w.scales[start * w.cols / 16..end * w.cols / 16].to_vec(),
            ),
            WeightFormat::Fp8Block => {
                let tile_row = w.cols.div_ceil(128) * 4;
                (
                    w.packed[start * w.cols..end * w.cols].to_vec(),
                    w.scales[start / 128 * tile_row..end.div_ceil(128) * tile_row].to_vec(),
                )
            }
        };
        let params = LinearParams {
            rows: rows as u32,
            in_features: w.cols as u32,
            out_features: (end - start) as u32,
            out_offset: start as u32,
            y_stride: w.rows as u32,
            x_row_div: 1,
            expert_begin: 0,
            expert_end: 0,
            flags: bit(bias.is_some(), flags::linear::BIAS)
                | bit(round, flags::linear::ROUND)
                | bit(residual.is_some(), flags::linear::RESIDUAL),
            tensor_scale: w.tensor_scale,
            bias_offset: start as u32,
            ..Default::default()
        };
        let p = gpu.uniform("params", &params);
        let wb = gpu.buffer_with("w", &codes);
        let sb = gpu.buffer_with("scales", &scales);
        // The cache write's and the linear pair's bindings are unused here (w and y stand in
        // for the pair's, y for the other read_write ones).
        let none = &bb;
        let mut buffers: Vec<&wgpu::Buffer> = vec![&p, xb, &wb];
        if w.format != WeightFormat::Bf16 {
            buffers.push(&sb);
        }
        buffers.extend([&bb, &y, &rb, xb, none, none, none, &y, &y, &wb, &y]);
        // At most two workgroup rows share the passes over the activation rows, so that
        // longer batches make a workgroup take several passes.
        let row_blocks = rows.div_ceil(LINEAR_PASS_ROWS).min(2) as u32;
        dispatches.push(dispatch(
            gpu,
            kernel,
            &buffers,
            [
                ((end - start) as u32).div_ceil(w.format.rows_per_workgroup(kernel.linear_width().unwrap())),
                row_blocks,
                1,
            ],
        ));
    }
    run(gpu, &dispatches);
    let got = gpu.read_f32(&y).unwrap();
    let mut want = Vec::new();
    let mut scale = Vec::new();
    for r in 0..rows {
        for n in 0..w.rows {
            let mut acc = 0.0;
            let mut magnitude = 0.0;
            for k in 0..w.cols {
                let term = w.decoded[n * w.cols + k] * f64::from(x[r * w.cols + k]);
                acc += term;
                magnitude += term.abs();
            }
            if let Some(b) = bias {
                acc += f64::from(b[n]);
                magnitude += f64::from(b[n]).abs();
            }
            let exact = acc;
            let mut value = if round {
                f64::from(drama_checkpoint::numerics::round_to_bf16(exact as f32))
            } else {
                exact
            };
            // The residual is added in f32 after rounding: one more f32 step of the sum.
            let added = residual.map_or(0.0, |res| f64::from(res[r * w.rows + n]));
            value += added;
            want.push(value);
            // f32 accumulation error, plus one BF16 step when the output is rounded.
            scale.push(magnitude + added.abs() + if round { bf16_ulp(exact) / TOL } else { 0.0 });
        }
    }
    Run { y: got, want, scale }
}

const TOL: f64 = 2e-6;

fn linear_case(
    format: WeightFormat,
    rows: usize,
    out: usize,
    in_: usize,
    with_bias: bool,
    round: bool,
    with_residual: bool,
) {
    let label = format!(
        "linear {format:?} rows {rows} out {out} in {in_} bias {with_bias} round {round} residual {with_residual}"
    );
    let mut rng = rng(&label);
    let w = random_weights(&mut rng, format, out, in_);
    let x = bf16_values(&mut rng, rows * in_, 2.0);
    let bias = with_bias.then(|| bf16_values(&mut rng, out, 0.5));
    let residual = with_residual.then(|| uniform(&mut rng, rows * out, 3.0));
    let run = |x: &[f32], rows: usize, residual: Option<&[f32]>, input: LinearInput| {
        run_linear(&w, x, rows, bias.as_deref(), round, residual, input)
    };
    let result = run(&x, rows, residual.as_deref(), LinearInput::F32);
    check(&label, &result.y, &result.want, &result.scale, TOL);
    assert_rows_alone_match(&label, &result.y, rows, out, |r| {
        let residual_row = residual.as_ref().map(|res| &res[r * out..(r + 1) * out]);
        run(&x[r * in_..(r + 1) * in_], 1, residual_row, LinearInput::F32).y
    });
    // Read as BF16 pairs (steps of many rows), every output has the same bits.
    let pairs = run(&x, rows, residual.as_deref(), LinearInput::Bf16Pairs);
    assert_eq!(bits(&pairs.y), bits(&result.y), "{label}: input as BF16 pairs");
}

/// Batch invariance: the first and last rows computed alone (`alone(r)`) give the same bits
/// as inside the batch's output `batched` ([rows, width]).
fn assert_rows_alone_match(label: &str, batched: &[f32], rows: usize, width: usize, alone: impl Fn(usize) -> Vec<f32>) {
    for r in [0, rows - 1] {
        let single = alone(r);
        assert!(
            single
                .iter()
                .zip(&batched[r * width..(r + 1) * width])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{label}: row {r} differs between a batch of {rows} and alone"
        );
    }
}

#[test]
fn linear_bf16_matches_reference() {
    linear_case(WeightFormat::Bf16, 1, 37, 64, true, true, false);
    linear_case(WeightFormat::Bf16, 11, 23, 248, false, false, false);
    linear_case(WeightFormat::Bf16, 8, 5, 8, true, false, false);
    linear_case(WeightFormat::Bf16, 9, 21, 72, false, true, true);
    linear_case(WeightFormat::Bf16, 2, 13, 96, true, true, true);
    linear_case(WeightFormat::Bf16, 19, 9, 40, true, true, true);
}

/// BF16 linears at input widths `Kernel::Linear` cannot read (the voice tower's, from a
/// checkpoint: 20 or 100 mels) run through `linear_launches` on `Kernel::LinearRagged`: the
/// FP64 reference's bound with bias, rounding and a residual, the weight in two segments
/// (the second starting mid-word when the width is odd), and every row alone gives the
/// batch's bits.
#[test]
fn linear_bf16_at_any_width_matches_reference() {
    let gpu = gpu();
    for (rows, out, in_, with_bias, round, with_residual) in [
        (1, 37, 20, true, true, false),
        (7, 19, 100, true, false, true),
        (3, 5, 1, false, true, false),
        (70, 9, 77, true, true, true),
        (2, 130, 3, false, false, false),
    ] {
        let label =
            format!("ragged rows {rows} out {out} in {in_} bias {with_bias} round {round} residual {with_residual}");
        let mut rng = rng(&label);
        let w = random_weights(&mut rng, WeightFormat::Bf16, out, in_);
        let x = bf16_values(&mut rng, rows * in_, 2.0);
        let bias = with_bias.then(|| bf16_values(&mut rng, out, 0.5));
        let residual = with_residual.then(|| uniform(&mut rng, rows * out, 3.0));
        let split = out.div_ceil(2);
        let segment = |range: std::ops::Range<usize>| drama_engine::weights::Segment {
            codes: gpu.buffer_with("w", &w.packed[range.start * in_ * 2..range.end * in_ * 2]),
            scales: gpu.buffer_with("scales", &[0; 4]),
            expert_scales: None,
            range,
        };
        let linear = GpuLinear {
            format: WeightFormat::Bf16,
            out,
            in_features: in_,
            segments: vec![segment(0..split), segment(split..out)],
            bias: bias.as_ref().map(|b| gpu.buffer_with("bias", &pack_bf16(b))),
            tensor_scale: 1.0,
        };
        let placeholder = gpu.buffer_with("placeholder", &[0; 4]);
        let compute = |rows: usize, x: &[f32], residual: Option<&[f32]>| {
            let xb = gpu.buffer_with("x", &f32_bytes(x));
            let rb = residual.map(|r| gpu.buffer_with("residual", &f32_bytes(r)));
            let y = poisoned(gpu, "y", rows * out);
            let mut io = LinearIo::plain(&xb, &y, rows, out, round);
            io.residual = rb.as_ref();
            let launches = linear_launches(gpu, &linear, &placeholder, &io).unwrap();
            run(gpu, &launches);
            gpu.read_f32(&y).unwrap()
        };
        let got = compute(rows, &x, residual.as_deref());
        let (mut want, mut scale) = (Vec::new(), Vec::new());
        for r in 0..rows {
            for n in 0..out {
                let terms = (0..in_).map(|k| w.decoded[n * in_ + k] * f64::from(x[r * in_ + k]));
                let (mut exact, mut magnitude) = terms.fold((0.0, 0.0), |(s, m), t| (s + t, m + t.abs()));
                if let Some(b) = &bias {
                    exact += f64::from(b[n]);
                    magnitude += f64::from(b[n]).abs();
                }
                let mut value = if round {
                    f64::from(drama_checkpoint::numerics::round_to_bf16(exact as f32))
                } else {
                    exact
                };
                let added = residual.as_ref().map_or(0.0, |res| f64::from(res[r * out + n]));
                value += added;
                want.push(value);
                scale.push(magnitude + added.abs() + if round { bf16_ulp(exact) / TOL } else { 0.0 });
            }
        }
        check(&label, &got, &want, &scale, TOL);
        assert_rows_alone_match(&label, &got, rows, out, |r| {
            let residual_row = residual.as_ref().map(|res| &res[r * out..(r + 1) * out]);
            compute(1, &x[r * in_..(r + 1) * in_], residual_row)
        });
    }
}

#[test]
fn linear_nvfp4_matches_reference() {
    linear_case(WeightFormat::Nvfp4, 1, 33, 48, false, true, false);
    linear_case(WeightFormat::Nvfp4, 3, 19, 1040, true, true, true);
    linear_case(WeightFormat::Nvfp4, 11, 7, 16, false, false, false);
    linear_case(WeightFormat::Nvfp4, 2, 21, 64, false, true, false);
}

#[test]
fn linear_fp8_matches_reference() {
    linear_case(WeightFormat::Fp8Block, 2, 131, 144, false, true, true);
    linear_case(WeightFormat::Fp8Block, 9, 3, 272, true, false, false);
}

/// Routed experts: `experts` matrices split over two weight segments, random expert per
/// slot, shared input per token (x_row_div = k) or one input per slot (x_row_div = 1).
fn gathered_case(
    format: WeightFormat,
    experts: usize,
    out: usize,
    in_: usize,
    tokens: usize,
    k: usize,
    shared_input: bool,
) {
    let label = format!(
        "gathered {format:?} experts {experts} out {out} in {in_} tokens {tokens} k {k} shared_input {shared_input}"
    );
    let mut rng = rng(&label);
    let gpu = gpu();
    let all: Vec<Weights> = (0..experts)
        .map(|_| random_weights(&mut rng, format, out, in_))
        .collect();
    let slots = tokens * k;
    let ids: Vec<u32> = (0..slots).map(|_| rng.next_u32() % experts as u32).collect();
    let x_rows = if shared_input { tokens } else { slots };
    let x = bf16_values(&mut rng, x_rows * in_, 2.0);
    let split = experts / 2;
    // Each expert keeps its own tensor scale.
    let expert_scales: Vec<f32> = all.iter().map(|w| w.tensor_scale).collect();
    // The launches over `ids` (slots) reading `x` (the slots' or the tokens' rows): a
    // workgroup row per slot, or with `grouped` per block of slots that share an expert,
    // grouped on the GPU first (their outputs poisoned too). `flags` 2 rounds the outputs to
    // BF16 as the model does; 0 leaves the f32 sums, whose every bit the paths must agree on.
    let launch = |ids: &[u32], x: &[f32], grouped: bool, width: LinearWidth, flags: u32| -> Vec<f32> {
        let slots = ids.len();
        let xb = gpu.buffer_with("x", &f32_bytes(x));
        let idb = gpu.buffer_with("ids", &u32_bytes(ids));
        let bias = gpu.buffer_with("bias", &[0; 4]);
        let y = poisoned(gpu, "y", slots * out);
        let (grouping, mut dispatches) = Grouping::on_gpu(gpu, &idb, slots, experts, &xb, x.len(), grouped);
        let (blocks, blocks_b, order_b, input) =
            (grouping.count, &grouping.blocks, &grouping.order, grouping.input(&xb));
        let mut keep = Vec::new();
        for (begin, end) in [(0, split), (split, experts)] {
            let segment = &all[begin..end];
            let packed: Vec<u8> = segment.iter().flat_map(|w| w.packed.clone()).collect();
            let scales: Vec<u8> = segment.iter().flat_map(|w| w.scales.clone()).collect();
            let params = LinearParams {
                rows: slots as u32,
                in_features: in_ as u32,
                out_features: out as u32,
                out_offset: 0,
                y_stride: out as u32,
                x_row_div: if shared_input { k as u32 } else { 1 },
                expert_begin: begin as u32,
                expert_end: end as u32,
                flags,
                tensor_scale: 1.0,
                bias_offset: 0,
                ..Default::default()
            };
            let p = gpu.uniform("params", &params);
            let wb = gpu.buffer_with("w", &packed);
            let sb = gpu.buffer_with("scales", &scales);
            let tb = gpu.buffer_with("expert_scales", &f32_bytes(&expert_scales[begin..end]));
            let mut buffers: Vec<&wgpu::Buffer> = vec![&p, input, &wb];
            if format != WeightFormat::Bf16 {
                buffers.push(&sb);
            }
            let (kernel, grid_rows) = if grouped {
                buffers.extend([&bias, blocks_b, &y, &tb, order_b, input]);
                (Kernel::GatheredGrouped(format, width), blocks)
            } else {
                buffers.extend([&bias, &idb, &y, &tb, input]);
                (Kernel::Gathered(format, width), slots)
            };
            let grid = [
                (out as u32).div_ceil(format.gathered_rows_per_workgroup(width)),
                grid_rows as u32,
                1,
            ];
            dispatches.push(dispatch(gpu, kernel, &buffers, grid));
            keep.push((p, wb, sb, tb));
        }
        run(gpu, &dispatches);
        gpu.read_f32(&y).unwrap()
    };
    let standard = LinearWidth::Standard;
    let got = launch(&ids, &x, false, standard, 2);
    let sums = launch(&ids, &x, false, standard, 0);
    // Grouped by expert (EXPERT_GROUP_SLOTS slots per block at most), and in workgroups of
    // every width, every slot gets the same bits, rounded or not.
    for width in LinearWidth::ALL {
        for grouped in [false, true] {
            assert_eq!(
                bits(&launch(&ids, &x, grouped, width, 0)),
                bits(&sums),
                "{label}: grouped {grouped}, {width:?} workgroups, f32 sums"
            );
            assert_eq!(
                bits(&launch(&ids, &x, grouped, width, 2)),
                bits(&got),
                "{label}: grouped {grouped}, {width:?} workgroups"
            );
        }
    }
    // An id no segment holds leaves its slot unwritten on both paths, and no other.
    let mut stray = ids.clone();
    let last = ids.len() - 1;
    stray[last] = experts as u32;
    let (each, grouped) = (
        launch(&stray, &x, false, standard, 0),
        launch(&stray, &x, true, standard, 0),
    );
    assert!(
        each[last * out..].iter().all(|v| v.is_nan()),
        "{label}: a stray id's slot was written"
    );
    assert_eq!(bits(&grouped), bits(&each), "{label}: grouped, with a stray id");
    // Each token's slots alone (their experts now shared with no other token's slot) give
    // the bits they have among all the slots.
    for token in [0, tokens - 1] {
        let (first, last) = (token * k, (token + 1) * k);
        let token_x = if shared_input {
            &x[token * in_..(token + 1) * in_]
        } else {
            &x[first * in_..last * in_]
        };
        let alone = launch(&ids[first..last], token_x, false, standard, 0);
        assert_eq!(
            bits(&alone),
            bits(&sums[first * out..last * out]),
            "{label}: token {token} alone"
        );
    }
    let mut want = Vec::new();
    let mut scale = Vec::new();
    for s in 0..slots {
        let w = &all[ids[s] as usize];
        let row = if shared_input { s / k } else { s };
        for n in 0..out {
            let terms: Vec<f64> = (0..in_)
                .map(|c| w.decoded[n * in_ + c] * f64::from(x[row * in_ + c]))
                .collect();
            let exact: f64 = terms.iter().sum();
            want.push(f64::from(drama_checkpoint::numerics::round_to_bf16(exact as f32)));
            scale.push(terms.iter().map(|t| t.abs()).sum::<f64>() + bf16_ulp(exact) / TOL);
        }
    }
    check(&label, &got, &want, &scale, TOL);
}

#[test]
fn gathered_experts_match_reference_across_segments() {
    gathered_case(WeightFormat::Nvfp4, 5, 24, 64, 3, 4, true);
    gathered_case(WeightFormat::Nvfp4, 4, 40, 32, 2, 3, false);
    gathered_case(WeightFormat::Fp8Block, 3, 17, 48, 2, 2, true);
    gathered_case(WeightFormat::Bf16, 3, 9, 24, 3, 2, false);
    // Many slots over few experts (280 over 6): many blocks of EXPERT_GROUP_SLOTS per
    // expert, and a remainder.
    gathered_case(WeightFormat::Nvfp4, 6, 20, 32, 70, 4, true);
    // Wide inputs: each thread takes a second unit per batch (and the last batch's second
    // load is clamped).
    gathered_case(WeightFormat::Nvfp4, 5, 24, 1040, 5, 4, true);
    gathered_case(WeightFormat::Bf16, 3, 12, 520, 4, 3, false);
    // NVFP4 rows of an odd number of units (not read in pairs), and an odd number in all:
    // the last unit is the first half of a pair the buffer holds only in part.
    gathered_case(WeightFormat::Nvfp4, 3, 9, 48, 8, 2, false);
}

/// The BF16 outputs a correct SwiGLU epilogue may write for one feature, as `[lo, hi]`.
/// The kernel's f32 gate and up are each within `TOL` of their terms' magnitude of the
/// exact sums (the assumption of the plain linear checks, which covers cancellation), then
/// rounded to BF16: rounding is monotone, so each lies between the roundings of its
/// interval's ends. silu falls to a single minimum and rises, and the product is linear in
/// up, so silu(gate) * up takes its extremes at the box's corners (and at silu's minimum
/// when the gate's interval holds it). The f32 evaluation adds exp's error (WGSL allows
/// 3 + 2|gate| ulps, an ulp up to 2^-23 of the value: (6 + 4|gate|) 2^-24, doubled for fast
/// math, weighing in silu by 1 / (1 + e^gate)) and a few roundings;
/// the output is rounded by a monotone rounding again, and below 1e-30 it may flush to zero.
fn swiglu_range(gate: (f64, f64), up: (f64, f64)) -> (f64, f64) {
    let round = |v: f64| f64::from(drama_checkpoint::numerics::round_to_bf16(v as f32));
    let interval = |(exact, magnitude): (f64, f64)| (round(exact - TOL * magnitude), round(exact + TOL * magnitude));
    let ((g_lo, g_hi), (u_lo, u_hi)) = (interval(gate), interval(up));
    let silu = |v: f64| v / (1.0 + (-v).exp());
    const SILU_MIN_AT: f64 = -1.278_464_542_761_074;
    let mut silus = vec![silu(g_lo), silu(g_hi)];
    if g_lo < SILU_MIN_AT && SILU_MIN_AT < g_hi {
        silus.push(silu(SILU_MIN_AT));
    }
    let corners: Vec<f64> = silus.iter().flat_map(|&s| [s * u_lo, s * u_hi]).collect();
    let lo = corners.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = corners.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let evaluation = (8.0 + (12.0 + 8.0 * g_lo.abs()) / (1.0 + g_lo.exp())) * 2f64.powi(-24);
    (
        round(lo - lo.abs() * evaluation - 1e-30),
        round(hi + hi.abs() * evaluation + 1e-30),
    )
}

/// Asserts every output lies in its range of [`swiglu_range`] (NaN poison fails).
fn check_swiglu(label: &str, got: &[f32], ranges: &[(f64, f64)]) {
    assert_eq!(got.len(), ranges.len(), "{label}: length");
    for (i, (&g, &(lo, hi))) in got.iter().zip(ranges).enumerate() {
        let g64 = f64::from(g);
        assert!(
            lo <= g64 && g64 <= hi,
            "{label}: element {i}: got {g}, not in [{lo}, {hi}]"
        );
    }
}

/// The exact dot product of weight row `n` with `x`, and the sum of its terms' magnitudes.
fn dot_and_magnitude(w: &Weights, n: usize, x: &[f32]) -> (f64, f64) {
    (0..w.cols).fold((0.0, 0.0), |(sum, magnitude), c| {
        let term = w.decoded[n * w.cols + c] * f64::from(x[c]);
        (sum + term, magnitude + term.abs())
    })
}

/// The dense kernel's SwiGLU epilogue: BF16 [gate | up] stacked per segment (two segments),
/// several activation rows, against the reference; each row alone gives the same bits.
#[test]
fn linear_swiglu_epilogue_matches_reference() {
    let (features, cols, rows) = (37, 72, 5);
    let mut rng = rng("linear swiglu");
    let gate = random_weights(&mut rng, WeightFormat::Bf16, features, cols);
    let up = random_weights(&mut rng, WeightFormat::Bf16, features, cols);
    let x = bf16_values(&mut rng, rows * cols, 2.0);
    let gpu = gpu();
    let run = |x: &[f32], rows: usize| -> Vec<f32> {
        let xb = gpu.buffer_with("x", &f32_bytes(x));
        let placeholder = gpu.buffer_with("placeholder", &[0; 4]);
        let y = poisoned(gpu, "y", rows * features);
        let split = features / 2;
        let bf16_width = Kernel::Linear(WeightFormat::Bf16, LinearInput::F32)
            .linear_width()
            .unwrap();
        let mut dispatches = Vec::new();
        let mut keep = Vec::new();
        for (start, end) in [(0, split), (split, features)] {
            // A segment holds gate rows start..end, then up rows start..end.
            let row_bytes = cols * 2;
            let mut codes = gate.packed[start * row_bytes..end * row_bytes].to_vec();
            codes.extend_from_slice(&up.packed[start * row_bytes..end * row_bytes]);
            let params = LinearParams {
                rows: rows as u32,
                in_features: cols as u32,
                out_features: (2 * (end - start)) as u32,
                out_offset: start as u32,
                y_stride: features as u32,
                x_row_div: 1,
                flags: flags::linear::ROUND | flags::linear::SWIGLU,
                tensor_scale: 1.0,
                ..Default::default()
            };
            let p = gpu.uniform("params", &params);
            let wb = gpu.buffer_with("w", &codes);
            let grid = [
                ((end - start) as u32).div_ceil(WeightFormat::Bf16.rows_per_workgroup(bf16_width) / 2),
                1,
                1,
            ];
            dispatches.push(dispatch(
                gpu,
                Kernel::Linear(WeightFormat::Bf16, LinearInput::F32),
                &[
                    &p,
                    &xb,
                    &wb,
                    &placeholder,
                    &y,
                    &placeholder,
                    &xb,
                    &placeholder,
                    &placeholder,
                    &placeholder,
                    &y,
                    &y,
                    &wb,
                    &y,
                ],
                grid,
            ));
            keep.push((p, wb));
        }
        run(gpu, &dispatches);
        gpu.read_f32(&y).unwrap()
    };
    let got = run(&x, rows);
    let mut ranges = Vec::new();
    for r in 0..rows {
        let xr = &x[r * cols..(r + 1) * cols];
        for n in 0..features {
            ranges.push(swiglu_range(
                dot_and_magnitude(&gate, n, xr),
                dot_and_magnitude(&up, n, xr),
            ));
        }
    }
    check_swiglu("linear swiglu", &got, &ranges);
    assert_rows_alone_match("linear swiglu", &got, rows, features, |r| {
        run(&x[r * cols..(r + 1) * cols], 1)
    });
}

#[test]
fn gathered_swiglu_epilogue_matches_reference() {
    // Twenty tokens of four slots over five experts: blocks of up to EXPERT_GROUP_SLOTS slots
    // when grouped, and remainders.
    let (experts, width, cols, tokens, k) = (5, 24, 64, 20, 4);
    let mut rng = rng("gathered swiglu");
    let pairs: Vec<(Weights, Weights)> = (0..experts)
        .map(|_| {
            let gate = random_weights(&mut rng, WeightFormat::Nvfp4, width, cols);
            let up = random_weights(&mut rng, WeightFormat::Nvfp4, width, cols);
            (gate, up)
        })
        .collect();
    let slots = tokens * k;
    let ids: Vec<u32> = (0..slots).map(|_| rng.next_u32() % experts as u32).collect();
    let x = bf16_values(&mut rng, tokens * cols, 2.0);
    let gpu = gpu();
    let (xb, idb) = (
        gpu.buffer_with("x", &f32_bytes(&x)),
        gpu.buffer_with("ids", &u32_bytes(&ids)),
    );
    let bias = gpu.buffer_with("bias", &[0; 4]);
    // Per slot, or grouped by expert (reading x packed as BF16 pairs), in workgroups of
    // `width`; `flags` 2 rounds gate, up and the output to BF16, 0 leaves f32.
    let launch = |grouped: bool, workgroup: LinearWidth, flags: u32| -> Vec<f32> {
        let y = poisoned(gpu, "y", slots * width);
        let (grouping, mut dispatches) = Grouping::on_gpu(gpu, &idb, slots, experts, &xb, x.len(), grouped);
        let (blocks, blocks_b, order_b, input) =
            (grouping.count, &grouping.blocks, &grouping.order, grouping.input(&xb));
        let rows_per_group = WeightFormat::Nvfp4.gathered_rows_per_workgroup(workgroup) / 2;
        let grid = [
            (width as u32).div_ceil(rows_per_group),
            if grouped { blocks } else { slots } as u32,
            1,
        ];
        // Two weight segments (as past the binding limit): experts 0..2 and 2..5.
        let mut keep = Vec::new();
        for (begin, end) in [(0, 2), (2, experts)] {
            let segment = &pairs[begin..end];
            let codes: Vec<u8> = segment
                .iter()
                .flat_map(|(g, u)| [g.packed.clone(), u.packed.clone()].concat())
                .collect();
            let scales: Vec<u8> = segment
                .iter()
                .flat_map(|(g, u)| [g.scales.clone(), u.scales.clone()].concat())
                .collect();
            let tensor_scales: Vec<f32> = segment
                .iter()
                .flat_map(|(g, u)| [g.tensor_scale, u.tensor_scale])
                .collect();
            let params = LinearParams {
                rows: slots as u32,
                in_features: cols as u32,
                out_features: (2 * width) as u32,
                y_stride: width as u32,
                x_row_div: k as u32,
                expert_begin: begin as u32,
                expert_end: end as u32,
                flags: flags | 8,
                tensor_scale: 1.0,
                ..Default::default()
            };
            let p = gpu.uniform("params", &params);
            let wb = gpu.buffer_with("w", &codes);
            let sb = gpu.buffer_with("scales", &scales);
            let tb = gpu.buffer_with("expert_scales", &f32_bytes(&tensor_scales));
            let (kernel, buffers) = if grouped {
                let kernel = Kernel::GatheredGrouped(WeightFormat::Nvfp4, workgroup);
                (
                    kernel,
                    vec![&p, input, &wb, &sb, &bias, &blocks_b, &y, &tb, &order_b, input],
                )
            } else {
                let kernel = Kernel::Gathered(WeightFormat::Nvfp4, workgroup);
                (kernel, vec![&p, input, &wb, &sb, &bias, &idb, &y, &tb, input])
            };
            dispatches.push(dispatch(gpu, kernel, &buffers, grid));
            keep.push((p, wb, sb, tb));
        }
        run(gpu, &dispatches);
        gpu.read_f32(&y).unwrap()
    };
    let got = launch(false, LinearWidth::Narrow, 2);
    let sums = launch(false, LinearWidth::Narrow, 0);
    // Grouped and at every width, every slot's SwiGLU gets the same bits, rounded or not.
    for workgroup in LinearWidth::ALL {
        for grouped in [false, true] {
            let case = format!("gathered swiglu: grouped {grouped}, {workgroup:?} workgroups");
            assert_eq!(bits(&launch(grouped, workgroup, 0)), bits(&sums), "{case}, f32");
            assert_eq!(bits(&launch(grouped, workgroup, 2)), bits(&got), "{case}");
        }
    }
    let mut ranges = Vec::new();
    for (s, &id) in ids.iter().enumerate() {
        let (gate, up) = &pairs[id as usize];
        let xr = &x[(s / k) * cols..(s / k + 1) * cols];
        for n in 0..width {
            ranges.push(swiglu_range(
                dot_and_magnitude(gate, n, xr),
                dot_and_magnitude(up, n, xr),
            ));
        }
    }
    check_swiglu("gathered swiglu", &got, &ranges);
}

/// The dense kernel's KV-cache write (`linear_kv`), as the engine lowers an attention layer's
/// [q | k | v] projection whose members do not stack: one launch per member at its output
/// column. Outputs against the reference (bias and BF16 rounding included); the keys in the
/// cache against the FP64 rotation of the kernel's own key outputs at each row's position,
/// the values equal to its value outputs bit for bit, both at the row's lane and position;
/// every other cache slot, and the padding of a head not a whole number of vec4s, keeps its
/// poison; each row alone gives the same bits.
#[test]
fn linear_cache_write_matches_reference() {
    linear_cache_write_case(16);
    linear_cache_write_case(6);
}

fn linear_cache_write_case(head_dim: usize) {
    let (heads, kv_heads, cols, lanes, capacity) = (3usize, 2usize, 64usize, 2usize, 9usize);
    let (q_width, kv_width) = (heads * head_dim, kv_heads * head_dim);
    let stride = drama_kernels::head_stride(head_dim);
    let cache_width = kv_heads * stride;
    let out = q_width + 2 * kv_width;
    let theta = 10000.0;
    let row_lane = [1u32, 0, 1];
    let row_pos = [7u32, 0, 2];
    let rows = row_lane.len();
    let table = drama_engine::rope::rope_table(capacity, head_dim, theta);
    for format in [WeightFormat::Bf16, WeightFormat::Nvfp4] {
        let label = format!("linear cache write {format:?} head_dim {head_dim}");
        let mut rng = rng(&label);
        let gpu = gpu();
        let members: Vec<Weights> = [q_width, kv_width, kv_width]
            .iter()
            .map(|&width| random_weights(&mut rng, format, width, cols))
            .collect();
        let bias = bf16_values(&mut rng, out, 1.0);
        let x = bf16_values(&mut rng, rows * cols, 2.0);
        // Runs `count` rows starting at row `first`; returns y and both caches.
        let run = |first: usize, count: usize| -> (Vec<f32>, Vec<f32>, Vec<f32>) {
            let xb = gpu.buffer_with("x", &f32_bytes(&x[first * cols..(first + count) * cols]));
            let lane_b = gpu.buffer_with("lane", &u32_bytes(&row_lane[first..first + count]));
            let pos_b = gpu.buffer_with("pos", &u32_bytes(&row_pos[first..first + count]));
            let table_b = gpu.buffer_with("rope", bytemuck::cast_slice(&table));
            let kc = poisoned(gpu, "k_cache", lanes * capacity * cache_width);
            let vc = poisoned(gpu, "v_cache", lanes * capacity * cache_width);
            let y = poisoned(gpu, "y", count * out);
            let placeholder = gpu.buffer_with("placeholder", &[0; 4]);
            let mut dispatches = Vec::new();
            let mut column = 0;
            for w in &members {
                let params = LinearParams {
                    rows: count as u32,
                    in_features: cols as u32,
                    out_features: w.rows as u32,
                    out_offset: column as u32,
                    y_stride: out as u32,
                    x_row_div: 1,
                    flags: flags::linear::BIAS | flags::linear::ROUND,
                    tensor_scale: w.tensor_scale,
                    bias_offset: column as u32,
                    head_dim: head_dim as u32,
                    q_width: q_width as u32,
                    capacity: capacity as u32,
                    ..Default::default()
                };
                let p = gpu.uniform("params", &params);
                let wb = gpu.buffer_with("w", &w.packed);
                let sb = gpu.buffer_with("scales", &w.scales);
                let bb = gpu.buffer_with("bias", &pack_bf16(&bias));
                let mut buffers: Vec<&wgpu::Buffer> = vec![&p, &xb, &wb];
                if format != WeightFormat::Bf16 {
                    buffers.push(&sb);
                }
                buffers.extend([&bb, &y, &placeholder, &xb, &lane_b, &pos_b, &table_b, &kc, &vc, &wb, &y]);
                let kernel = Kernel::LinearKv(format, LinearInput::F32);
                let grid = [
                    (w.rows as u32).div_ceil(format.rows_per_workgroup(kernel.linear_width().unwrap())),
                    1,
                    1,
                ];
                dispatches.push(dispatch(gpu, kernel, &buffers, grid));
                column += w.rows;
            }
            run(gpu, &dispatches);
            (
                gpu.read_f32(&y).unwrap(),
                gpu.read_f32(&kc).unwrap(),
                gpu.read_f32(&vc).unwrap(),
            )
        };
        let (y, k_cache, v_cache) = run(0, rows);
        let mut want = Vec::new();
        let mut scale = Vec::new();
        for r in 0..rows {
            let xr = &x[r * cols..(r + 1) * cols];
            let mut column = 0;
            for w in &members {
                for n in 0..w.rows {
                    let (sum, magnitude) = dot_and_magnitude(w, n, xr);
                    let exact = sum + f64::from(bias[column + n]);
                    let magnitude = magnitude + f64::from(bias[column + n]).abs();
                    want.push(f64::from(drama_checkpoint::numerics::round_to_bf16(exact as f32)));
                    scale.push(magnitude + bf16_ulp(exact) / TOL);
                }
                column += w.rows;
            }
        }
        check(&label, &y, &want, &scale, TOL);
        let mut written = vec![false; lanes * capacity];
        for r in 0..rows {
            let slot = row_lane[r] as usize * capacity + row_pos[r] as usize;
            written[slot] = true;
            let keys = &y[r * out + q_width..r * out + q_width + kv_width];
            let values = &y[r * out + q_width + kv_width..(r + 1) * out];
            for g in 0..kv_heads {
                let base = slot * cache_width + g * stride;
                assert_eq!(
                    bits(&v_cache[base..base + head_dim]),
                    bits(&values[g * head_dim..(g + 1) * head_dim]),
                    "{label}: row {r}'s values of head {g} in the cache"
                );
                let head: Vec<f64> = keys[g * head_dim..(g + 1) * head_dim]
                    .iter()
                    .map(|&v| f64::from(v))
                    .collect();
                let rotated = drama_reference::ops::rope(&head, row_pos[r] as usize, theta);
                let got = &k_cache[base..base + head_dim];
                // Two f32 products and a sum, with cos/sin rounded to f32 once: a few f32
                // steps of |a| + |b| (the pair's magnitudes).
                let half = head_dim / 2;
                let bounds: Vec<f64> = (0..head_dim)
                    .map(|i| head[i % half].abs() + head[i % half + half].abs())
                    .collect();
                check(&format!("{label} keys row {r} head {g}"), got, &rotated, &bounds, 4e-7);
                let padding = base + head_dim..base + stride;
                assert!(
                    k_cache[padding.clone()]
                        .iter()
                        .chain(&v_cache[padding])
                        .all(|v| v.is_nan()),
                    "{label}: row {r}'s padding of head {g} was written"
                );
            }
        }
        for (slot, &was_written) in written.iter().enumerate() {
            if !was_written {
                let untouched = |cache: &[f32]| {
                    cache[slot * cache_width..(slot + 1) * cache_width]
                        .iter()
                        .all(|v| v.is_nan())
                };
                assert!(
                    untouched(&k_cache) && untouched(&v_cache),
                    "{label}: slot {slot} was written"
                );
            }
        }
        assert_rows_alone_match(&label, &y, rows, out, |r| run(r, 1).0);
    }
}

/// A BF16 linear of one segment holding `codes` (`out` features), as the engine uploads it.
fn one_segment_linear(gpu: &drama_engine::gpu::Gpu, codes: &[u8], out: usize, in_features: usize) -> GpuLinear {
    GpuLinear::one_segment(gpu, WeightFormat::Bf16, (out, in_features), codes, &[0; 4])
}

/// The linear pair (one launch computing two linears over the same rows: a MoE layer's
/// router logits, plain and unrounded, and its shared expert's BF16 SwiGLU stack) writes
/// exactly the bits the two linears' own launches write, within the FP64 reference's bound,
/// for one, two and five rows (one pass, and three on three workgroup rows) and sizes drawn
/// fresh (odd widths: partial workgroups on both sides of the split); a pair with a
/// quantized half is refused by name.
#[test]
fn linear_pair_gives_each_linears_own_bits() {
    let gpu = gpu();
    let placeholder = gpu.buffer_with("placeholder", &[0; 4]);
    for rows in [1, 2, 5] {
        let mut rng = rng(&format!("linear pair rows {rows}"));
        let plain_out = 1 + (rng.next_u32() % 40) as usize;
        let features = 1 + (rng.next_u32() % 40) as usize;
        let cols = 8 * (1 + (rng.next_u32() % 12) as usize);
        let label = format!("linear pair rows {rows} plain {plain_out} swiglu {features} in {cols}");
        let plain = random_weights(&mut rng, WeightFormat::Bf16, plain_out, cols);
        let gate = random_weights(&mut rng, WeightFormat::Bf16, features, cols);
        let up = random_weights(&mut rng, WeightFormat::Bf16, features, cols);
        let x = bf16_values(&mut rng, rows * cols, 2.0);
        let xb = gpu.buffer_with("x", &f32_bytes(&x));
        let first = one_segment_linear(gpu, &plain.packed, plain_out, cols);
        let stack = [gate.packed.as_slice(), up.packed.as_slice()].concat();
        let second = one_segment_linear(gpu, &stack, features, cols);
        let io = |y, width, swiglu| LinearIo {
            swiglu,
            ..LinearIo::plain(&xb, y, rows, width, swiglu)
        };
        let (pair_a, pair_b) = (
            poisoned(gpu, "pair a", rows * plain_out),
            poisoned(gpu, "pair b", rows * features),
        );
        let ios = [&io(&pair_a, plain_out, false), &io(&pair_b, features, true)];
        run(
            gpu,
            &[linear_pair_launch(gpu, [&first, &second], &placeholder, ios).unwrap()],
        );
        let (apart_a, apart_b) = (
            poisoned(gpu, "apart a", rows * plain_out),
            poisoned(gpu, "apart b", rows * features),
        );
        let mut apart = linear_launches(gpu, &first, &placeholder, &io(&apart_a, plain_out, false)).unwrap();
        apart.extend(linear_launches(gpu, &second, &placeholder, &io(&apart_b, features, true)).unwrap());
        run(gpu, &apart);
        let (got_a, got_b) = (gpu.read_f32(&pair_a).unwrap(), gpu.read_f32(&pair_b).unwrap());
        assert_eq!(
            bits(&got_a),
            bits(&gpu.read_f32(&apart_a).unwrap()),
            "{label}: first linear"
        );
        assert_eq!(
            bits(&got_b),
            bits(&gpu.read_f32(&apart_b).unwrap()),
            "{label}: second linear"
        );
        let (mut want_a, mut scale_a, mut ranges_b) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..rows {
            let xr = &x[r * cols..(r + 1) * cols];
            for n in 0..plain_out {
                let (exact, magnitude) = dot_and_magnitude(&plain, n, xr);
                want_a.push(exact);
                scale_a.push(magnitude);
            }
            for n in 0..features {
                ranges_b.push(swiglu_range(
                    dot_and_magnitude(&gate, n, xr),
                    dot_and_magnitude(&up, n, xr),
                ));
            }
        }
        check(&format!("{label}: first"), &got_a, &want_a, &scale_a, TOL);
        check_swiglu(&format!("{label}: second"), &got_b, &ranges_b);
    }
    let mut rng = rng("linear pair refusal");
    let quantized = random_weights(&mut rng, WeightFormat::Nvfp4, 4, 32);
    let nvfp4 = GpuLinear::one_segment(gpu, WeightFormat::Nvfp4, (4, 32), &quantized.packed, &quantized.scales);
    let bf16 = one_segment_linear(gpu, &pack_bf16(&bf16_values(&mut rng, 4 * 32, 1.0)), 4, 32);
    let (xb, y) = (gpu.buffer_with("x", &f32_bytes(&[1.0; 32])), poisoned(gpu, "y", 4));
    let io = LinearIo::plain(&xb, &y, 1, 4, false);
    let Err(error) = linear_pair_launch(gpu, [&bf16, &nvfp4], &placeholder, [&io, &io]) else {
        panic!("a pair with an NVFP4 half was launched");
    };
    assert!(
        error
            .to_string()
            .contains("a linear pair needs two bias-free BF16 weights"),
        "{error}"
    );
}

/// Routing with a linear beside it in one launch (a MoE layer's routing and its shared
/// expert's down projection), and routing that lists the linear's input followed in the same
/// pass by the linear's own launch (as the projection runs beside the launch before it, with
/// no barrier of its own), write exactly the bits that routing alone and the linear's own
/// launch write in submissions of their own, for one, two, eight and 37 rows (routing's
/// workgroups on one grid row, and spread over several) and sizes drawn fresh, the linear
/// within the FP64 reference's bound; a quantized linear beside routing is refused by name.
/// (Routing's own choices and weights are checked against the FP64 reference in
/// op_misc.rs.)
#[test]
fn route_beside_a_linear_gives_each_its_own_bits() {
    let gpu = gpu();
    let placeholder = gpu.buffer_with("placeholder", &[0; 16]);
    // Kept counts below 64, past 128 and past 256: the 64 invocations routing has beside
    // the linear sum the softmax denominator exactly as routing alone does with 256.
    for (rows, kept) in [(1, 37), (2, 200), (8, 300), (37, 509)] {
        let mut rng = rng(&format!("route beside a linear rows {rows}"));
        let out = 1 + (rng.next_u32() % 40) as usize;
        let cols = 8 * (1 + (rng.next_u32() % 12) as usize);
        let k = 1 + (rng.next_u32() % 4) as usize;
        let label = format!("route beside a linear rows {rows} out {out} in {cols} kept {kept} k {k}");
        let w = random_weights(&mut rng, WeightFormat::Bf16, out, cols);
        let x = bf16_values(&mut rng, rows * cols, 2.0);
        let logits = uniform(&mut rng, rows * kept, 3.0);
        let params = RouterParams {
            rows: rows as u32,
            logit_width: kept as u32,
            kept: kept as u32,
            k: k as u32,
            flags: flags::router::RENORMALIZE,
            n_group: 1,
            topk_group: 1,
            group_size: kept as u32,
            scaling: 1.5,
            pad: [0; 3],
        };
        let linear = one_segment_linear(gpu, &w.packed, out, cols);
        let xb = gpu.buffer_with("x", &f32_bytes(&x));
        let lb = gpu.buffer_with("logits", &f32_bytes(&logits));
        let kept_ids: Vec<u32> = (0..kept as u32).collect();
        let kb = gpu.buffer_with("kept", &u32_bytes(&kept_ids));
        let outputs = |name: &str| {
            (
                poisoned(gpu, &format!("{name} ids"), rows * k),
                poisoned(gpu, &format!("{name} weights"), rows * k),
                poisoned(gpu, &format!("{name} y"), rows * out),
            )
        };
        let (together, listed, apart) = (outputs("together"), outputs("listed"), outputs("apart"));
        let io = |y| LinearIo::plain(&xb, y, rows, out, true);
        let routing_together = [&lb, &kb, &placeholder, &together.0, &together.1, &xb];
        let one = route_launch(
            gpu,
            &params,
            routing_together,
            Some((&linear, &io(&together.2))),
            &placeholder,
        );
        run(gpu, &[one.unwrap()]);
        let routing_listed = [&lb, &kb, &placeholder, &listed.0, &listed.1, &xb];
        let mut launches = vec![route_launch(gpu, &params, routing_listed, None, &placeholder).unwrap()];
        launches.extend(linear_launches(gpu, &linear, &placeholder, &io(&listed.2)).unwrap());
        run(gpu, &launches);
        let routing_apart = [&lb, &kb, &placeholder, &apart.0, &apart.1, &placeholder];
        run(
            gpu,
            &[route_launch(gpu, &params, routing_apart, None, &placeholder).unwrap()],
        );
        run(
            gpu,
            &linear_launches(gpu, &linear, &placeholder, &io(&apart.2)).unwrap(),
        );
        let want_ids = gpu.read_u32(&apart.0).unwrap();
        let want_weights = bits(&gpu.read_f32(&apart.1).unwrap());
        let want_linear = bits(&gpu.read_f32(&apart.2).unwrap());
        for (form, (ids, weights, y)) in [("one launch", &together), ("listed", &listed)] {
            assert_eq!(gpu.read_u32(ids).unwrap(), want_ids, "{label}, {form}: chosen experts");
            assert_eq!(
                bits(&gpu.read_f32(weights).unwrap()),
                want_weights,
                "{label}, {form}: routing weights"
            );
            assert_eq!(bits(&gpu.read_f32(y).unwrap()), want_linear, "{label}, {form}: linear");
        }
        let got = gpu.read_f32(&together.2).unwrap();
        let (mut want, mut scale) = (Vec::new(), Vec::new());
        for r in 0..rows {
            let xr = &x[r * cols..(r + 1) * cols];
            for n in 0..out {
                let (exact, magnitude) = dot_and_magnitude(&w, n, xr);
                want.push(f64::from(drama_checkpoint::numerics::round_to_bf16(exact as f32)));
                scale.push(magnitude + bf16_ulp(exact) / TOL);
            }
        }
        check(&label, &got, &want, &scale, TOL);
    }
    let mut rng = rng("route beside a linear refusal");
    let quantized = random_weights(&mut rng, WeightFormat::Nvfp4, 4, 32);
    let nvfp4 = GpuLinear::one_segment(gpu, WeightFormat::Nvfp4, (4, 32), &quantized.packed, &quantized.scales);
    let (xb, y) = (gpu.buffer_with("x", &f32_bytes(&[1.0; 32])), poisoned(gpu, "y", 4));
    let io = LinearIo::plain(&xb, &y, 1, 4, false);
    let routing = [&placeholder, &placeholder, &placeholder, &y, &y, &xb];
    let params = RouterParams::default();
    let Err(error) = route_launch(gpu, &params, routing, Some((&nvfp4, &io)), &placeholder) else {
        panic!("routing with an NVFP4 linear beside it was launched");
    };
    assert!(
        error
            .to_string()
            .contains("the linear beside routing needs one bias-free BF16 segment"),
        "{error}"
    );
}
