//! GPU norm, attention, routing and element-wise kernels against the FP64 reference on fresh
//! random inputs at odd sizes, with poisoned outputs; and buffers as the uploads write them.

mod common;

use common::*;
use drama_checkpoint::numerics::round_to_bf16;
use drama_engine::exec::route_launch;
use drama_kernels::flags::{self, bit};
use drama_kernels::{AttentionParams, ConvOutput, ElementwiseParams, Kernel, NormParams, RouterParams};
use drama_reference::ops::{self, RouterSpec};
use rand_core::Rng;

fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

#[test]
fn rms_norm_matches_reference() {
    // Widths below, between and past the two columns per invocation loaded ahead (1024 and
    // 2048 values); and widths no multiple of 4, which `Kernel::RmsNormAny` runs. A rounded
    // `Kernel::RmsNorm` writes the same values as BF16 pairs too, bit for bit.
    for (rows, width, round) in [
        (1usize, 64usize, true),
        (5, 300, false),
        (3, 20, true),
        (2, 1100, false),
        (2, 2200, true),
        (3, 34, true),
        (2, 1, false),
        (4, 37, false),
        (2, 2201, true),
    ] {
        let label = format!("rms_norm rows {rows} width {width} round {round}");
        let mut rng = rng(&label);
        let gpu = gpu();
        let x = uniform(&mut rng, rows * width, 3.0);
        let w = bf16_values(&mut rng, width, 1.5);
        let params = NormParams {
            width: width as u32,
            flags: bit(round, flags::norm::ROUND),
            eps: 1e-6,
            ..Default::default()
        };
        let (xb, wb) = (
            gpu.buffer_with("x", &f32_bytes(&x)),
            gpu.buffer_with("w", &pack_bf16(&w)),
        );
        let kernel = Kernel::rms_norm(width);
        // `Kernel::RmsNorm` binds its output twice, as f32 and as BF16 pairs.
        let norm = |params: &NormParams, y: &wgpu::Buffer| {
            let p = gpu.uniform("p", params);
            let resources: &[&wgpu::Buffer] = match kernel {
                Kernel::RmsNorm => &[&p, &xb, &wb, y, y],
                _ => &[&p, &xb, &wb, y],
            };
            run(gpu, &[dispatch(gpu, kernel, resources, [rows as u32, 1, 1])]);
        };
        let y = poisoned(gpu, "y", rows * width);
        norm(&params, &y);
        let got = gpu.read_f32(&y).unwrap();
        if kernel == Kernel::RmsNorm && round {
            let pairs = poisoned(gpu, "y pairs", rows * width / 2);
            let params = NormParams {
                flags: params.flags | flags::norm::PAIRS,
                ..params
            };
            norm(&params, &pairs);
            assert_eq!(
                u32_bytes(&gpu.read_u32(&pairs).unwrap()),
                pack_bf16(&got),
                "{label}: as BF16 pairs"
            );
        }
        let exact = ops::rms_norm(&to_f64(&x), width, &to_f64(&w), 1e-6);
        let want: Vec<f64> = exact
            .iter()
            .map(|&v| if round { f64::from(round_to_bf16(v as f32)) } else { v })
            .collect();
        let scale: Vec<f64> = exact
            .iter()
            .map(|&v| v.abs() + 1e-3 + if round { bf16_ulp(v) / 1e-5 } else { 0.0 })
            .collect();
        check(&label, &got, &want, &scale, 1e-5);
    }
}

/// Attention over a cache shared by three lanes at different positions: rows of one step
/// (RoPE on q, attention over the cached keys and values, this step's included) against
/// the reference. The cache write itself is tested with the linear kernel that does it.
#[test]
fn rope_and_attention_match_reference() {
    attention_case("attention", 6, 2, 16, 40, [5, 1, 33]);
}

/// Heads wider than one batch of key loads per invocation (160 = 40 vec4 columns: a second
/// batch, and value parts that do not divide the workgroup).
#[test]
fn attention_with_wide_heads_matches_reference() {
    attention_case("attention-wide", 2, 1, 160, 80, [3, 70, 80]);
}

/// Head widths whose vec4 columns the kernel's four quarters of a dot product do not share
/// evenly (24: six columns, quarters of two, two, one and one; 8: two columns, two quarters
/// idle), over two chunks; even widths that are no whole number of vec4s (42, 6, 2: the
/// cache's padding, a query staged and an output written element by element); and three
/// heads of 84 columns to a key/value head, which a block's combining workgroup could not
/// cover (80 invocations a head).
#[test]
fn attention_at_head_widths_no_multiple_of_16_matches_reference() {
    let chunk = drama_kernels::ATTENTION_CHUNK;
    attention_case("attention-hd336", 3, 1, 336, chunk + 2, [chunk + 2, 1, 40]);
    attention_case("attention-hd24", 6, 2, 24, chunk + 9, [3, chunk, chunk + 9]);
    attention_case("attention-hd8", 3, 3, 8, chunk + 2, [chunk + 2, 1, 17]);
    attention_case("attention-hd42", 6, 2, 42, chunk + 9, [3, chunk, chunk + 9]);
    attention_case("attention-hd6", 3, 1, 6, 20, [20, 1, 7]);
    attention_case("attention-hd2", 2, 2, 2, 9, [9, 4, 1]);
}

/// The same over several attention chunks: lengths one short of, exactly at and past chunk
/// boundaries, and a head width whose key columns do not fill the kernel's load batches.
#[test]
fn attention_across_chunks_matches_reference() {
    let chunk = drama_kernels::ATTENTION_CHUNK;
    attention_case(
        "attention-chunks",
        4,
        2,
        48,
        3 * chunk + 5,
        [chunk, 2 * chunk + 1, 3 * chunk + 5],
    );
}

/// Rows over many more chunks than the combine reads at a time (four): 64, one past, and
/// 127 (a last batch one chunk short of full).
#[test]
fn attention_over_several_combine_batches_matches_reference() {
    let chunk = drama_kernels::ATTENTION_CHUNK;
    attention_case(
        "attention-combine-batches",
        2,
        1,
        32,
        127 * chunk + 3,
        [64 * chunk, 64 * chunk + 1, 127 * chunk],
    );
}

/// Rows of 8, 9 and 301 chunks (more than a workgroup has invocations, should the combine
/// share the chunks out among them), the keys past the first 256 chunks 256 times larger:
/// their scores reach hundreds, so a maximum that missed them would overflow exp, where
/// otherwise it cancels out of the quotient.
#[test]
fn attention_with_loud_late_keys_matches_reference() {
    let chunk = drama_kernels::ATTENTION_CHUNK;
    scaled_attention_case(
        "attention-combine-max",
        (2, 1, 32),
        301 * chunk,
        [8 * chunk, 8 * chunk + 1, 301 * chunk],
        (256 * chunk, 256.0),
    );
}

/// The bench checkpoint's heads (four query heads per key/value head, 128 wide) over 15,
/// 16 and 33 chunks, and a group of eight query heads per key/value head.
#[test]
fn attention_with_the_bench_heads_matches_reference() {
    let chunk = drama_kernels::ATTENTION_CHUNK;
    attention_case(
        "attention-group4",
        8,
        2,
        128,
        33 * chunk,
        [15 * chunk, 15 * chunk + 1, 32 * chunk + 3],
    );
    attention_case(
        "attention-group8",
        8,
        1,
        64,
        40 * chunk,
        [32 * chunk + 7, 1, 40 * chunk],
    );
}

fn attention_case(
    label: &str,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    lane_lengths: [usize; 3],
) {
    let dims = (heads, kv_heads, head_dim);
    scaled_attention_case(label, dims, capacity, lane_lengths, (capacity, 1.0));
}

