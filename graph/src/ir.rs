//! The op IR: values with shapes and dtypes, and a closed set of typed ops. Each op infers
//! its output type from its inputs in one place ([`Op::infer`]), which also validates them.

use drama_kernels::{LinearInput, LinearWidth, WeightFormat};
use serde::Serialize;

/// Index of a value in [`Graph::values`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ValueId(pub usize);

/// Element type of a value. Activations are stored as f32 on the GPU; `Bf16` marks values
/// that are exactly representable in BF16 (what every linear input must be), and
/// `Bf16Pairs` BF16 values stored two to a 32-bit word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// Full FP32.
    F32,
    /// f32 storage holding BF16 values.
    Bf16,
    /// BF16 values two to a 32-bit word, the lower index in the low half (made by
    /// [`Op::PackBf16`]).
    #[serde(rename = "bf16_pairs")]
    Bf16Pairs,
    /// Unsigned integers (ids, positions).
    U32,
}

/// Where a value comes from and how long it lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueKind {
    /// Written by the host before each step.
    Input,
    /// Produced by a node.
    Activation,
    /// Persists across steps (KV caches): owned by the session, not the memory plan.
    State,
}

/// A typed value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Value {
    /// Readable name (`layers.3.attn_out`).
    pub name: String,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// Origin and lifetime.
    pub kind: ValueKind,
}

impl Value {
    /// Bytes the value occupies on the GPU: 4 per element, 2 for BF16 pairs.
    pub fn bytes(&self) -> u64 {
        let elements = self.shape.iter().product::<usize>() as u64;
        match self.dtype {
            DType::Bf16Pairs => 2 * elements,
            DType::F32 | DType::Bf16 | DType::U32 => 4 * elements,
        }
    }
}

/// How a norm ([`Op::RmsNorm`], [`Op::MoeCombineNorm`]) writes its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NormOutput {
    /// Full FP32.
    F32,
    /// Rounded to BF16 (all its readers are linears).
    Bf16,
    /// Rounded to BF16 and stored two to a word (all its readers are linears that read BF16
    /// pairs: no [`Op::PackBf16`] launch between).
    Bf16Pairs,
}

impl NormOutput {
    /// The output's element type.
    pub fn dtype(self) -> DType {
        match self {
            NormOutput::F32 => DType::F32,
            NormOutput::Bf16 => DType::Bf16,
            NormOutput::Bf16Pairs => DType::Bf16Pairs,
        }
    }
}

/// One linear of a [`Op::Linear`] group: its weights and where its outputs go.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinearMember {
    /// Weight name: a module (`model.layers.0.self_attn.k_proj`) or a plain 2-D tensor
    /// used as a bias-free BF16 linear (`audio_head.weight`).
    pub weight: String,
    /// Stored format.
    pub format: WeightFormat,
    /// Output features.
    pub out: usize,
    /// Whether a bias is added.
    pub bias: bool,
}

/// A linear that shares its launch with other work (a half of an [`Op::LinearPair`], or the
/// linear of an [`Op::Router`]): bias-free BF16 members (one weight, or several stacked as
/// [`Op::Linear`] stacks them) and what its output is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairHalf {
    /// The linears, in output-column order; with `swiglu`, [gate, up] of one width.
    pub members: Vec<LinearMember>,
    /// Round outputs to BF16.
    pub round_output: bool,
    /// The members are [gate, up]: the output is silu(gate) * up, one member wide.
    pub swiglu: bool,
}

impl PairHalf {
    /// Output features.
    pub fn width(&self) -> usize {
        if self.swiglu {
            self.members[0].out
        } else {
            self.members.iter().map(|m| m.out).sum()
        }
    }
}

/// Which projection of a routed expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Projection {
    /// gate_proj (input: the token's row).
    Gate,
    /// up_proj (input: the token's row).
    Up,
    /// down_proj (input: the slot's activation).
    Down,
}

/// Router parameters (contract section 5.3).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouterOp {
    /// Decoder layer (names the kept ids and bias).
    pub layer: usize,
    /// Kept experts.
    pub kept: usize,
    /// Experts per token.
    pub k: usize,
    /// Sigmoid (else softmax).
    pub sigmoid: bool,
    /// Logits are full width (one per original id).
    pub full_width: bool,
    /// Selection bias present.
    pub score_bias: bool,
    /// Renormalise chosen weights.
    pub norm_topk_prob: bool,
    /// Final factor.
    pub scaling: f32,
    /// Groups (1 = none).
    pub n_group: usize,
    /// Groups kept.
    pub topk_group: usize,
    /// Original ids per group.
    pub group_size: usize,
    /// The logits rows carry one extra last column (the shared expert's gate logit, computed
    /// by the same linear node), which routing skips.
    pub gate_column: bool,
}

