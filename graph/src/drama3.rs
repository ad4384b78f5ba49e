//! The Drama 3 model as a graph: [`plain`] builds what one step computes (any number of
//! token rows over any number of lanes: a prefill, a decode step, or both guidance lanes at
//! once), each op in its plainest form; [`build`] hands that to the passes
//! ([`crate::passes`]), which decide how it runs.

use std::collections::BTreeMap;

use drama_kernels::{LinearInput, LinearWidth, WeightFormat};
use serde::Serialize;

use crate::graph::{Graph, GraphBuilder, GraphError};
use crate::ir::{CacheWrite, DType, LinearMember, NormOutput, Op, Projection, RouterOp, ValueId, ValueKind};

/// Weight and tensor names the builder refers to; the engine's checkpoint table fills it.
pub trait WeightNames {
    /// A per-layer name from its template (`model.layers.{i}.self_attn.q_proj`).
    fn layer(&self, template: LayerWeight, layer: usize) -> String;
    /// A global tensor name.
    fn global(&self, which: GlobalWeight) -> String;
}

/// Per-layer weights the graph refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerWeight {
    /// Pre-attention norm.
    InputNorm,
    /// q projection module.
    Q,
    /// k projection module.
    K,
    /// v projection module.
    V,
    /// o projection module.
    O,
    /// Pre-MLP norm.
    PostNorm,
    /// Dense MLP gate/up/down modules.
    Dense(Projection),
    /// Router weight tensor.
    Router,
    /// Shared expert gate/up/down modules.
    Shared(Projection),
    /// Shared expert gate tensor.
    SharedGate,
}

/// Global weights the graph refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlobalWeight {
    /// Text embeddings.
    EmbedTokens,
    /// Audio embeddings.
    AudioEmbed,
    /// Final norm.
    FinalNorm,
    /// Audio head.
    AudioHead,
}

/// A MoE layer's routing description.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MoeSpec {
    /// Kept experts.
    pub kept: usize,
    /// Router logits per original id (else per kept expert).
    pub full_width_router: bool,
    /// Selection bias present.
    pub score_bias: bool,
    /// Formats of the routed experts' gate, up and down projections.
    pub expert_formats: [WeightFormat; 3],
}

/// Everything the builder needs to know about the model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    /// H.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Audio vocabulary (C + 2).
    pub audio_vocab: usize,
    /// Dense MLP width.
    pub dense_width: usize,
    /// Routed expert width.
    pub expert_width: usize,
    /// Shared expert width (0: none).
    pub shared_width: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Original expert count.
    pub num_experts: usize,
    /// Sigmoid routing (else softmax).
    pub sigmoid: bool,
    /// Renormalise chosen weights.
    pub norm_topk_prob: bool,
    /// Routed scaling factor.
    pub routed_scaling_factor: f32,
    /// Expert groups.
    pub n_group: usize,
    /// Groups kept.
    pub topk_group: usize,
    /// Per layer: `None` for dense layers.
    pub layers: Vec<Option<MoeSpec>>,
    /// Stored format of every linear module (absent: BF16).
    pub formats: BTreeMap<String, WeightFormat>,
}

/// The shape of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StepShape {
    /// Token rows processed.
    pub rows: usize,
    /// Cache slots (lanes) the KV caches hold.
    pub lanes: usize,
    /// Positions per cache slot.
    pub capacity: usize,
    /// Rows of the voice-prefix table (lanes * P).
    pub prefix_rows: usize,
    /// Keep every layer's hidden state and router output readable (for `drama trace`).
    pub trace: bool,
    /// The device runs a launch that needs no barrier beside the launch before it (wgpu's
    /// Vulkan and DX12 backends record barriers only where the bindings need them; its Metal
    /// and GL backends run every launch after the one before): independent work then gets
    /// launches of its own ([`Op::Linear`]'s `beside`) instead of sharing one.
    pub concurrent_launches: bool,
    /// WGSL's storage barriers order memory for the whole device (wgpu's Vulkan and DX12
    /// backends; on Metal and GL only within a workgroup), so the last workgroup of a launch
    /// to finish may read what the others wrote: attention's chunks are then combined by
    /// the last of each row's and head's to finish ([`Op::Attention`]'s
    /// `last_chunk_combines`), not by a launch of their own.
    pub device_barriers: bool,
}