/// `attention_case` with (heads, kv_heads, head_dim), the keys at positions from `loud.0`
/// drawn `loud.1` times larger.
fn scaled_attention_case(
    label: &str,
    (heads, kv_heads, head_dim): (usize, usize, usize),
    capacity: usize,
    lane_lengths: [usize; 3],
    loud: (usize, f32),
) {
    let mut rng = rng(label);
    let gpu = gpu();
    let theta = 10000.0;
    let lanes = 3;
    let kv_width = kv_heads * head_dim;
    // A head's floats in the caches: whole vec4s, the padding zero as the engine leaves it.
    let stride = drama_kernels::head_stride(head_dim);
    let cache_width = kv_heads * stride;
    // Every lane's cache up to and including the current position (where the [q|k|v]
    // projection wrote this step's key and value), as rotated keys / values.
    let mut k_cache = vec![0f32; lanes * capacity * cache_width];
    let mut v_cache = vec![0f32; lanes * capacity * cache_width];
    let mut keys: Vec<Vec<Vec<f64>>> = vec![Vec::new(); lanes];
    let mut values: Vec<Vec<Vec<f64>>> = vec![Vec::new(); lanes];
    for lane in 0..lanes {
        for pos in 0..lane_lengths[lane] {
            let key_scale = if pos >= loud.0 { loud.1 } else { 1.0 };
            let k = bf16_values(&mut rng, kv_width, key_scale);
            let v = bf16_values(&mut rng, kv_width, 1.0);
            let rotated: Vec<f64> = (0..kv_heads)
                .flat_map(|g| ops::rope(&to_f64(&k[g * head_dim..(g + 1) * head_dim]), pos, theta))
                .collect();
            let base = (lane * capacity + pos) * cache_width;
            for g in 0..kv_heads {
                let (head, at) = (g * head_dim..(g + 1) * head_dim, base + g * stride);
                for (i, r) in rotated[head.clone()].iter().enumerate() {
                    k_cache[at + i] = *r as f32;
                }
                v_cache[at..at + head_dim].copy_from_slice(&v[head]);
            }
            keys[lane].push(rotated.iter().map(|&r| f64::from(r as f32)).collect());
            values[lane].push(to_f64(&v));
        }
    }
    // This step: one row per lane at its last position.
    let rows = lanes;
    let row_lane: Vec<u32> = (0..lanes as u32).collect();
    let row_pos: Vec<u32> = lane_lengths.iter().map(|&l| (l - 1) as u32).collect();
    let q = bf16_values(&mut rng, rows * heads * head_dim, 1.0);
    // The fused projection's rows: [q | k | v]; attention reads only q from them (NaN k and
    // v columns would show in the output if it read them).
    let q_width = heads * head_dim;
    let qkv: Vec<f32> = (0..rows)
        .flat_map(|r| {
            let q_row = &q[r * q_width..(r + 1) * q_width];
            q_row
                .iter()
                .copied()
                .chain(std::iter::repeat_n(f32::NAN, 2 * kv_width))
                .collect::<Vec<f32>>()
        })
        .collect();
    let table = drama_engine::rope::rope_table(capacity, head_dim, theta);
    let block_heads = drama_kernels::attention_block_heads(heads, kv_heads, head_dim) as u32;
    let params = AttentionParams {
        rows: rows as u32,
        heads: heads as u32,
        kv_heads: kv_heads as u32,
        head_dim: head_dim as u32,
        capacity: capacity as u32,
        flags: flags::attention::ROUND,
        scale: 1.0 / (head_dim as f32).sqrt(),
        block_heads,
        block_from: drama_kernels::ATTENTION_BLOCKS_FROM as u32,
        pad: [0; 2],
    };
    // Rounded to BF16 as the model's steps ask (against the reference), and unrounded (the
    // launch forms compared bit for bit, where rounding would hide a difference): rows by
    // blocks of heads from the engine's length, from the first chunk, and never.
    let rounded = gpu.uniform("p", &params);
    let unrounded = [params.block_from, 0, u32::MAX].map(|block_from| {
        gpu.uniform(
            "p unrounded",
            &AttentionParams {
                flags: 0,
                block_from,
                ..params
            },
        )
    });
    let lane_b = gpu.buffer_with("lane", &u32_bytes(&row_lane));
    let pos_b = gpu.buffer_with("pos", &u32_bytes(&row_pos));
    let table_b = gpu.buffer_with("rope", bytemuck::cast_slice(&table));
    let qkv_b = gpu.buffer_with("qkv", &f32_bytes(&qkv));
    let kc = gpu.buffer_with("k_cache", &f32_bytes(&k_cache));
    let vc = gpu.buffer_with("v_cache", &f32_bytes(&v_cache));
    let out = poisoned(gpu, "out", rows * heads * head_dim);
    let scratch = poisoned(
        gpu,
        "scratch",
        drama_kernels::attention_scratch_floats(rows, heads, head_dim, capacity),
    );
    let chunks_done = gpu.buffer_with("chunks done", &u32_bytes(&vec![0; rows * heads]));
    // `kernel` (`attend` or `attend_blocks`, alone or combining too) with parameters `p`,
    // writing `out` when it combines.
    let attend = |kernel: Kernel, p: &wgpu::Buffer, out: &wgpu::Buffer| {
        let blocks = matches!(kernel, Kernel::AttendBlocks | Kernel::AttendBlocksAndCombine);
        dispatch(
            gpu,
            kernel,
            &[
                p,
                &lane_b,
                &pos_b,
                &table_b,
                &qkv_b,
                &kc,
                &vc,
                out,
                &scratch,
                &chunks_done,
                &scratch,
            ],
            [
                rows as u32,
                heads as u32 / if blocks { block_heads } else { 1 },
                drama_kernels::attention_chunks(capacity) as u32,
            ],
        )
    };
    // The launches of a form: a workgroup per head, then by blocks where a block has heads.
    let attends = |per_head: Kernel, by_blocks: Kernel, p: &wgpu::Buffer, out: &wgpu::Buffer| {
        let mut launches = vec![attend(per_head, p, out)];
        if block_heads > 1 {
            launches.push(attend(by_blocks, p, out));
        }
        launches
    };
    // The form with a combine launch, with parameters `p`.
    let separate = |p: &wgpu::Buffer, out: &wgpu::Buffer| {
        let combine = dispatch(
            gpu,
            Kernel::AttendCombine,
            &[p, &pos_b, out, &scratch, &scratch],
            [rows as u32, heads as u32, 1],
        );
        let mut launches = attends(Kernel::Attend, Kernel::AttendBlocks, p, out);
        launches.push(combine);
        run(gpu, &launches);
        gpu.read_f32(out).unwrap()
    };
    let got = separate(&rounded, &out);
    let exact = separate(&unrounded[0], &poisoned(gpu, "unrounded out", rows * heads * head_dim));
    for (p, rows_by_blocks) in unrounded.iter().zip(["the engine's", "every", "no"]).skip(1) {
        let other = separate(p, &poisoned(gpu, "unrounded out", rows * heads * head_dim));
        assert_same_bits(&other, &exact, &format!("{label}: {rows_by_blocks} row by blocks"));
    }
    // The form that combines in its launches, each chunk count back at zero after every
    // launch: the same bits, launch after launch on the same counts, whichever rows go by
    // blocks.
    for (launch, p) in unrounded.iter().cycle().take(6).enumerate() {
        let fused_out = poisoned(gpu, "fused out", rows * heads * head_dim);
        run(
            gpu,
            &attends(Kernel::AttendAndCombine, Kernel::AttendBlocksAndCombine, p, &fused_out),
        );
        let fused_got = gpu.read_f32(&fused_out).unwrap();
        assert_same_bits(
            &fused_got,
            &exact,
            &format!("{label}: combined in the launches, launch {launch}"),
        );
        let counts = gpu.read_u32(&chunks_done).unwrap();
        assert!(
            counts.iter().all(|&c| c == 0),
            "{label}: chunk counts after launch {launch}: {counts:?}"
        );
    }
    let mut want = Vec::new();
    let mut scale = Vec::new();
    for r in 0..rows {
        let pos = row_pos[r] as usize;
        let lane = r;
        let (ks, vs) = (&keys[lane], &values[lane]);
        let qr: Vec<f64> = (0..heads)
            .flat_map(|h| {
                ops::rope(
                    &to_f64(&q[(r * heads + h) * head_dim..(r * heads + h + 1) * head_dim]),
                    pos,
                    theta,
                )
            })
            .collect();
        let exact = ops::attention(&qr, ks, vs, heads, kv_heads, head_dim);
        for v in exact {
            want.push(f64::from(round_to_bf16(v as f32)));
            scale.push(1.0 + bf16_ulp(v) / 1e-5);
        }
    }
    check(label, &got, &want, &scale, 1e-5);
}

