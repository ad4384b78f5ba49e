//! The whole Drama 3 backbone forward in FP64 (contract section 5), for teacher-forced
//! comparisons: every layer's hidden states, every MoE layer's router choices, the logits.

use std::collections::BTreeMap;

use super::ops::{self, Matrix, Rounding, RouterSpec};
use super::weights;
use drama_checkpoint::config::ScoringFunc;
use drama_checkpoint::{Checkpoint, LayerMlp, ModelConfig, RouterWidth, names};

struct Moe {
    kept: Vec<usize>,
    /// Router logits are computed for these rows; `router_row_ids[i]` is row i's original id.
    router: Matrix,
    router_row_ids: Vec<usize>,
    /// Selection bias by original id.
    score_bias: Option<Vec<f64>>,
    experts: BTreeMap<usize, [Matrix; 3]>,
    shared: Option<([Matrix; 3], Matrix)>,
}

enum Mlp {
    Dense([Matrix; 3]),
    Moe(Box<Moe>),
}

struct Layer {
    input_norm: Vec<f64>,
    q: Matrix,
    k: Matrix,
    v: Matrix,
    o: Matrix,
    post_norm: Vec<f64>,
    mlp: Mlp,
}

/// The backbone decoded to f64.
pub struct ReferenceModel {
    config: ModelConfig,
    embed_tokens: Vec<f64>,
    audio_embed: Vec<f64>,
    layers: Vec<Layer>,
    final_norm: Vec<f64>,
    audio_head: Matrix,
}

/// The (original id, weight) pairs chosen for one token, in ascending id order.
pub type TokenRoute = Vec<(usize, f64)>;

/// Experts imposed at (layer, position), original ids.
pub type ForcedRoutes = std::collections::HashMap<(usize, usize), Vec<usize>>;

/// Every position's experts as another implementation chose them, to be imposed: each
/// layer's chosen original ids, `k` a position in position order (None for a dense layer).
pub fn forced_routes<'a>(layers: impl IntoIterator<Item = Option<&'a [u32]>>, k: usize) -> ForcedRoutes {
    let mut forced = ForcedRoutes::new();
    for (layer, ids) in layers.into_iter().enumerate() {
        for (pos, chosen) in ids.unwrap_or_default().chunks(k).enumerate() {
            forced.insert((layer, pos), chosen.iter().map(|&e| e as usize).collect());
        }
    }
    forced
}

/// A MoE layer's routing over a sequence: chosen experts and decision margins per position.
type LayerRoutes = (Vec<TokenRoute>, Vec<f64>);

/// What a teacher-forced forward produces.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceTrace {
    /// Sequence length S.
    pub positions: usize,
    /// Residual stream after each layer, [S, H] each.
    pub hidden: Vec<Vec<f64>>,
    /// For MoE layers: per position, the chosen (original id, weight) pairs in ascending id order.
    pub routes: Vec<Option<Vec<TokenRoute>>>,
    /// For MoE layers: per position, the decision margin (see [`ops::route_with_margin`]).
    pub margins: Vec<Option<Vec<f64>>>,
    /// Logits at every position, [S, C + 2].
    pub logits: Vec<f64>,
}

fn mlp_triple(checkpoint: &Checkpoint, templates: [&str; 3], i: usize, e: Option<usize>) -> [Matrix; 3] {
    templates.map(|t| {
        let module = match e {
            Some(e) => names::expert(t, i, e),
            None => names::layer(t, i),
        };
        weights::linear(checkpoint, &module)
    })
}

