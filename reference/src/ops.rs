//! FP64 reference of every op, written from the contract and independent of the kernels.
//! Matrices are row-major `Vec<f64>`. Where the contract rounds to BF16 the caller decides,
//! through [`Rounding`], whether the reference does too.

use drama_checkpoint::numerics::round_to_bf16;

/// Whether the reference rounds where the contract's numerics say "BF16".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// Round linear inputs and outputs to BF16 exactly where the contract does.
    Contract,
    /// Never round: pure FP64.
    Exact,
}

impl Rounding {
    /// Rounds `v` to BF16 under `Contract`, leaves it under `Exact`.
    pub fn bf16(self, v: f64) -> f64 {
        match self {
            Rounding::Contract => f64::from(round_to_bf16(v as f32)),
            Rounding::Exact => v,
        }
    }
}

/// A decoded weight matrix [out, in] with an optional bias.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    /// Output features (rows).
    pub out: usize,
    /// Input features (columns).
    pub in_: usize,
    /// Values, row-major.
    pub values: Vec<f64>,
    /// Bias [out].
    pub bias: Option<Vec<f64>>,
}

/// y = round?(round?(x) W^T + b) for `rows` rows of x. `round_output` is false for the
/// contract's FP32 outputs (router logits, shared-expert gate, audio head).
pub fn linear(x: &[f64], rows: usize, w: &Matrix, rounding: Rounding, round_output: bool) -> Vec<f64> {
    assert_eq!(x.len(), rows * w.in_);
    let mut y = vec![0.0; rows * w.out];
    for r in 0..rows {
        let input: Vec<f64> = x[r * w.in_..(r + 1) * w.in_]
            .iter()
            .map(|&v| rounding.bf16(v))
            .collect();
        for n in 0..w.out {
            let row = &w.values[n * w.in_..(n + 1) * w.in_];
            let mut acc: f64 = row.iter().zip(&input).map(|(a, b)| a * b).sum();
            if let Some(bias) = &w.bias {
                acc += bias[n];
            }
            y[r * w.out + n] = if round_output { rounding.bf16(acc) } else { acc };
        }
    }
    y
}