/// Runs the router kernel on `logits` rows and returns (ids, weights).
fn gpu_route(
    spec: &RouterSpec,
    kept: &[usize],
    logits: &[f32],
    width: usize,
    bias: Option<&[f32]>,
) -> (Vec<u32>, Vec<f32>) {
    let gpu = gpu();
    let rows = logits.len() / width;
    let full = width == spec.num_experts && width != kept.len();
    let params = RouterParams {
        rows: rows as u32,
        logit_width: width as u32,
        kept: kept.len() as u32,
        k: spec.k as u32,
        flags: bit(spec.sigmoid, flags::router::SIGMOID)
            | bit(full, flags::router::FULL_WIDTH)
            | bit(bias.is_some(), flags::router::SCORE_BIAS)
            | bit(spec.norm_topk_prob, flags::router::RENORMALIZE),
        n_group: spec.n_group as u32,
        topk_group: spec.topk_group as u32,
        group_size: (spec.num_experts / spec.n_group) as u32,
        scaling: spec.routed_scaling_factor as f32,
        pad: [0; 3],
    };
    let kept_u32: Vec<u32> = kept.iter().map(|&e| e as u32).collect();
    let placeholder = gpu.buffer_with("placeholder", &[0; 16]);
    let lb = gpu.buffer_with("logits", &f32_bytes(logits));
    let kb = gpu.buffer_with("kept", &u32_bytes(&kept_u32));
    let bb = gpu.buffer_with("bias", &f32_bytes(bias.unwrap_or(&[0.0])));
    let ids = poisoned(gpu, "ids", rows * spec.k);
    let weights = poisoned(gpu, "weights", rows * spec.k);
    let routing = [&lb, &kb, &bb, &ids, &weights, &placeholder];
    run(gpu, &[route_launch(gpu, &params, routing, None, &placeholder).unwrap()]);
    (gpu.read_u32(&ids).unwrap(), gpu.read_f32(&weights).unwrap())
}

fn route_case(spec: RouterSpec, kept: Vec<usize>, full_width: bool, with_bias: bool, ties: bool) {
    let label = format!(
        "route {spec:?} kept {} full {full_width} bias {with_bias} ties {ties}",
        kept.len()
    );
    let mut rng = rng(&label);
    let rows = 37;
    let width = if full_width { spec.num_experts } else { kept.len() };
    let mut logits = uniform(&mut rng, rows * width, 3.0);
    if ties {
        // Quantise so many logits are exactly equal: ties must go to the lower original id.
        for v in &mut logits {
            *v = (*v * 2.0).round() / 2.0;
        }
    }
    let bias_by_row: Option<Vec<f32>> = with_bias.then(|| uniform(&mut rng, width, 0.2));
    let (ids, weights) = gpu_route(&spec, &kept, &logits, width, bias_by_row.as_deref());
    for r in 0..rows {
        let mut by_id = vec![f64::NEG_INFINITY; spec.num_experts];
        let mut bias_by_id = vec![0.0; spec.num_experts];
        for (i, &e) in kept.iter().enumerate() {
            let column = if full_width { e } else { i };
            by_id[e] = f64::from(logits[r * width + column]);
            if let Some(b) = &bias_by_row {
                bias_by_id[e] = f64::from(b[column]);
            }
        }
        let bias = with_bias.then_some(&bias_by_id[..]);
        let (mut want, margin) = ops::route_with_margin(&spec, &kept, &by_id, bias);
        let got_ids: Vec<usize> = ids[r * spec.k..(r + 1) * spec.k]
            .iter()
            .map(|&i| kept[i as usize])
            .collect();
        let want_ids: Vec<usize> = want.iter().map(|w| w.0).collect();
        if got_ids != want_ids {
            // A sigmoid router's scores (a sigmoid plus a bias, below 1.25; a group's, the sum
            // of two) are f32 arithmetic, a few ulps (2^-23 of 2.5) off each: two within that
            // of each other may rank either way, and there the reference follows the GPU's
            // choice. A softmax router ranks by the logits themselves, and an exact tie
            // (margin 0) must go to the lower id.
            assert!(
                spec.sigmoid && 0.0 < margin && margin < 2e-6,
                "{label}: row {r} chose {got_ids:?} for {want_ids:?} (margin {margin:e})"
            );
            want = ops::route_choosing(&spec, &kept, &by_id, bias, Some(&got_ids)).0;
        }
        for (j, (_, w)) in want.iter().enumerate() {
            let g = f64::from(weights[r * spec.k + j]);
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1e-3),
                "{label}: row {r} weight {j}: {g} vs {w}"
            );
        }
    }
}

#[test]
fn router_matches_reference() {
    let softmax = |k, experts| RouterSpec {
        sigmoid: false,
        k,
        norm_topk_prob: true,
        routed_scaling_factor: 1.0,
        num_experts: experts,
        n_group: 1,
        topk_group: 1,
    };
    let pruned: Vec<usize> = (0..64).filter(|e| e % 3 != 1).collect();
    route_case(softmax(8, 64), pruned.clone(), false, false, false);
    route_case(softmax(8, 64), pruned.clone(), true, false, true);
    let mut unnormalised = softmax(4, 16);
    unnormalised.norm_topk_prob = false;
    route_case(unnormalised.clone(), (0..16).collect(), false, false, true);
    // Weights that keep the softmax denominator, over a kept count that is not a power of
    // two (a tree of 16 with one empty slot).
    route_case(unnormalised, (0..16).filter(|&e| e != 5).collect(), false, false, false);
    // Kept counts past 128 and past 256 (the denominator's 64 partial sums over several
    // experts each, the 256 invocations ranking two each), with weights that keep the
    // denominator (renormalised weights would hide a wrong one).
    let mut wide = softmax(8, 512);
    wide.norm_topk_prob = false;
    route_case(
        wide.clone(),
        (0..512).filter(|e| e % 5 != 2).take(200).collect(),
        false,
        false,
        false,
    );
    route_case(
        wide.clone(),
        (0..512).filter(|e| e % 5 != 2).collect(),
        true,
        false,
        false,
    );
    // Exactly the smallest routing capacity (128 kept experts, no padding) and one past it
    // (the next capacity's arrays).
    route_case(wide.clone(), (0..512).step_by(4).collect(), false, false, true);
    route_case(
        wide,
        (0..512).filter(|e| e % 4 == 0 || *e == 1).collect(),
        false,
        false,
        false,
    );
    let sigmoid = RouterSpec {
        sigmoid: true,
        k: 6,
        norm_topk_prob: true,
        routed_scaling_factor: 2.5,
        num_experts: 64,
        n_group: 8,
        topk_group: 3,
    };
    // Groups 2 and 5 have no kept expert at all; others vary in size.
    let kept: Vec<usize> = (0..64).filter(|e| e / 8 != 2 && e / 8 != 5 && e % 5 != 3).collect();
    route_case(sigmoid.clone(), kept.clone(), false, true, false);
    route_case(sigmoid.clone(), kept.clone(), true, true, true);
    let mut no_groups = sigmoid;
    no_groups.n_group = 1;
    no_groups.topk_group = 1;
    route_case(no_groups, kept, true, false, true);
}

