//! Kernel choice: which kernel entry points each op launches (one per linear member unless
//! the members are stacked; the engine adds one launch per weight segment when a weight is
//! split).

use drama_kernels::{Kernel, NORMED_LINEAR_MAX_ROWS, NORMED_LINEAR_MAX_WIDTH, PassRows, WeightFormat};

use crate::graph::Graph;
use crate::ir::{LinearMember, Op};

/// Whether [gate, up] members can be stacked with the SwiGLU computed in the linear's
/// epilogue: a stack (see [`stacks`]) without biases.
pub fn stacks_swiglu(members: &[LinearMember]) -> bool {
    members.len() == 2 && stacks(members) && !members[0].bias && members[0].out == members[1].out
}

/// Whether routed experts' gate and up projections can be stacked per expert with the
/// SwiGLU in the epilogue: one format, BF16 or NVFP4 (FP8's 128-row scale tiles do not
/// stack).
pub fn stacks_expert_swiglu(gate: WeightFormat, up: WeightFormat) -> bool {
    gate == up && matches!(gate, WeightFormat::Bf16 | WeightFormat::Nvfp4)
}

/// Whether a linear node's members are stacked into one weight and computed by one launch:
/// several BF16 members that all have a bias or all have none. (Quantized members keep a
/// launch each: their per-tensor or per-tile scales belong to one member.)
pub fn stacks(members: &[LinearMember]) -> bool {
    members.len() > 1
        && members
            .iter()
            .all(|m| m.format == WeightFormat::Bf16 && m.bias == members[0].bias)
}

/// Whether node `index` is an RMSNorm that the next node, a dense linear over its output,
/// computes in its first launch instead of a launch of its own ([`Kernel::LinearNormed`],
/// which also writes the normed rows for the norm's other readers): a BF16-rounded norm of
/// at most [`NORMED_LINEAR_MAX_ROWS`] rows, at most [`NORMED_LINEAR_MAX_WIDTH`] wide (a
/// multiple of 8). Larger steps keep the norm's launch; both give the same bits.
pub fn norm_fused_into_next(graph: &Graph, index: usize) -> bool {
    let Some(node) = graph.nodes.get(index) else {
        return false;
    };
    if !matches!(node.op, Op::RmsNorm { round_output: true, .. }) {
        return false;
    }
    let normed = node.outputs[0];
    let shape = &graph.value(normed).shape;
    let (rows, width) = (shape[0], shape[shape.len() - 1]);
    rows <= NORMED_LINEAR_MAX_ROWS
        && width <= NORMED_LINEAR_MAX_WIDTH
        && width.is_multiple_of(8)
        && graph
            .nodes
            .get(index + 1)
            .is_some_and(|next| matches!(next.op, Op::Linear { .. }) && next.inputs.first() == Some(&normed))
}

/// The kernels node `index` of `graph` launches, in order (before weight splitting): a norm
/// fused into the next linear launches nothing, and that linear's first launch normalizes.
pub fn node_kernels(graph: &Graph, index: usize) -> Vec<Kernel> {
    if norm_fused_into_next(graph, index) {
        return Vec::new();
    }
    let node = &graph.nodes[index];
    let rows = node.inputs.first().map_or(1, |&i| graph.value(i).shape[0]);
    let mut kernels = kernels_of(&node.op, rows);
    if index > 0
        && norm_fused_into_next(graph, index - 1)
        && let Some(first) = kernels.first_mut()
    {
        *first = match *first {
            Kernel::Linear(format, pass) => Kernel::LinearNormed(format, pass),
            Kernel::LinearKv(format, pass) => Kernel::LinearKvNormed(format, pass),
            other => other,
        };
    }
    kernels
}

/// The kernels an op launches, in order, for `rows` activation rows (which pick the dense
/// linears' pass width).
fn kernels_of(op: &Op, rows: usize) -> Vec<Kernel> {
    let pass = PassRows::for_rows(rows);
    match op {
        Op::Embed { .. } => vec![Kernel::EmbedF32, Kernel::EmbedBf16, Kernel::EmbedBf16],
        Op::RmsNorm { .. } => vec![Kernel::RmsNorm],
        Op::Linear {
            members, cache_write, ..
        } => {
            let kernel = |format| Kernel::dense_linear(format, pass, cache_write.is_some(), false);
            if stacks(members) {
                vec![kernel(WeightFormat::Bf16)]
            } else {
                members.iter().map(|m| kernel(m.format)).collect()
            }
        }
        Op::Attention { .. } => vec![Kernel::Attend, Kernel::AttendCombine],
        Op::Router(_) => vec![Kernel::Route],
        Op::Experts {
            projections,
            swiglu: true,
            ..
        } => vec![Kernel::Gathered(projections[0].1)],
        Op::Experts { projections, .. } => projections.iter().map(|(_, f)| Kernel::Gathered(*f)).collect(),
        Op::Swiglu { .. } => vec![Kernel::Swiglu],
        Op::MoeCombine { .. } => vec![Kernel::MoeCombine],
    }
}