/// RMSNorm of each row: x / sqrt(mean(x^2) + eps) * w.
pub fn rms_norm(x: &[f64], width: usize, weight: &[f64], eps: f64) -> Vec<f64> {
    x.chunks(width)
        .flat_map(|row| {
            let mean = row.iter().map(|v| v * v).sum::<f64>() / width as f64;
            let inv = 1.0 / (mean + eps).sqrt();
            row.iter()
                .zip(weight)
                .map(move |(v, w)| v * inv * w)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// NeoX rotate-half RoPE of one head vector at `pos`, angle pos * theta^(-2i/d).
pub fn rope(head: &[f64], pos: usize, theta: f64) -> Vec<f64> {
    let d = head.len();
    let half = d / 2;
    let mut out = vec![0.0; d];
    for i in 0..half {
        let angle = pos as f64 * theta.powf(-2.0 * i as f64 / d as f64);
        let (s, c) = angle.sin_cos();
        out[i] = head[i] * c - head[i + half] * s;
        out[i + half] = head[i + half] * c + head[i] * s;
    }
    out
}

/// Causal grouped-query attention of one query (already rotated) against keys/values
/// (rotated keys) at positions 0..=len-1; returns heads * head_dim values.
pub fn attention(
    q: &[f64],
    keys: &[Vec<f64>],
    values: &[Vec<f64>],
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
) -> Vec<f64> {
    let group = heads / kv_heads;
    let scale = 1.0 / (head_dim as f64).sqrt();
    let mut out = vec![0.0; heads * head_dim];
    for h in 0..heads {
        let g = h / group;
        let qh = &q[h * head_dim..(h + 1) * head_dim];
        let scores: Vec<f64> = keys
            .iter()
            .map(|k| {
                qh.iter()
                    .zip(&k[g * head_dim..(g + 1) * head_dim])
                    .map(|(a, b)| a * b)
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = exps.iter().sum();
        for d in 0..head_dim {
            out[h * head_dim + d] = exps
                .iter()
                .zip(values)
                .map(|(e, v)| e * v[g * head_dim + d])
                .sum::<f64>()
                / total;
        }
    }
    out
}

/// silu(g) * u.
pub fn swiglu(gate: f64, up: f64) -> f64 {
    gate / (1.0 + (-gate).exp()) * up
}

/// sigmoid(v).
pub fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// How a router scores and picks (contract section 5.3).
#[derive(Debug, Clone, PartialEq)]
pub struct RouterSpec {
    /// Sigmoid (true) or softmax (false).
    pub sigmoid: bool,
    /// Experts per token.
    pub k: usize,
    /// Renormalise chosen weights.
    pub norm_topk_prob: bool,
    /// Final factor.
    pub routed_scaling_factor: f64,
    /// Original experts.
    pub num_experts: usize,
    /// Groups (1 = none).
    pub n_group: usize,
    /// Groups kept.
    pub topk_group: usize,
}

/// Routes one token. `logits_by_id[e]` is the router logit of ORIGINAL id e (entries of
/// pruned ids are ignored: they are masked out before any softmax), `bias_by_id` the optional
/// selection bias. Returns (original id, weight) pairs in ascending id order.
pub fn route(spec: &RouterSpec, kept: &[usize], logits_by_id: &[f64], bias_by_id: Option<&[f64]>) -> Vec<(usize, f64)> {
    route_with_margin(spec, kept, logits_by_id, bias_by_id).0
}

/// [`route`], plus the decision margin: the gap between the last chosen and the first
/// rejected ranking score, of experts and (with groups) of groups (infinite when nothing was
/// rejected). A GPU whose f32 arithmetic
/// differs from this FP64 reference by less than the margin must make the same choice.
pub fn route_with_margin(
    spec: &RouterSpec,
    kept: &[usize],
    logits_by_id: &[f64],
    bias_by_id: Option<&[f64]>,
) -> (Vec<(usize, f64)>, f64) {
    route_choosing(spec, kept, logits_by_id, bias_by_id, None)
}

/// [`route_with_margin`], with the chosen experts imposed (`forced`, original ids) instead of
/// ranked: their weights are computed exactly as for a ranked choice. Tests use it to follow
/// a GPU through a reference near-tie, so the rest of a trace stays comparable.
pub fn route_choosing(
    spec: &RouterSpec,
    kept: &[usize],
    logits_by_id: &[f64],
    bias_by_id: Option<&[f64]>,
    forced: Option<&[usize]>,
) -> (Vec<(usize, f64)>, f64) {
    let mut masked = vec![f64::NEG_INFINITY; spec.num_experts];
    for &e in kept {
        masked[e] = logits_by_id[e];
    }
    // weight[e] is the value that becomes the routing weight; choice[e] ranks.
    let (weight, choice): (Vec<f64>, Vec<f64>) = if spec.sigmoid {
        let s: Vec<f64> = masked
            .iter()
            .map(|&l| if l.is_finite() { sigmoid(l) } else { f64::NAN })
            .collect();
        let c = s
            .iter()
            .enumerate()
            .map(|(e, v)| v + bias_by_id.map_or(0.0, |b| b[e]))
            .collect();
        (s, c)
    } else {
        let max = masked.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let exps: Vec<f64> = masked.iter().map(|l| (l - max).exp()).collect();
        let total: f64 = exps.iter().sum();
        let p: Vec<f64> = exps.iter().map(|e| e / total).collect();
        (p.clone(), p)
    };
    let mut candidates: Vec<usize> = kept.to_vec();
    let mut group_margin = f64::INFINITY;
    if spec.sigmoid && spec.n_group > 1 {
        let size = spec.num_experts / spec.n_group;
        let mut groups: Vec<(usize, f64)> = (0..spec.n_group)
            .filter_map(|g| {
                let mut scores: Vec<f64> = kept.iter().filter(|&&e| e / size == g).map(|&e| choice[e]).collect();
                if scores.is_empty() {
                    return None;
                }
                scores.sort_by(|a, b| b.total_cmp(a));
                Some((g, scores.iter().take(2).sum()))
            })
            .collect();
        // Best score first; ties toward the lower group index.
        groups.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if let (Some(last), Some(next)) = (groups.get(spec.topk_group - 1), groups.get(spec.topk_group)) {
            group_margin = last.1 - next.1;
        }
        let chosen: Vec<usize> = groups.iter().take(spec.topk_group).map(|g| g.0).collect();
        candidates.retain(|e| chosen.contains(&(e / size)));
    }
    // Best choice first; ties toward the lower original id.
    candidates.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
    let margin = match (candidates.get(spec.k - 1), candidates.get(spec.k)) {
        (Some(&last), Some(&next)) => choice[last] - choice[next],
        _ => f64::INFINITY,
    }
    .min(group_margin);
    let chosen: Vec<usize> = match forced {
        Some(ids) => ids.to_vec(),
        None => candidates.iter().take(spec.k).copied().collect(),
    };
    let mut picked: Vec<(usize, f64)> = chosen.iter().map(|&e| (e, weight[e])).collect();
    if spec.norm_topk_prob {
        let sum: f64 = picked.iter().map(|p| p.1).sum();
        for p in &mut picked {
            p.1 /= sum;
        }
    }
    for p in &mut picked {
        p.1 *= spec.routed_scaling_factor;
    }
    picked.sort_by_key(|p| p.0);
    (picked, margin)
}