/// A softmax router ranks as the exact probabilities do, as the FP64 reference does: two
/// logits one f32 step apart, whose f32 differences from the largest logit (and so whose
/// f32 probabilities) are equal, still rank apart, the higher logit first even where it
/// belongs to the higher id.
#[test]
fn router_ranks_logits_whose_f32_probabilities_are_equal() {
    let spec = RouterSpec {
        sigmoid: false,
        k: 2,
        norm_topk_prob: true,
        routed_scaling_factor: 1.0,
        num_experts: 16,
        n_group: 1,
        topk_group: 1,
    };
    let kept: Vec<usize> = (0..16).collect();
    let mut logits: Vec<f32> = (0..16).map(|e| -1.0 - e as f32 * 0.25).collect();
    let close = 0.1f32;
    let just_below = f32::from_bits(close.to_bits() - 1);
    logits[9] = 5.0;
    logits[3] = just_below;
    logits[7] = close;
    assert_eq!(
        just_below - 5.0,
        close - 5.0,
        "the two probabilities must round alike in f32"
    );
    let (ids, weights) = gpu_route(&spec, &kept, &logits, 16, None);
    let by_id: Vec<f64> = logits.iter().map(|&l| f64::from(l)).collect();
    let want = ops::route(&spec, &kept, &by_id, None);
    let want_ids: Vec<u32> = want.iter().map(|w| w.0 as u32).collect();
    assert_eq!(want_ids, vec![7, 9], "the reference ranks the higher logit first");
    assert_eq!(ids, want_ids);
    for (got, (_, w)) in weights.iter().zip(&want) {
        assert!((f64::from(*got) - w).abs() <= 1e-6, "weight {got} against {w}");
    }
}

/// More kept experts than any routing capacity holds are refused by name.
#[test]
fn routing_past_its_largest_capacity_is_refused() {
    let gpu = gpu();
    let kept = drama_kernels::MAX_KEPT_EXPERTS as u32 + 1;
    let params = RouterParams {
        rows: 1,
        logit_width: kept,
        kept,
        k: 8,
        flags: 0,
        n_group: 1,
        topk_group: 1,
        group_size: kept,
        scaling: 1.0,
        pad: [0; 3],
    };
    let placeholder = gpu.buffer_with("placeholder", &[0; 16]);
    let buffers: Vec<wgpu::Buffer> = (0..6).map(|_| poisoned(gpu, "routing", kept as usize)).collect();
    let routing = [
        &buffers[0],
        &buffers[1],
        &buffers[2],
        &buffers[3],
        &buffers[4],
        &buffers[5],
    ];
    let Err(error) = route_launch(gpu, &params, routing, None, &placeholder) else {
        panic!("{kept} kept experts were routed");
    };
    assert!(
        error
            .to_string()
            .contains("513 kept experts: routing holds at most 512"),
        "{error}"
    );
}

#[test]
fn elementwise_kernels_match_reference() {
    let label = "elementwise";
    let mut rng = rng(label);
    let gpu = gpu();
    let (tokens, width, k) = (3usize, 70usize, 4usize);
    let count = tokens * width;
    let params = |flags: u32| ElementwiseParams {
        count: count as u32,
        width: width as u32,
        k: k as u32,
        flags,
        ..Default::default()
    };
    let grid = [count.div_ceil(64) as u32, 1, 1];
    let a = uniform(&mut rng, count, 4.0);
    let b = bf16_values(&mut rng, count, 2.0);
    let (ab, bb) = (
        gpu.buffer_with("a", &f32_bytes(&a)),
        gpu.buffer_with("b", &f32_bytes(&b)),
    );
    // swiglu, rounded, from [gate | up] rows (gate = a, up = b).
    let gate_up: Vec<f32> = (0..tokens)
        .flat_map(|t| {
            a[t * width..(t + 1) * width]
                .iter()
                .chain(&b[t * width..(t + 1) * width])
                .copied()
        })
        .collect();
    let gub = gpu.buffer_with("gate_up", &f32_bytes(&gate_up));
    let p = gpu.uniform("p", &params(1));
    let out = poisoned(gpu, "out", count);
    run(gpu, &[dispatch(gpu, Kernel::Swiglu, &[&p, &gub, &out], grid)]);
    let exact: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(&g, &u)| ops::swiglu(f64::from(g), f64::from(u)))
        .collect();
    let want: Vec<f64> = exact.iter().map(|&v| f64::from(round_to_bf16(v as f32))).collect();
    let scale: Vec<f64> = exact.iter().map(|&v| v.abs() + bf16_ulp(v) / 1e-5 + 1e-6).collect();
    check("swiglu", &gpu.read_f32(&out).unwrap(), &want, &scale, 1e-5);
    // add, exact in f32.
    let p = gpu.uniform("p", &params(0));
    let out = poisoned(gpu, "out", count);
    run(gpu, &[dispatch(gpu, Kernel::Add, &[&p, &ab, &bb, &out], grid)]);
    let got = gpu.read_f32(&out).unwrap();
    for i in 0..count {
        assert_eq!(got[i].to_bits(), (a[i] + b[i]).to_bits(), "add element {i}");
    }
    // pack_bf16: the BF16 values b two to a word, exactly as the host packs them (count is
    // words here); the poisoned tail past the last word stays untouched.
    let words = count / 2;
    let p = gpu.uniform(
        "p",
        &ElementwiseParams {
            count: words as u32,
            ..params(0)
        },
    );
    let out = poisoned(gpu, "out", words + 1);
    run(gpu, &[dispatch(gpu, Kernel::PackBf16, &[&p, &bb, &out], grid)]);
    let got = gpu.read_f32(&out).unwrap();
    let words_got: Vec<u8> = got[..words].iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
    assert_eq!(words_got, pack_bf16(&b), "pack_bf16");
    assert!(got[words].is_nan(), "pack_bf16 wrote past its words");
    // gelu (erf form), rounded: the WGSL erf is an approximation to ~1.5e-7.
    let p = gpu.uniform("p", &params(1));
    let out = poisoned(gpu, "out", count);
    run(gpu, &[dispatch(gpu, Kernel::Gelu, &[&p, &ab, &out], grid)]);
    let exact: Vec<f64> = a.iter().map(|&v| drama_reference::tower::gelu(f64::from(v))).collect();
    let want: Vec<f64> = exact.iter().map(|&v| f64::from(round_to_bf16(v as f32))).collect();
    let scale: Vec<f64> = exact.iter().map(|&v| v.abs() + 1.0 + bf16_ulp(v) / 1e-6).collect();
    check("gelu", &gpu.read_f32(&out).unwrap(), &want, &scale, 1e-6);
    // mean over rows (tokens rows of width), not rounded.
    let mean_params = ElementwiseParams {
        count: width as u32,
        width: width as u32,
        k: tokens as u32,
        flags: 0,
        ..Default::default()
    };
    let p = gpu.uniform("p", &mean_params);
    let out = poisoned(gpu, "out", width);
    run(
        gpu,
        &[dispatch(
            gpu,
            Kernel::MeanRows,
            &[&p, &ab, &out],
            [width.div_ceil(64) as u32, 1, 1],
        )],
    );
    let want: Vec<f64> = (0..width)
        .map(|c| (0..tokens).map(|t| f64::from(a[t * width + c])).sum::<f64>() / tokens as f64)
        .collect();
    let scale: Vec<f64> = (0..width)
        .map(|c| (0..tokens).map(|t| f64::from(a[t * width + c]).abs()).sum::<f64>() + 1e-6)
        .collect();
    check("mean_rows", &gpu.read_f32(&out).unwrap(), &want, &scale, 1e-6);
}