/// Names of the host-written inputs, in the order the engine fills them. (The voice-prefix
/// table, `prefixes`, is session state like the KV caches: written when a prefix is set.)
pub const STEP_INPUTS: [&str; 4] = ["row_table", "row_index", "row_lane", "row_pos"];

/// Where an embedded row comes from (the values of `row_table`).
pub use drama_kernels::row_source;

/// Floats per position of a layer's key (or value) cache: each KV head in whole vec4s
/// ([`drama_kernels::head_stride`]), which is how attention reads them.
pub fn kv_cache_width(kv_heads: usize, head_dim: usize) -> usize {
    kv_heads * drama_kernels::head_stride(head_dim)
}

/// The graph of one step as it runs: the plain graph after every pass
/// ([`crate::passes::schedule`]).
pub fn build(spec: &ModelSpec, names: &dyn WeightNames, shape: StepShape) -> Result<Graph, GraphError> {
    crate::passes::schedule(plain(spec, names, shape)?, &shape)
}

/// The graph of one step as the model defines it: every linear reads f32 rows and computes
/// its own output, each SwiGLU and MoE combine is a node of its own, routing only routes,
/// and no op carries a choice of how it runs. (The [q|k|v] projection writes the step's
/// keys and values into the caches as the model's attention defines them.)
pub fn plain(spec: &ModelSpec, names: &dyn WeightNames, shape: StepShape) -> Result<Graph, GraphError> {
    let s = spec;
    let (h, rows) = (s.hidden, shape.rows);
    let mut g = Plain {
        b: GraphBuilder::default(),
        spec,
        trace: shape.trace,
    };
    let row_table = g.b.input("row_table", vec![rows], DType::U32, ValueKind::Input);
    let row_index = g.b.input("row_index", vec![rows], DType::U32, ValueKind::Input);
    let row_lane = g.b.input("row_lane", vec![rows], DType::U32, ValueKind::Input);
    let row_pos = g.b.input("row_pos", vec![rows], DType::U32, ValueKind::Input);
    let prefixes = g.b.input(
        "prefixes",
        vec![shape.prefix_rows.max(1), h],
        DType::F32,
        ValueKind::State,
    );
    let embed = Op::Embed {
        text: names.global(GlobalWeight::EmbedTokens),
        audio: names.global(GlobalWeight::AudioEmbed),
    };
    let mut x = g.b.node1("embed", embed, &[row_table, row_index, prefixes])?;
    let cache_shape = vec![shape.lanes * shape.capacity, kv_cache_width(s.kv_heads, s.head_dim)];
    let kv_width = s.kv_heads * s.head_dim;
    for (i, moe) in s.layers.iter().enumerate() {
        let l = |w: LayerWeight| names.layer(w, i);
        let at = |what: &str| format!("layers.{i}.{what}");
        let k_cache =
            g.b.input(&at("k_cache"), cache_shape.clone(), DType::F32, ValueKind::State);
        let v_cache =
            g.b.input(&at("v_cache"), cache_shape.clone(), DType::F32, ValueKind::State);
        let normed = g.norm(&at("input_norm"), x, l(LayerWeight::InputNorm))?;
        // The [q|k|v] projection, which also writes this step's keys and values into the caches.
        let members = g.members(&[
            (l(LayerWeight::Q), s.heads * s.head_dim, true),
            (l(LayerWeight::K), kv_width, true),
            (l(LayerWeight::V), kv_width, true),
        ]);
        let cache_write = Some(CacheWrite {
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: s.head_dim,
        });
        let qkv = g.b.node1(
            &at("qkv_proj"),
            plain_linear(members, h, true, false, cache_write),
            &[normed, row_lane, row_pos, k_cache, v_cache],
        )?;
        let attention = Op::Attention {
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: s.head_dim,
            round_output: true,
            last_chunk_combines: false,
        };
        let attended =
            g.b.node1(&at("attention"), attention, &[qkv, row_lane, row_pos, k_cache, v_cache])?;
        // The residual stream after attention: x + o_proj(attended).
        let o_proj = g.members(&[(l(LayerWeight::O), h, false)]);
        let stream = g.b.node1(
            &at("o_proj"),
            plain_linear(o_proj, s.heads * s.head_dim, true, true, None),
            &[attended, x],
        )?;
        let normed = g.norm(&at("post_norm"), stream, l(LayerWeight::PostNorm))?;
        x = match moe {
            None => {
                let [gate, up, down] =
                    [Projection::Gate, Projection::Up, Projection::Down].map(|p| l(LayerWeight::Dense(p)));
                let act = g.swiglu(&at("mlp"), normed, [gate, up], s.dense_width)?;
                let down = g.members(&[(down, h, false)]);
                g.b.node1(
                    &at("hidden"),
                    plain_linear(down, s.dense_width, true, true, None),
                    &[act, stream],
                )?
            }
            Some(moe) => moe_block(&mut g, names, i, moe, stream, normed)?,
        };
        if g.trace {
            g.b.output(x);
        }
    }
    let normed = g.norm("final_norm", x, names.global(GlobalWeight::FinalNorm))?;
    let head = g.members(&[(names.global(GlobalWeight::AudioHead), s.audio_vocab, false)]);
    let logits =
        g.b.node1("logits", plain_linear(head, h, false, false, None), &[normed])?;
    g.b.output(logits);
    Ok(g.b.finish())
}