impl ReferenceModel {
    /// Decodes every backbone weight of a validated checkpoint.
    pub fn load(checkpoint: &Checkpoint) -> Self {
        let config = checkpoint.config.clone();
        let h = config.hidden_size;
        let layers = checkpoint
            .layers
            .iter()
            .enumerate()
            .map(|(i, mlp)| {
                let linear = |t: &str| weights::linear(checkpoint, &names::layer(t, i));
                let mlp = match mlp {
                    LayerMlp::Dense => Mlp::Dense(mlp_triple(checkpoint, names::DENSE_MLP, i, None)),
                    LayerMlp::Moe(moe) => {
                        let router_values = weights::values(checkpoint, &names::layer(names::ROUTER, i));
                        let rows = router_values.len() / h;
                        let router_row_ids = match moe.router_width {
                            RouterWidth::Compact => moe.kept_expert_ids.clone(),
                            RouterWidth::Full => (0..rows).collect(),
                        };
                        let router = Matrix {
                            out: rows,
                            in_: h,
                            values: router_values,
                            bias: None,
                        };
                        let score_bias = moe.has_score_bias.then(|| {
                            let stored = weights::values(checkpoint, &names::layer(names::ROUTER_BIAS, i));
                            let mut by_id = vec![0.0; config.num_experts];
                            for (row, &id) in router_row_ids.iter().enumerate() {
                                by_id[id] = stored[row];
                            }
                            by_id
                        });
                        let experts = moe
                            .kept_expert_ids
                            .iter()
                            .map(|&e| (e, mlp_triple(checkpoint, names::EXPERT, i, Some(e))))
                            .collect();
                        let shared = (config.shared_expert_intermediate_size > 0).then(|| {
                            let gate = Matrix {
                                out: 1,
                                in_: h,
                                values: weights::values(checkpoint, &names::layer(names::SHARED_EXPERT_GATE, i)),
                                bias: None,
                            };
                            (mlp_triple(checkpoint, names::SHARED_EXPERT, i, None), gate)
                        });
                        Mlp::Moe(Box::new(Moe {
                            kept: moe.kept_expert_ids.clone(),
                            router,
                            router_row_ids,
                            score_bias,
                            experts,
                            shared,
                        }))
                    }
                };
                Layer {
                    input_norm: weights::values(checkpoint, &names::layer(names::INPUT_NORM, i)),
                    q: linear(names::Q_PROJ),
                    k: linear(names::K_PROJ),
                    v: linear(names::V_PROJ),
                    o: linear(names::O_PROJ),
                    post_norm: weights::values(checkpoint, &names::layer(names::POST_ATTN_NORM, i)),
                    mlp,
                }
            })
            .collect();
        ReferenceModel {
            embed_tokens: weights::values(checkpoint, names::EMBED_TOKENS),
            audio_embed: weights::values(checkpoint, names::AUDIO_EMBED),
            final_norm: weights::values(checkpoint, names::FINAL_NORM),
            audio_head: Matrix {
                out: config.speech.audio_vocab_size,
                in_: h,
                values: weights::values(checkpoint, names::AUDIO_HEAD),
                bias: None,
            },
            layers,
            config,
        }
    }

    /// The input rows of a sequence: the prefix rows, the text embeddings, then the audio
    /// embeddings of `audio` (which starts with audio_bos).
    pub fn embed(&self, prefix: &[f64], text: &[u32], audio: &[u32]) -> Vec<f64> {
        let h = self.config.hidden_size;
        let mut rows = prefix.to_vec();
        for &t in text {
            rows.extend_from_slice(&self.embed_tokens[t as usize * h..(t as usize + 1) * h]);
        }
        for &a in audio {
            rows.extend_from_slice(&self.audio_embed[a as usize * h..(a as usize + 1) * h]);
        }
        rows
    }

    /// Runs the backbone over `inputs` ([S, H] rows at positions 0..S).
    pub fn forward(&self, inputs: &[f64], rounding: Rounding) -> ReferenceTrace {
        self.forward_routed(inputs, rounding, &ForcedRoutes::new())
    }