/// A MoE layer's combine with the norm after it, with and without a shared expert, at widths
/// below, between and past the two columns per invocation combined ahead (1024 and 2048
/// values), and past two more pairs (4096): the residual stream it writes against the FP64
/// combine, the normed row against the FP64 norm of that stream; and the same launch
/// writing the normed row as BF16 pairs, bit for bit those values.
#[test]
fn moe_combine_norm_matches_reference() {
    let gpu = gpu();
    let cases = [
        (3usize, 64usize, 4usize, true),
        (2, 1100, 3, false),
        (2, 2200, 8, true),
        (1, 4400, 11, true),
    ];
    for (rows, width, k, shared) in cases {
        let label = format!("moe combine norm rows {rows} width {width} k {k} shared {shared}");
        let mut rng = rng(&label);
        let gate_stride = 5;
        let residual = uniform(&mut rng, rows * width, 3.0);
        let routed = bf16_values(&mut rng, rows * k * width, 2.0);
        let weights = uniform(&mut rng, rows * k, 1.0);
        let logits = uniform(&mut rng, rows * gate_stride, 4.0);
        let shared_out = bf16_values(&mut rng, rows * width, 2.0);
        let norm_weight = bf16_values(&mut rng, width, 1.5);
        let params = NormParams {
            width: width as u32,
            flags: flags::norm::ROUND | bit(shared, flags::norm::SHARED_EXPERT),
            eps: 1e-6,
            k: k as u32,
            gate_stride: gate_stride as u32,
            ..Default::default()
        };
        let p = gpu.uniform("p", &params);
        let buffer = |name, values: &[f32]| gpu.buffer_with(name, &f32_bytes(values));
        let (rb, eb, wb, lb, sb) = (
            buffer("residual", &residual),
            buffer("routed", &routed),
            buffer("weights", &weights),
            buffer("logits", &logits),
            buffer("shared", &shared_out),
        );
        let nb = gpu.buffer_with("norm weight", &pack_bf16(&norm_weight));
        let (y, h) = (poisoned(gpu, "y", rows * width), poisoned(gpu, "h", rows * width));
        // The normed output bound twice, as f32 and as BF16 pairs.
        let combine = |p: &wgpu::Buffer, y: &wgpu::Buffer, h: &wgpu::Buffer| {
            run(
                gpu,
                &[dispatch(
                    gpu,
                    Kernel::CombineRmsNorm,
                    &[p, &rb, &nb, y, &eb, &wb, &lb, &sb, h, y],
                    [rows as u32, 1, 1],
                )],
            );
        };
        combine(&p, &y, &h);
        let got_h = gpu.read_f32(&h).unwrap();
        let (pairs, pairs_h) = (
            poisoned(gpu, "y pairs", rows * width / 2),
            poisoned(gpu, "h", rows * width),
        );
        let pairs_params = NormParams {
            flags: params.flags | flags::norm::PAIRS,
            ..params
        };
        combine(&gpu.uniform("p", &pairs_params), &pairs, &pairs_h);
        assert_eq!(
            u32_bytes(&gpu.read_u32(&pairs).unwrap()),
            pack_bf16(&gpu.read_f32(&y).unwrap()),
            "{label}: normed as BF16 pairs"
        );
        assert_eq!(
            gpu.read_f32(&pairs_h).unwrap(),
            got_h,
            "{label}: residual stream beside pairs"
        );
        let (mut want, mut scale) = (Vec::new(), Vec::new());
        for r in 0..rows {
            let logit = f64::from(logits[r * gate_stride + gate_stride - 1]);
            let gate = 1.0 / (1.0 + (-logit).exp());
            for c in 0..width {
                let mut value = f64::from(residual[r * width + c]);
                let mut magnitude = value.abs();
                for j in 0..k {
                    let term = f64::from(weights[r * k + j]) * f64::from(routed[(r * k + j) * width + c]);
                    value += term;
                    magnitude += term.abs();
                }
                if shared {
                    let term = gate * f64::from(shared_out[r * width + c]);
                    value += term;
                    magnitude += term.abs();
                }
                want.push(value);
                scale.push(magnitude);
            }
        }
        check(&format!("{label}: residual stream"), &got_h, &want, &scale, 1e-6);
        let exact = ops::rms_norm(&to_f64(&got_h), width, &to_f64(&norm_weight), 1e-6);
        let want: Vec<f64> = exact.iter().map(|&v| f64::from(round_to_bf16(v as f32))).collect();
        let scale: Vec<f64> = exact.iter().map(|&v| v.abs() + 1e-3 + bf16_ulp(v) / 1e-5).collect();
        check(
            &format!("{label}: normed"),
            &gpu.read_f32(&y).unwrap(),
            &want,
            &scale,
            1e-5,
        );
    }
}

