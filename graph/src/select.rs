//! Kernel choice: which kernel entry points each op launches (one per linear member unless
//! the members are stacked; the engine adds one launch per weight segment when a weight is
//! split, and launches a linear pair's halves apart when either half's weight is split).

use drama_kernels::{KeptCapacity, Kernel, LinearInput, LinearWidth, WeightFormat};

use crate::ir::{LinearMember, Op, PairHalf};

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

/// Steps of at least this many rows launch their routed experts over blocks of slots that
/// share an expert (after a [`Op::GroupSlots`] per layer): a prefill's slots share experts
/// many times over, a decode step's rarely, and the grouping costs a launch per layer and a
/// launch packing each linear's input. (Measured on the bench checkpoint: at 16 lanes the
/// decode step's own kernels were faster than the grouped ones, at 32 and 64 slower.)
pub const GROUPED_EXPERT_ROWS: usize = 24;

/// How a step's linears read their inputs: steps of [`GROUPED_EXPERT_ROWS`] rows or more as
/// BF16 pairs, packed by a launch of their own ([`Op::PackBf16`]) where they are made, half
/// the bytes and loads of f32 (the grouped routed experts always; the dense linears too,
/// except a MoE layer's shared-expert down projection where it runs beside the launch before
/// it, reading its input as routing lists it, as the linear pair wrote it; measured: a
/// markedly shorter prefill, the same bits). Decode steps keep f32: a pack is a launch more,
/// which a step of few rows does not earn back.
pub fn linear_input(rows: usize) -> LinearInput {
    if rows >= GROUPED_EXPERT_ROWS {
        LinearInput::Bf16Pairs
    } else {
        LinearInput::F32
    }
}

/// Whether a step of `rows` rows has attention's chunks combined by the last of each (row,
/// head)'s chunks to finish, in attention's launch ([`Op::Attention`]'s
/// `last_chunk_combines`), on a device with `device_barriers` (see
/// [`crate::drama3::StepShape::device_barriers`]): steps of fewer than
/// [`GROUPED_EXPERT_ROWS`] rows: a launch fewer per layer, the same bits. (Measured: decode
/// steps of every lane count shorter than with the combine a launch of its own, prefill longer;
/// grouped steps of 16 to 64 rows no shorter.)
pub fn last_chunk_combines(rows: usize, device_barriers: bool) -> bool {
    device_barriers && rows < GROUPED_EXPERT_ROWS
}

/// Step sizes whose kernels are every step's: one per choice a step's rows make
/// ([`expert_width`], [`routes_beside_linear`], [`GROUPED_EXPERT_ROWS`], [`linear_input`],
/// [`last_chunk_combines`]).
/// The engine builds their pipelines when it loads, so that no step compiles one while it
/// runs.
pub const PIPELINE_ROWS: [usize; 3] = [1, 8, GROUPED_EXPERT_ROWS];

/// The workgroup width of a step's routed-expert launches ([`crate::ir::Op::Experts`]):
/// narrow for one or two rows and for grouped steps, standard between. (Measured: 32
/// invocations against 64 shortened the one-lane and pair decode steps and the prefill's
/// grouped launches, but lengthened the eight-lane step's gathered launches; at four rows,
/// and grouped at 16 to 64 rows, the two widths measured the same.)
pub fn expert_width(rows: usize) -> LinearWidth {
    if rows <= 2 || rows >= GROUPED_EXPERT_ROWS {
        LinearWidth::Narrow
    } else {
        LinearWidth::Standard
    }
}

/// Whether a step of `rows` rows computes a MoE layer's shared-expert down projection in
/// routing's launch ([`crate::ir::Op::Router`]'s linear) for a layer of `kept` kept experts,
/// or launches the two apart. Beside routing, the linear's workgroups carry routing's
/// workgroup memory ([`KeptCapacity`]): about 5.6 KB each for up to 128 kept experts, 16 KB
/// for 512. One or two rows gain a launch per layer either way. Up to eight rows gain with
/// the smallest capacity (an eight-row decode step measured shorter than with the two apart)
/// but lost with the largest, and a 256-row prefill lost by far more with it.
pub fn routes_beside_linear(rows: usize, kept: usize) -> bool {
    let smallest = KeptCapacity::for_kept(kept) == Some(KeptCapacity::ALL[0]);
    rows <= 2 || (smallest && rows <= 8)
}

/// Whether a linear can share a launch with other work (a half of a
/// [`crate::ir::Op::LinearPair`], the linear of a [`crate::ir::Op::Router`]): every member
/// bias-free BF16 (so it is one weight or a stack of them), and a SwiGLU a
/// [`stacks_swiglu`] pair.
pub fn shares_launch(half: &PairHalf) -> bool {
    !half.members.is_empty()
        && half.members.iter().all(|m| m.format == WeightFormat::Bf16 && !m.bias)
        && (!half.swiglu || stacks_swiglu(&half.members))
}