    /// [`ReferenceModel::forward`], with the experts of some (layer, position) imposed (see
    /// [`ops::route_choosing`]).
    pub fn forward_routed(&self, inputs: &[f64], rounding: Rounding, forced: &ForcedRoutes) -> ReferenceTrace {
        let c = &self.config;
        let h = c.hidden_size;
        let s = inputs.len() / h;
        let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let mut x = inputs.to_vec();
        let mut hidden = Vec::new();
        let mut routes = Vec::new();
        let mut margins = Vec::new();
        for (index, layer) in self.layers.iter().enumerate() {
            let normed = ops::rms_norm(&x, h, &layer.input_norm, c.rms_norm_eps);
            let q = ops::linear(&normed, s, &layer.q, rounding, true);
            let k = ops::linear(&normed, s, &layer.k, rounding, true);
            let v = ops::linear(&normed, s, &layer.v, rounding, true);
            let rotate = |m: &[f64], heads: usize, pos: usize| -> Vec<f64> {
                (0..heads)
                    .flat_map(|head| {
                        ops::rope(
                            &m[(pos * heads + head) * hd..(pos * heads + head + 1) * hd],
                            pos,
                            c.rope_theta,
                        )
                    })
                    .collect()
            };
            let keys: Vec<Vec<f64>> = (0..s).map(|pos| rotate(&k, nkv, pos)).collect();
            let values: Vec<Vec<f64>> = (0..s)
                .map(|pos| v[pos * nkv * hd..(pos + 1) * nkv * hd].to_vec())
                .collect();
            let mut attended = Vec::with_capacity(s * nh * hd);
            for pos in 0..s {
                let qr = rotate(&q, nh, pos);
                let out = ops::attention(&qr, &keys[..=pos], &values[..=pos], nh, nkv, hd);
                attended.extend(out.into_iter().map(|v| rounding.bf16(v)));
            }
            let o = ops::linear(&attended, s, &layer.o, rounding, true);
            for (xi, oi) in x.iter_mut().zip(&o) {
                *xi += oi;
            }
            let normed = ops::rms_norm(&x, h, &layer.post_norm, c.rms_norm_eps);
            let (mlp_out, layer_routes) = self.mlp(&layer.mlp, &normed, s, rounding, |pos| forced.get(&(index, pos)));
            let (layer_routes, layer_margins) = match layer_routes {
                Some((r, m)) => (Some(r), Some(m)),
                None => (None, None),
            };
            margins.push(layer_margins);
            for (xi, mi) in x.iter_mut().zip(&mlp_out) {
                *xi += mi;
            }
            hidden.push(x.clone());
            routes.push(layer_routes);
        }
        let normed = ops::rms_norm(&x, h, &self.final_norm, c.rms_norm_eps);
        let logits = ops::linear(&normed, s, &self.audio_head, rounding, false);
        ReferenceTrace {
            positions: s,
            hidden,
            routes,
            margins,
            logits,
        }
    }

    fn swiglu_mlp(triple: &[Matrix; 3], x: &[f64], rows: usize, rounding: Rounding) -> Vec<f64> {
        let gate = ops::linear(x, rows, &triple[0], rounding, true);
        let up = ops::linear(x, rows, &triple[1], rounding, true);
        let act: Vec<f64> = gate.iter().zip(&up).map(|(&g, &u)| ops::swiglu(g, u)).collect();
        ops::linear(&act, rows, &triple[2], rounding, true)
    }

    fn mlp<'f>(
        &self,
        mlp: &Mlp,
        x: &[f64],
        rows: usize,
        rounding: Rounding,
        forced: impl Fn(usize) -> Option<&'f Vec<usize>>,
    ) -> (Vec<f64>, Option<LayerRoutes>) {
        let c = &self.config;
        let h = c.hidden_size;
        match mlp {
            Mlp::Dense(triple) => (Self::swiglu_mlp(triple, x, rows, rounding), None),
            Mlp::Moe(moe) => {
                let spec = RouterSpec {
                    sigmoid: c.router.scoring_func == ScoringFunc::Sigmoid,
                    k: c.num_experts_per_tok,
                    norm_topk_prob: c.router.norm_topk_prob,
                    routed_scaling_factor: c.router.routed_scaling_factor,
                    num_experts: c.num_experts,
                    n_group: c.router.n_group,
                    topk_group: c.router.topk_group,
                };
                let logits = ops::linear(x, rows, &moe.router, rounding, false);
                let mut out = vec![0.0; rows * h];
                let mut token_routes = Vec::with_capacity(rows);
                let mut token_margins = Vec::with_capacity(rows);
                for r in 0..rows {
                    let mut by_id = vec![f64::NEG_INFINITY; c.num_experts];
                    for (row, &id) in moe.router_row_ids.iter().enumerate() {
                        by_id[id] = logits[r * moe.router.out + row];
                    }
                    let imposed = forced(r).map(Vec::as_slice);
                    let (chosen, margin) =
                        ops::route_choosing(&spec, &moe.kept, &by_id, moe.score_bias.as_deref(), imposed);
                    token_margins.push(margin);
                    let xr = &x[r * h..(r + 1) * h];
                    let acc = &mut out[r * h..(r + 1) * h];
                    for &(e, w) in &chosen {
                        let y = Self::swiglu_mlp(&moe.experts[&e], xr, 1, rounding);
                        for (a, yi) in acc.iter_mut().zip(&y) {
                            *a += w * yi;
                        }
                    }
                    if let Some((triple, gate)) = &moe.shared {
                        let g = ops::sigmoid(ops::linear(xr, 1, gate, rounding, false)[0]);
                        let y = Self::swiglu_mlp(triple, xr, 1, rounding);
                        for (a, yi) in acc.iter_mut().zip(&y) {
                            *a += g * yi;
                        }
                    }
                    token_routes.push(chosen);
                }
                (out, Some((token_routes, token_margins)))
            }
        }
    }
}