/// The step's first launches: rows of the text and audio tables (BF16, each in segments, as
/// tables larger than a storage binding are) and of the voice prefixes (F32), one launch per
/// segment of the table with the most, the prefixes in the first. Every row is written once,
/// exactly its table's row; a row whose segment no launch binds stays poisoned.
#[test]
fn embedding_rows_come_from_the_right_table_and_segment() {
    use drama_graph::drama3::row_source::{AUDIO, PREFIX, TEXT};
    let label = "embed";
    let mut rng = rng(label);
    let gpu = gpu();
    let (vocab, audio_vocab, width) = (50usize, 20usize, 12usize);
    let text = bf16_values(&mut rng, vocab * width, 1.0);
    let audio = bf16_values(&mut rng, audio_vocab * width, 1.0);
    let prefix = uniform(&mut rng, 2 * width, 1.0);
    // Three text segments and two audio segments: three launches, the third binding no
    // audio rows (its range empty, the first segment bound).
    let text_segments = [0..17usize, 17..30, 30..vocab];
    let audio_segments = [0..8usize, 8..audio_vocab];
    let mut rows = vec![
        (PREFIX, 1u32),
        (TEXT, 3),
        (AUDIO, 19),
        (TEXT, 45),
        (PREFIX, 0),
        (TEXT, 20),
        (AUDIO, 0),
        (AUDIO, 8),
        (AUDIO, 7),
        (TEXT, 17),
        (TEXT, 16),
    ];
    rows.extend((0..7).map(|_| {
        if rng.next_u32().is_multiple_of(2) {
            (TEXT, rng.next_u32() % vocab as u32)
        } else {
            (AUDIO, rng.next_u32() % audio_vocab as u32)
        }
    }));
    let (row_table, row_index): (Vec<u32>, Vec<u32>) = rows.iter().copied().unzip();
    let count = rows.len() * width;
    let out = poisoned(gpu, "out", count);
    let (tb, ib) = (
        gpu.buffer_with("t", &u32_bytes(&row_table)),
        gpu.buffer_with("i", &u32_bytes(&row_index)),
    );
    let segment = |table: &[f32], rows: &std::ops::Range<usize>| {
        gpu.buffer_with("segment", &pack_bf16(&table[rows.start * width..rows.end * width]))
    };
    let text_data: Vec<_> = text_segments.iter().map(|r| segment(&text, r)).collect();
    let audio_data: Vec<_> = audio_segments.iter().map(|r| segment(&audio, r)).collect();
    let pb = gpu.buffer_with("prefix", &f32_bytes(&prefix));
    let grid = [count.div_ceil(64) as u32, 1, 1];
    let mut dispatches = Vec::new();
    let mut params = Vec::new();
    for (i, text_rows) in text_segments.iter().enumerate() {
        let audio_rows = audio_segments.get(i).cloned().unwrap_or(0..0);
        let p = ElementwiseParams::embed(rows.len(), width, text_rows.clone(), audio_rows, i == 0);
        params.push(gpu.uniform("p", &p));
        let audio_bound = audio_data.get(i).unwrap_or(&audio_data[0]);
        let bound = [&params[i], &pb, audio_bound, &text_data[i], &tb, &ib, &out];
        dispatches.push(dispatch(gpu, Kernel::Embed, &bound, grid));
    }
    run(gpu, &dispatches);
    let got = gpu.read_f32(&out).unwrap();
    for (r, &(source, index)) in rows.iter().enumerate() {
        let table = match source {
            PREFIX => &prefix,
            TEXT => &text,
            _ => &audio,
        };
        let i = index as usize;
        let want = &table[i * width..(i + 1) * width];
        assert_eq!(&got[r * width..(r + 1) * width], want, "row {r}: {source} {index}");
    }
    // Without the flag, and with only the first text segment bound, the prefix and every
    // other row keep their poison.
    let out = poisoned(gpu, "out", count);
    let p = gpu.uniform(
        "p",
        &ElementwiseParams::embed(rows.len(), width, text_segments[0].clone(), 0..0, false),
    );
    run(
        gpu,
        &[dispatch(
            gpu,
            Kernel::Embed,
            &[&p, &pb, &audio_data[0], &text_data[0], &tb, &ib, &out],
            grid,
        )],
    );
    let got = gpu.read_f32(&out).unwrap();
    for (r, &(source, index)) in rows.iter().enumerate() {
        let written = source == TEXT && (index as usize) < text_segments[0].end;
        let row = &got[r * width..(r + 1) * width];
        assert_eq!(row.iter().all(|v| v.is_nan()), !written, "row {r}: {source} {index}");
    }
}

/// The codec's snake activation, unrounded, against FP64 over arguments alpha * x up to
/// about 120 (many periods, both signs, the octant edges of its sine's argument reduction):
/// within a few f32 roundings of the result and of sin^2 / alpha. (The snake squares the
/// sine and divides it by alpha, so this bounds the sine's error only loosely; its effect
/// shows in the codec test, where NVIDIA's built-in `sin` flipped BF16 roundings in half of
/// the utterances.)
#[test]
fn snake_matches_reference_to_a_few_ulps() {
    let label = "snake";
    let mut rng = rng(label);
    let gpu = gpu();
    let channels = 7usize;
    let alpha = bf16_values(&mut rng, channels, 1.0)
        .iter()
        .map(|a| round_to_bf16(0.1 + a.abs() * 2.0))
        .collect::<Vec<f32>>();
    let mut x: Vec<f32> = uniform(&mut rng, 4096, 40.0);
    // Arguments on and next to multiples of pi / 4, where the reduction changes octant.
    for (i, slot) in x.iter_mut().take(64 * channels).enumerate() {
        let a = alpha[i % channels];
        let edge = (1 + i / channels) as f32 * std::f32::consts::FRAC_PI_4 / a;
        *slot = f32::from_bits(edge.to_bits().wrapping_add((i % 3) as u32).wrapping_sub(1));
    }
    let count = x.len() - x.len() % channels;
    let params = drama_kernels::CodecParams {
        out_ch: channels as u32,
        count: count as u32,
        ..Default::default()
    };
    let p = gpu.uniform("p", &params);
    let xb = gpu.buffer_with("x", &f32_bytes(&x[..count]));
    let ab = gpu.buffer_with("alpha", &pack_bf16(&alpha));
    let out = poisoned(gpu, "out", count);
    run(
        gpu,
        &[dispatch(
            gpu,
            Kernel::Snake,
            &[&p, &xb, &ab, &out],
            [count.div_ceil(64) as u32, 1, 1],
        )],
    );
    let got = gpu.read_f32(&out).unwrap();
    // The engine's sine is within 2^-24 of exact. In the fast-math emulation the kernel uses
    // WGSL's built-in sin, whose accuracy is the platform's: an H100's went up to 1.2 times
    // the 2^-24 bound and stays within 2^-21 (eleven seeds: 0.87 of it at most); lavapipe's
    // within 2^-24.
    let sine_error = match gpu.caps.numerics {
        drama_kernels::Numerics::AsWritten => 1.0,
        drama_kernels::Numerics::FastMathEmulation => 8.0,
    };
    let mut want = Vec::new();
    let mut scale = Vec::new();
    for (n, &v) in x[..count].iter().enumerate() {
        let a = f64::from(alpha[n % channels]);
        let v = f64::from(v);
        let sine = (a * v).sin();
        let exact = v + sine * sine / (a + 1e-9);
        want.push(exact);
        // A few f32 roundings of the result, and a sine within sine_error 2^-24 of exact:
        // the term s^2 / alpha then errs by up to 2 |s| / alpha sine_error 2^-24.
        scale.push(exact.abs() + sine_error * sine.abs() / a);
    }
    check(label, &got, &want, &scale, 2.0 * f64::from(f32::EPSILON));
}

/// Random snake alphas for `channels` channels (BF16, 0.1 and up), on the GPU.
fn snake_alphas(gpu: &drama_engine::gpu::Gpu, rng: &mut rand_chacha::ChaCha8Rng, channels: usize) -> wgpu::Buffer {
    let alphas: Vec<f32> = bf16_values(rng, channels, 1.0)
        .iter()
        .map(|a| round_to_bf16(0.1 + a.abs()))
        .collect();
    gpu.buffer_with("alpha", &pack_bf16(&alphas))
}

/// The parameters of the snake kernel over `count` values of `channels` channels, rounding
/// to BF16 as the decoder does.
fn snake_params(gpu: &drama_engine::gpu::Gpu, channels: usize, count: usize) -> wgpu::Buffer {
    gpu.uniform(
        "snake p",
        &drama_kernels::CodecParams {
            out_ch: channels as u32,
            flags: flags::codec::ROUND,
            count: count as u32,
            ..Default::default()
        },
    )
}