/// A linear in its plain form: f32 input, its own launch, no SwiGLU.
fn plain_linear(
    members: Vec<LinearMember>,
    in_features: usize,
    round_output: bool,
    residual: bool,
    cache_write: Option<CacheWrite>,
) -> Op {
    Op::Linear {
        members,
        in_features,
        round_output,
        residual,
        swiglu: false,
        cache_write,
        beside: false,
        input: LinearInput::F32,
    }
}

/// The members of each linear of a step (each half of a linear pair and the linear beside
/// routing counting as one), in output-column order, and whether it computes a SwiGLU (the
/// same for every step shape): what the engine uploads, stacking the SwiGLU pairs and the
/// groups [`crate::select::stacks`] names.
pub fn linear_groups(spec: &ModelSpec, names: &dyn WeightNames) -> Result<Vec<(Vec<LinearMember>, bool)>, GraphError> {
    let shape = StepShape {
        rows: 1,
        lanes: 1,
        capacity: 1,
        prefix_rows: 1,
        trace: false,
        concurrent_launches: false,
        device_barriers: false,
    };
    let graph = build(spec, names, shape)?;
    Ok(graph
        .nodes
        .iter()
        .flat_map(|node| match &node.op {
            Op::Linear { members, swiglu, .. } => vec![(members.clone(), *swiglu)],
            Op::Router { linear: Some(half), .. } => vec![(half.members.clone(), half.swiglu)],
            Op::LinearPair { first, second, .. } => {
                [first, second].map(|half| (half.members.clone(), half.swiglu)).to_vec()
            }
            _ => Vec::new(),
        })
        .collect())
}

struct Plain<'a> {
    b: GraphBuilder,
    spec: &'a ModelSpec,
    trace: bool,
}

impl Plain<'_> {
    fn members(&self, members: &[(String, usize, bool)]) -> Vec<LinearMember> {
        members
            .iter()
            .map(|(weight, out, bias)| LinearMember {
                format: self.spec.formats.get(weight).copied().unwrap_or(WeightFormat::Bf16),
                weight: weight.clone(),
                out: *out,
                bias: *bias,
            })
            .collect()
    }

    /// The RMSNorm of `x`, rounded to BF16 (its readers are linears).
    fn norm(&mut self, label: &str, x: ValueId, weight: String) -> Result<ValueId, GraphError> {
        let op = Op::RmsNorm {
            weight,
            eps: self.spec.eps,
            output: NormOutput::Bf16,
        };
        self.b.node1(label, op, &[x])
    }

    /// silu(gate(x)) * up(x), rounded to BF16: the [gate | up] linear (`{label}.gate_up`),
    /// then the SwiGLU (`{label}.act`).
    fn swiglu(&mut self, label: &str, x: ValueId, modules: [String; 2], width: usize) -> Result<ValueId, GraphError> {
        let [gate, up] = modules;
        let members = self.members(&[(gate, width, false), (up, width, false)]);
        let in_features = *self.b.shape(x).last().unwrap_or(&0);
        let gate_up = self.b.node1(
            &format!("{label}.gate_up"),
            plain_linear(members, in_features, true, false, None),
            &[x],
        )?;
        self.b
            .node1(&format!("{label}.act"), Op::Swiglu { round_output: true }, &[gate_up])
    }
}