/// The attention geometry a [q | k | v] projection writes the KV caches with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CacheWrite {
    /// Query heads (the width of the q part).
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
}

/// The closed set of operations.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Rows gathered from the text table, the audio table or the voice prefixes.
    /// Inputs: row_table, row_index, prefixes.
    Embed {
        /// Text embedding tensor.
        text: String,
        /// Audio embedding tensor.
        audio: String,
    },
    /// RMSNorm. Input: x.
    RmsNorm {
        /// Weight tensor.
        weight: String,
        /// Epsilon.
        eps: f32,
        /// How the output is written.
        output: NormOutput,
    },
    /// One or more linears over the same input, outputs side by side. Inputs: x (BF16),
    /// and with `residual` the residual stream (F32), added to the (rounded) outputs; with
    /// `cache_write` row_lane, row_pos, k_cache and v_cache.
    Linear {
        /// The linears, in output-column order.
        members: Vec<LinearMember>,
        /// Input features.
        in_features: usize,
        /// Round outputs to BF16 (false for router logits, gates and audio logits).
        round_output: bool,
        /// Add the second input to the outputs (the residual connection).
        residual: bool,
        /// The members are [gate, up] of one width, stacked: the output is
        /// silu(gate) * up, one member wide (see [`crate::select::stacks_swiglu`]).
        swiglu: bool,
        /// `Some`: the members are an attention layer's [q | k | v] projections, and the
        /// linear also writes each row's keys (rotated by RoPE at the row's position) and
        /// values into its lane's caches as it computes them.
        cache_write: Option<CacheWrite>,
        /// Runs beside the launch before it: it reads only values that an earlier node's
        /// launch lists among its bindings after their writer (see [`Op::Router`]), and its
        /// output gets a buffer no earlier node used (see [`crate::plan`]), so wgpu records
        /// no barrier before it and the GPU need not finish the launch before first.
        beside: bool,
        /// How the launch reads x: f32, or BF16 pairs ([`DType::Bf16Pairs`]).
        input: LinearInput,
    },
    /// Two linears over the same input computed by one launch, each with its own weight and
    /// output: a MoE layer's router logits (with the shared expert's gate logit) and its
    /// shared expert's SwiGLU activation (see [`crate::select::pairs`]). Input: x (BF16).
    /// Outputs: the first half's, then the second half's; each has the bits the half alone
    /// would have as an [`Op::Linear`].
    LinearPair {
        /// The linear computed by the first workgroups.
        first: PairHalf,
        /// The linear computed by the others.
        second: PairHalf,
        /// Input features.
        in_features: usize,
        /// How the launch reads x: f32, or BF16 pairs ([`DType::Bf16Pairs`]).
        input: LinearInput,
    },
    /// Causal grouped-query attention with RoPE of the queries. Inputs: [q|k|v] (q not yet
    /// rotated) as made by the linear that wrote this step's keys and values into the
    /// caches, row_lane, row_pos, k_cache, v_cache.
    Attention {
        /// Query heads.
        heads: usize,
        /// Key/value heads.
        kv_heads: usize,
        /// Head width.
        head_dim: usize,
        /// Round the output to BF16 (it feeds o_proj).
        round_output: bool,
        /// The chunks of each (row, head) are combined by the workgroup of the last to
        /// finish, in the same launch (the same bits; needs
        /// [`crate::drama3::StepShape::device_barriers`]), not by a launch of their own.
        last_chunk_combines: bool,
    },
    /// Top-k routing, and with `linear` an independent linear computed by the same launch (a
    /// MoE layer's shared-expert down projection, which reads nothing routing writes).
    /// Inputs: router logits, and optionally the linear's input (BF16): with `linear` the
    /// launch computes the linear too; without, routing only lists the input among its
    /// bindings for a linear that runs beside a later launch ([`Op::Linear`]'s `beside`), so
    /// that the barrier wgpu records before routing (which reads what the launch before it
    /// wrote) makes that input visible too. Outputs: ids (U32 [rows, k]), weights, and with
    /// `linear` its output; each has the bits of its own node.
    Router {
        /// The routing.
        route: RouterOp,
        /// The linear beside it (not a SwiGLU).
        linear: Option<PairHalf>,
    },
    /// A step's routed-expert slots grouped by expert, for [`Op::Experts`] with `grouped`.
    /// Input: ids (U32 [rows, k]). Outputs: blocks (U32 [slots / EXPERT_GROUP_SLOTS rounded
    /// up + experts, 4]: expert, first index into the order, count of up to
    /// EXPERT_GROUP_SLOTS slots, 0) and the order (U32 [slots, 1]: the slots expert by
    /// expert).
    GroupSlots {
        /// Kept experts of the layer (local ids are below this).
        experts: usize,
    },
    /// Routed-expert projections of one input, expert per slot read on the GPU, outputs
    /// side by side (gate and up together). Inputs: x (BF16 values, as f32 or as BF16
    /// pairs: the grouped kernels read pairs), ids, and with `grouped` the blocks and order
    /// of a [`Op::GroupSlots`].
    Experts {
        /// Decoder layer.
        layer: usize,
        /// The projections and their stored formats, in output-column order.
        projections: Vec<(Projection, WeightFormat)>,
        /// Output features per expert of each projection.
        out: usize,
        /// Input features.
        in_features: usize,
        /// Experts per token.
        k: usize,
        /// The projections are [gate, up], stacked per expert: the output is
        /// silu(gate) * up, `out` wide (see [`crate::select::stacks_expert_swiglu`]).
        swiglu: bool,
        /// Launched over blocks of slots that share an expert (the same bits as per slot;
        /// see [`crate::select::GROUPED_EXPERT_ROWS`]).
        grouped: bool,
        /// The launches' workgroup width (the same bits at every width; see
        /// [`crate::select::expert_width`]).
        workgroup: LinearWidth,
    },
    /// BF16 values packed two to a word (the linears of steps of many rows read their input
    /// so: half the bytes and loads). Input: x (BF16 rows of a width that is a multiple of
    /// 8). Output: the same values as [`DType::Bf16Pairs`].
    PackBf16,
    /// silu(gate) * up. Input: [gate | up] rows; output half as wide.
    Swiglu {
        /// Round to BF16 (feeds a down projection).
        round_output: bool,
    },
    /// A MoE layer's combine into the residual stream: h = residual + sum_j weight_j *
    /// routed_j (+ sigmoid(gate) * shared with `shared`), the experts in the router's order
    /// (ascending original id). Inputs as [`Op::MoeCombineNorm`]'s; output: h (F32). The
    /// plain graph's form: the passes compute it in the launch of the norm after it.
    MoeCombine {
        /// Experts per token.
        k: usize,
        /// The layer has a shared expert.
        shared: bool,
    },
    /// A MoE layer's combine into the residual stream, then the RMSNorm that follows it
    /// (the next layer's input norm, or the final norm) in the same launch:
    /// h = residual + sum_j weight_j * routed_j (+ sigmoid(gate) * shared with `shared`),
    /// the experts in the router's order (ascending original id). Inputs: residual (F32),
    /// the routed experts' outputs [rows * k, width], their weights [rows, k], and with
    /// `shared` the router logits (the shared expert's gate logit last) and the shared
    /// expert's output [rows, width]. Outputs: h (F32), then rmsnorm(h).
    MoeCombineNorm {
        /// Experts per token.
        k: usize,
        /// The layer has a shared expert.
        shared: bool,
        /// The norm's weight tensor.
        weight: String,
        /// The norm's epsilon.
        eps: f32,
        /// How the normed output is written.
        output: NormOutput,
    },
}

impl Op {
    /// Whether this is a linear that runs beside the launch before it (`beside`).
    pub fn runs_beside(&self) -> bool {
        matches!(self, Op::Linear { beside: true, .. })
    }

    /// Short name for dumps.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Embed { .. } => "embed",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Linear { .. } => "linear",
            Op::LinearPair { .. } => "linear_pair",
            Op::Attention { .. } => "attention",
            Op::Router { .. } => "router",
            Op::Experts { .. } => "experts",
            Op::GroupSlots { .. } => "group_slots",
            Op::PackBf16 => "pack_bf16",
            Op::Swiglu { .. } => "swiglu",
            Op::MoeCombine { .. } => "moe_combine",
            Op::MoeCombineNorm { .. } => "moe_combine_norm",
        }
    }
}