/// A codec conv1d whose launch also runs the steps after it (a snake; the residual add and
/// the snake after it; tanh) writes what the convolution followed by those steps' own
/// kernels writes: bit for bit for the snakes and the add (the same arithmetic), within f32
/// rounding of the host's tanh for the output convolution. Random shapes with a history,
/// channel counts that leave the last thread's set of four channels partial, narrow and wide
/// inputs (2 and 16 threads per output channel).
#[test]
fn conv_epilogues_give_their_own_kernels_bits() {
    let label = "conv epilogues";
    let mut rng = rng(label);
    let gpu = gpu();
    for (cin, cout) in [(24usize, 10usize), (130, 37)] {
        let (frames, kernel, dilation) = (13usize, 3usize, 2usize);
        let history = (kernel - 1) * dilation;
        let launch = drama_kernels::conv1d_launch(cin, cout, frames, kernel, dilation);
        let p = gpu.uniform("p", &launch.params);
        let x = gpu.buffer_with("x", &f32_bytes(&bf16_values(&mut rng, frames * cin, 2.0)));
        let hist = gpu.buffer_with("hist", &f32_bytes(&bf16_values(&mut rng, history * cin, 2.0)));
        let w = gpu.buffer_with("w", &pack_bf16(&bf16_values(&mut rng, cout * cin * kernel, 0.3)));
        let bias = gpu.buffer_with("bias", &pack_bf16(&bf16_values(&mut rng, cout, 0.5)));
        let alpha = snake_alphas(gpu, &mut rng, cout);
        let residual = gpu.buffer_with("residual", &f32_bytes(&uniform(&mut rng, frames * cout, 3.0)));
        let count = frames * cout;
        let grid = [count.div_ceil(64) as u32, 1, 1];
        let out = |name: &str| poisoned(gpu, name, count);
        let conv = |output, extra: &[&wgpu::Buffer], y: &wgpu::Buffer| {
            let mut buffers = vec![&p, &x, &hist, &w, &bias, y];
            buffers.extend(extra);
            dispatch(gpu, Kernel::Conv1d(output), &buffers, launch.grid)
        };
        // The convolution, then each step in its own launch.
        let (plain, snaked, added) = (out("plain"), out("snaked"), out("added"));
        let added_snaked = out("added snaked");
        let snake_params = snake_params(gpu, cout, count);
        let add_params = gpu.uniform(
            "add p",
            &ElementwiseParams {
                count: count as u32,
                ..Default::default()
            },
        );
        run(
            gpu,
            &[
                conv(ConvOutput::Plain, &[], &plain),
                dispatch(gpu, Kernel::Snake, &[&snake_params, &plain, &alpha, &snaked], grid),
                dispatch(gpu, Kernel::Add, &[&add_params, &residual, &plain, &added], grid),
                dispatch(
                    gpu,
                    Kernel::Snake,
                    &[&snake_params, &added, &alpha, &added_snaked],
                    grid,
                ),
            ],
        );
        // The fused launches.
        let (fused_snake, fused_add, pcm) = (out("fused snake"), out("fused add"), out("pcm"));
        let fused_add_snaked = out("fused add snaked");
        run(
            gpu,
            &[
                conv(ConvOutput::Snake, &[&alpha], &fused_snake),
                conv(
                    ConvOutput::ResidualAndSnake,
                    &[&alpha, &residual, &fused_add_snaked],
                    &fused_add,
                ),
                conv(ConvOutput::Tanh, &[], &pcm),
            ],
        );
        let plain_values = gpu.read_f32(&plain).unwrap();
        assert!(
            plain_values.iter().all(|v| v.is_finite()),
            "{cin} -> {cout}: the plain convolution left outputs unwritten"
        );
        for (name, fused, separate) in [
            ("conv1d_snake", &fused_snake, &snaked),
            ("conv1d_residual_snake's sum", &fused_add, &added),
            ("conv1d_residual_snake's snake", &fused_add_snaked, &added_snaked),
        ] {
            let (got, want) = (gpu.read_f32(fused).unwrap(), gpu.read_f32(separate).unwrap());
            let first = got.iter().zip(&want).position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(
                first, None,
                "{cin} -> {cout}: {name} differs from its two launches at output {first:?}"
            );
        }
        // WGSL leaves tanh's accuracy to the platform: 1e-4 here, far below what a missing
        // or misplaced tanh would change (the convolution's outputs reach well past 1).
        assert!(
            plain_values.iter().any(|v| v.abs() > 1.0),
            "{cin} -> {cout}: outputs too small to tell"
        );
        for (got, v) in gpu.read_f32(&pcm).unwrap().iter().zip(&plain_values) {
            let want = v.clamp(-15.0, 15.0).tanh();
            assert!(
                (got - want).abs() <= 1e-4,
                "{cin} -> {cout}: tanh({v}) = {want}, got {got}"
            );
        }
    }
}

/// The transposed convolution's second output, the snake of its first, is bit for bit what
/// the snake's own kernel computes from that first output. Odd and even rates (one or two
/// phases per thread, the weights' word alignment), narrow and wide inputs, a history frame,
/// channel counts that leave a workgroup's last channels unused.
#[test]
fn conv_transpose_snake_gives_the_snake_kernels_bits() {
    let label = "conv transpose snake";
    let mut rng = rng(label);
    let gpu = gpu();
    for (cin, cout, rate) in [(24usize, 10usize, 3usize), (130, 37, 4)] {
        let frames = 7usize;
        let count = frames * rate * cout;
        let launch = drama_kernels::conv_transpose_launch(cin, cout, frames, rate);
        let p = gpu.uniform("p", &launch.params);
        let x = gpu.buffer_with("x", &f32_bytes(&bf16_values(&mut rng, frames * cin, 2.0)));
        let hist = gpu.buffer_with("hist", &f32_bytes(&bf16_values(&mut rng, cin, 2.0)));
        let w = gpu.buffer_with("w", &pack_bf16(&bf16_values(&mut rng, cin * cout * 2 * rate, 0.3)));
        let bias = gpu.buffer_with("bias", &pack_bf16(&bf16_values(&mut rng, cout, 0.5)));
        let alpha = snake_alphas(gpu, &mut rng, cout);
        let (y, snaked, want) = (
            poisoned(gpu, "y", count),
            poisoned(gpu, "snaked", count),
            poisoned(gpu, "want", count),
        );
        let snake_params = snake_params(gpu, cout, count);
        run(
            gpu,
            &[
                dispatch(
                    gpu,
                    Kernel::ConvTransposeSnake,
                    &[&p, &x, &hist, &w, &bias, &y, &alpha, &snaked],
                    launch.grid,
                ),
                dispatch(
                    gpu,
                    Kernel::Snake,
                    &[&snake_params, &y, &alpha, &want],
                    [count.div_ceil(64) as u32, 1, 1],
                ),
            ],
        );
        let (y, got, want) = (
            gpu.read_f32(&y).unwrap(),
            gpu.read_f32(&snaked).unwrap(),
            gpu.read_f32(&want).unwrap(),
        );
        assert!(
            y.iter().all(|v| v.is_finite()) && y.iter().any(|v| v.abs() > 1.0),
            "{cin} -> {cout} at rate {rate}: the convolution left outputs unwritten or too small to tell"
        );
        let first = got.iter().zip(&want).position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(
            first, None,
            "{cin} -> {cout} at rate {rate}: the fused snake differs from its own launch at output {first:?}"
        );
    }
}

/// Random bytes cut into pieces of random lengths (empty ones too), `total` bytes in all,
/// and their concatenation zero-padded to a whole word.
fn cut_pieces(rng: &mut rand_chacha::ChaCha8Rng, total: usize) -> (Vec<u8>, Vec<usize>) {
    let mut whole = vec![0u8; total];
    rng.fill_bytes(&mut whole);
    // Cut points at random, one of them doubled (an empty piece).
    let mut cuts: Vec<usize> = (0..5).map(|_| rng.next_u32() as usize % (total + 1)).collect();
    cuts.push(cuts[0]);
    cuts.extend([0, total]);
    cuts.sort_unstable();
    (whole, cuts)
}

/// The pieces between consecutive cuts.
fn pieces_of<'w>(whole: &'w [u8], cuts: &[usize]) -> Vec<&'w [u8]> {
    cuts.windows(2).map(|w| &whole[w[0]..w[1]]).collect()
}

/// `whole` zero-padded to a whole number of words, as a buffer holds it.
fn padded(whole: &[u8]) -> Vec<u8> {
    let mut bytes = whole.to_vec();
    bytes.resize(whole.len().div_ceil(4).max(1) * 4, 0);
    bytes
}