/// A MoE layer: router logits (with the shared expert's gate logit as the last column),
/// the shared expert, routing, the routed experts, and their combine into the residual
/// stream `x`, labelled `layers.{i}.hidden`.
fn moe_block(
    g: &mut Plain<'_>,
    names: &dyn WeightNames,
    i: usize,
    moe: &MoeSpec,
    x: ValueId,
    normed: ValueId,
) -> Result<ValueId, GraphError> {
    let s = g.spec;
    let l = |w: LayerWeight| names.layer(w, i);
    let at = |what: &str| format!("layers.{i}.{what}");
    let router_rows = if moe.full_width_router { s.num_experts } else { moe.kept };
    let shared = s.shared_width > 0;
    let mut members = vec![(l(LayerWeight::Router), router_rows, false)];
    if shared {
        members.push((l(LayerWeight::SharedGate), 1, false));
    }
    let members = g.members(&members);
    let logits = g.b.node1(
        &at("router_logits"),
        plain_linear(members, s.hidden, false, false, None),
        &[normed],
    )?;
    let [shared_gate, shared_up, shared_down] =
        [Projection::Gate, Projection::Up, Projection::Down].map(|p| l(LayerWeight::Shared(p)));
    let shared_act = if shared {
        Some(g.swiglu(&at("shared_expert"), normed, [shared_gate, shared_up], s.shared_width)?)
    } else {
        None
    };
    let route = RouterOp {
        layer: i,
        kept: moe.kept,
        k: s.top_k,
        sigmoid: s.sigmoid,
        full_width: moe.full_width_router,
        score_bias: moe.score_bias,
        norm_topk_prob: s.norm_topk_prob,
        scaling: s.routed_scaling_factor,
        n_group: s.n_group,
        topk_group: s.topk_group,
        group_size: s.num_experts / s.n_group.max(1),
        gate_column: shared,
    };
    let routed = g.b.node(&at("router"), Op::Router { route, linear: None }, &[logits])?;
    let (ids, weights) = (routed[0], routed[1]);
    if g.trace {
        g.b.output(ids);
        g.b.output(weights);
    }
    let experts = |projections: &[Projection], in_features: usize, out: usize| Op::Experts {
        layer: i,
        projections: projections
            .iter()
            .map(|&p| (p, moe.expert_formats[p as usize]))
            .collect(),
        out,
        in_features,
        k: s.top_k,
        swiglu: false,
        grouped: false,
        workgroup: LinearWidth::Standard,
    };
    let gate_up = experts(&[Projection::Gate, Projection::Up], s.hidden, s.expert_width);
    let gate_up = g.b.node1(&at("experts.gate_up"), gate_up, &[normed, ids])?;
    let act =
        g.b.node1(&at("experts.act"), Op::Swiglu { round_output: true }, &[gate_up])?;
    let shared_out = match shared_act {
        Some(act) => {
            let down = g.members(&[(shared_down, s.hidden, false)]);
            let linear = plain_linear(down, s.shared_width, true, false, None);
            Some(g.b.node1(&at("shared_expert.down"), linear, &[act])?)
        }
        None => None,
    };
    let down = experts(&[Projection::Down], s.expert_width, s.hidden);
    let down = g.b.node1(&at("experts.down"), down, &[act, ids])?;
    let mut inputs = vec![x, down, weights];
    if let Some(shared_out) = shared_out {
        inputs.extend([logits, shared_out]);
    }
    let combine = Op::MoeCombine { k: s.top_k, shared };
    g.b.node1(&at("hidden"), combine, &inputs)
}
