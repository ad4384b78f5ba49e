//! Kernel choice: which kernel entry points each op launches (one per linear member; the
//! engine adds one launch per weight segment when a weight is split).

use drama_kernels::Kernel;

use crate::ir::Op;

/// The kernels an op launches, in order.
pub fn kernels_of(op: &Op) -> Vec<Kernel> {
    match op {
        Op::Embed { .. } => vec![Kernel::EmbedF32, Kernel::EmbedBf16, Kernel::EmbedBf16],
        Op::RmsNorm { .. } => vec![Kernel::RmsNorm],
        Op::Linear { members, .. } => members.iter().map(|m| Kernel::Linear(m.format)).collect(),
        Op::RopeQ { .. } => vec![Kernel::RopeQ],
        Op::WriteKv { .. } => vec![Kernel::WriteKv],
        Op::Attention { .. } => vec![Kernel::Attend],
        Op::Router(_) => vec![Kernel::Route],
        Op::Experts { format, .. } => vec![Kernel::Gathered(*format)],
        Op::Swiglu { .. } => vec![Kernel::Swiglu],
        Op::Add => vec![Kernel::Add],
        Op::MoeCombine { .. } => vec![Kernel::MoeCombine],
    }
}