/// A buffer gathered from pieces holds exactly their concatenation, zero-padded to a whole
/// word: pieces over several of the host's staging ranges, each a write of its own.
#[test]
fn gathered_buffers_hold_their_pieces() {
    let mut rng = rng("gathered buffers");
    let gpu = gpu();
    for total in [1usize, 4097, 40 << 20] {
        let (whole, cuts) = cut_pieces(&mut rng, total);
        let buffer = gpu.buffer_gathered("gathered", &pieces_of(&whole, &cuts));
        let words = gpu.read_u32(&buffer).unwrap();
        assert_eq!(
            bytemuck::cast_slice::<u32, u8>(&words),
            &padded(&whole)[..],
            "{total} bytes"
        );
    }
}

/// An error wgpu reports outside an error scope (here a buffer past the device's largest) is
/// the next wait's error, not a panic, and that wait takes it: the one after succeeds. On a
/// device of its own, so that no other test's wait meets it.
#[test]
fn a_reported_gpu_error_is_the_next_waits_error() {
    let gpu = drama_engine::gpu::Gpu::new(&drama_engine::gpu::GpuOptions::default()).unwrap();
    let past = gpu.device.limits().max_buffer_size + 4;
    let _buffer = gpu.buffer("too large", past);
    let error = gpu.wait().unwrap_err().to_string();
    assert!(error.starts_with("the GPU reported an error"), "{error}");
    assert!(error.contains("too large"), "{error}");
    gpu.wait().unwrap();
}

/// Buffers written through a stager hold exactly their pieces once it finishes: several
/// staging ranges per buffer and several batches (of 8 MiB here), so that later batches
/// stage into memory the earlier ones used.
#[test]
fn staged_buffers_hold_their_pieces() {
    let mut rng = rng("staged buffers");
    let gpu = drama_engine::gpu::Gpu::new(&drama_engine::gpu::GpuOptions {
        upload_batch: Some(8 << 20),
        ..options()
    })
    .unwrap();
    let mut stager = drama_engine::gpu::Stager::new(&gpu);
    let mut written = Vec::new();
    for total in [1usize, 4097, (12 << 20) + 3, 40 << 20, 7, (9 << 20) + 1] {
        let (whole, cuts) = cut_pieces(&mut rng, total);
        let buffer = stager.buffer("staged", &pieces_of(&whole, &cuts)).unwrap();
        written.push((buffer, whole));
    }
    stager.finish().unwrap();
    for (buffer, whole) in written {
        let words = gpu.read_u32(&buffer).unwrap();
        assert_eq!(
            bytemuck::cast_slice::<u32, u8>(&words),
            &padded(&whole)[..],
            "{} bytes",
            whole.len()
        );
    }
}

/// Staging an upload on a device that is gone (as when wgpu cannot make the staging memory)
/// is the upload's error, naming the staging memory, not a panic.
#[test]
fn staging_on_a_lost_device_is_an_error_not_a_panic() {
    let gpu = drama_engine::gpu::Gpu::new(&drama_engine::gpu::GpuOptions::default()).unwrap();
    gpu.device.destroy();
    let mut stager = drama_engine::gpu::Stager::new(&gpu);
    let bytes: Vec<u8> = (0..=255).cycle().take(4 << 20).collect();
    let error = stager.buffer("after loss", &[&bytes]).unwrap_err().to_string();
    assert!(
        error.starts_with("staging memory for an upload to the GPU could not be mapped"),
        "{error}"
    );
}

/// Logits of one kind: spread floats, values full of ties (quantised), positive or negative
/// near-ties (within a few 2^-16 of each other, so some share a level and some do not), or
/// extremes
/// (infinities, saturating magnitudes, subnormals, signed zeros).
fn sampling_logits(rng: &mut impl Rng, kind: usize, vocab: usize) -> Vec<f32> {
    (0..vocab)
        .map(|_| {
            let unit = (rng.next_u32() as f32 / u32::MAX as f32) * 2.0 - 1.0;
            match kind {
                0 => unit * 12.0,
                1 => ((rng.next_u32() % 9) as f32 - 4.0) * 0.5,
                2 => 3.0 + (rng.next_u32() % 64) as f32 * 2f32.powi(-18),
                3 => -3.0 + (rng.next_u32() % 64) as f32 * 2f32.powi(-18),
                _ => [
                    f32::INFINITY,
                    f32::NEG_INFINITY,
                    1e30,
                    -1e30,
                    1e-40,
                    -0.0,
                    0.0,
                    unit * 40000.0,
                ][(rng.next_u32() % 8) as usize],
            }
        })
        .collect()
}

/// The GPU's sampling kernel picks the host's token (`sampling::gpu::Draw::on_host`) for
/// every draw: thousands of logit vectors of every kind, half of them mixed with another
/// row at a random guidance scale, with random temperatures, top-k and top-p (including
/// none, and cuts inside a run of ties), random draws and forbidden ids; a draw reading a
/// NaN gives no token on both. Runs in the fast-math emulation too.
#[test]
fn sampling_on_the_gpu_picks_the_hosts_tokens() {
    use drama_engine::sampling::exact::ExactSettings;
    use drama_engine::sampling::gpu::{Draw, GpuSampler};
    let mut rng = rng("gpu sampling");
    let gpu = gpu();
    let mut compared = 0;
    let mut guided = 0;
    let mut distinct = std::collections::HashSet::new();
    for (vocab, rows) in [(4098usize, 96usize), (300, 512), (7, 1024), (1000, 256), (2, 256)] {
        let mut sampler = GpuSampler::new(gpu, vocab, rows / 4).unwrap();
        for batch in 0..8 {
            let mut logits = Vec::new();
            let mut draws = Vec::new();
            for row in 0..rows / 4 {
                let mut values = sampling_logits(&mut rng, (row + batch) % 5, vocab);
                if row % 97 == 5 {
                    values[rng.next_u32() as usize % vocab] = f32::NAN;
                }
                logits.extend(values);
                let tau = match rng.next_u32() % 4 {
                    0 => 0,
                    1 => 1 << 10,
                    _ => 1 + rng.next_u32() % 10240,
                };
                let top_k = [0, 1, 2, 5, 50, vocab as u32 + 3][rng.next_u32() as usize % 6];
                let top_p = match rng.next_u32() % 3 {
                    0 => 1 << 24,
                    1 => 1 + rng.next_u32() % (1 << 24),
                    _ => 1 + rng.next_u32() % 4096,
                };
                let uncond = rng.next_u32().is_multiple_of(2).then(|| {
                    let gamma = [3 << 15, 10 << 16, 0, 1 + rng.next_u32() % (10 << 16)][rng.next_u32() as usize % 4];
                    (rng.next_u32() as usize % (rows / 4), gamma)
                });
                draws.push(Draw {
                    settings: ExactSettings {
                        tau,
                        top_k,
                        top_p,
                        random: rng.next_u32(),
                    },
                    forbidden: rng.next_u32() as usize % (vocab + 1),
                    cond: row,
                    uncond,
                });
            }
            let got = sampler.sample(gpu, &logits, &draws).unwrap();
            for (row, (draw, token)) in draws.iter().zip(&got).enumerate() {
                assert_eq!(
                    *token,
                    draw.on_host(&logits, vocab),
                    "vocab {vocab}, batch {batch}, draw {row}: {draw:?}"
                );
                distinct.insert((vocab, *token));
                compared += 1;
                guided += usize::from(draw.uncond.is_some());
            }
        }
    }
    eprintln!(
        "{compared} draws ({guided} guided) sampled alike on the GPU and the host ({} distinct tokens)",
        distinct.len()
    );
    assert_eq!(compared, (96 + 512 + 1024 + 256 + 256) / 4 * 8);
    assert!(guided > compared / 3, "{guided} guided draws of {compared}");
}