/// Whether two linears over one input can share a launch ([`crate::ir::Op::LinearPair`]).
pub fn pairs(first: &PairHalf, second: &PairHalf) -> bool {
    shares_launch(first) && shares_launch(second)
}

/// The kernels an op launches, in order.
pub fn kernels_of(op: &Op) -> Vec<Kernel> {
    match op {
        Op::Embed { .. } => vec![Kernel::Embed],
        Op::RmsNorm { .. } => vec![Kernel::RmsNorm],
        Op::Linear {
            members,
            cache_write,
            input,
            ..
        } => {
            let kernel = |format| Kernel::dense_linear(format, cache_write.is_some(), *input);
            if stacks(members) {
                vec![kernel(WeightFormat::Bf16)]
            } else {
                members.iter().map(|m| kernel(m.format)).collect()
            }
        }
        Op::LinearPair { input, .. } => vec![Kernel::LinearPair(*input)],
        Op::Attention {
            heads,
            kv_heads,
            head_dim,
            last_chunk_combines,
            ..
        } => {
            let blocks = drama_kernels::attention_block_heads(*heads, *kv_heads, *head_dim) > 1;
            match (last_chunk_combines, blocks) {
                (true, true) => vec![Kernel::AttendAndCombine, Kernel::AttendBlocksAndCombine],
                (true, false) => vec![Kernel::AttendAndCombine],
                (false, true) => vec![Kernel::Attend, Kernel::AttendBlocks, Kernel::AttendCombine],
                (false, false) => vec![Kernel::Attend, Kernel::AttendCombine],
            }
        }
        Op::Router { route, linear } => {
            let capacity = KeptCapacity::for_kept(route.kept)
                .expect("shape inference refuses more kept experts than routing holds");
            match linear {
                Some(_) => vec![Kernel::RouteLinear(capacity)],
                None => vec![Kernel::Route(capacity)],
            }
        }
        Op::Experts {
            projections,
            swiglu,
            grouped,
            workgroup,
            ..
        } => {
            let kernel = |format| {
                if *grouped {
                    Kernel::GatheredGrouped(format, *workgroup)
                } else {
                    Kernel::Gathered(format, *workgroup)
                }
            };
            let launched = if *swiglu { &projections[..1] } else { &projections[..] };
            launched.iter().map(|(_, f)| kernel(*f)).collect()
        }
        Op::GroupSlots { .. } => vec![Kernel::GroupSlots],
        Op::Swiglu { .. } => vec![Kernel::Swiglu],
        Op::PackBf16 => vec![Kernel::PackBf16],
        Op::MoeCombineNorm { .. } => vec![Kernel::CombineRmsNorm],
        // The plain graph's combine: the passes compute it in the norm's launch.
        Op::MoeCombine { .. } => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Routing shares the shared down projection's launch at one or two rows always, and up
    /// to eight rows only when its arrays are the smallest (128 kept experts or fewer).
    #[test]
    fn routing_beside_the_linear_follows_rows_and_capacity() {
        for (rows, kept, beside) in [
            (1, 128, true),
            (2, 512, true),
            (8, 128, true),
            (8, 9, true),
            (9, 128, false),
            (3, 129, false),
            (8, 512, false),
            (256, 128, false),
        ] {
            assert_eq!(routes_beside_linear(rows, kept), beside, "{rows} rows, {kept} kept");
        }
    }

    /// The routed experts run narrow workgroups at one or two rows and in grouped steps,
    /// standard ones between, and the kernels an expert op launches carry that width.
    #[test]
    fn expert_width_follows_rows() {
        let narrow = [1, 2, GROUPED_EXPERT_ROWS, 256];
        let standard = [3, 8, GROUPED_EXPERT_ROWS - 1];
        for rows in narrow {
            assert_eq!(expert_width(rows), LinearWidth::Narrow, "{rows} rows");
        }
        for rows in standard {
            assert_eq!(expert_width(rows), LinearWidth::Standard, "{rows} rows");
        }
        let experts = |grouped, workgroup| Op::Experts {
            layer: 0,
            projections: vec![(crate::ir::Projection::Down, WeightFormat::Nvfp4)],
            out: 64,
            in_features: 32,
            k: 2,
            swiglu: false,
            grouped,
            workgroup,
        };
        assert_eq!(
            kernels_of(&experts(false, LinearWidth::Narrow)),
            [Kernel::Gathered(WeightFormat::Nvfp4, LinearWidth::Narrow)]
        );
        assert_eq!(
            kernels_of(&experts(true, LinearWidth::Standard)),
            [Kernel::GatheredGrouped(WeightFormat::Nvfp4, LinearWidth::Standard)]
        );
    }
}
