//! How many kernel launches a step of the bench shape takes (`drama fixture --preset bench`:
//! hidden 2048, 24 layers, the first dense, 23 MoE layers keeping 128 of 256 experts, top-8,
//! a shared expert, routed experts in NVFP4). A launch that waits for the one before costs
//! a few microseconds on the GPUs measured (docs/performance.md) before it reads a byte, so
//! the count of those is part of the step's cost: a change that adds one per layer fails here.

mod common;

use common::{Names, bench_spec};
use drama_graph::drama3::{self, StepShape};
use drama_graph::plan::plan;
use drama_graph::select::{PIPELINE_ROWS, kernels_of};
use drama_graph::{Graph, Node, Op, ValueId};
use drama_kernels::{KeptCapacity, Kernel, LinearInput, WeightFormat};

/// A step of `rows` rows, for a device like Vulkan's (`vulkan`: launches that need no barrier
/// run beside the one before them, and storage barriers have device scope) or like Metal's
/// (neither).
fn bench_step(rows: usize, vulkan: bool) -> Graph {
    let lanes = rows.min(8);
    let shape = StepShape {
        rows,
        lanes,
        capacity: 4096,
        prefix_rows: lanes * 8,
        trace: false,
        concurrent_launches: vulkan,
        device_barriers: vulkan,
    };
    drama3::build(&bench_spec(), &Names, shape).expect("the bench shape builds")
}

/// A step's launches: those that wait for the launch before them, and those beside it.
fn launches(graph: &Graph) -> (Vec<Kernel>, Vec<Kernel>) {
    let (beside, waiting): (Vec<&Node>, Vec<&Node>) = graph.nodes.iter().partition(|n| n.op.runs_beside());
    let kernels = |nodes: Vec<&Node>| nodes.iter().flat_map(|n| kernels_of(&n.op)).collect();
    (kernels(waiting), kernels(beside))
}

/// The launches of a step whose rows all take attention a workgroup per head, and the count
/// of attention launches for rows that go by blocks of heads left out (the engine runs one
/// kind or both, by the rows' lengths: `Executable::launch_set`).
fn one_way(kernels: Vec<Kernel>) -> (Vec<Kernel>, usize) {
    let by_blocks = |k: &Kernel| matches!(k, Kernel::AttendBlocks | Kernel::AttendBlocksAndCombine);
    let left_out = kernels.iter().filter(|k| by_blocks(k)).count();
    (kernels.into_iter().filter(|k| !by_blocks(k)).collect(), left_out)
}

fn count(kernels: &[Kernel], kernel: Kernel) -> usize {
    kernels.iter().filter(|&&k| k == kernel).count()
}

#[test]
fn decode_steps_of_up_to_eight_rows_wait_on_nine_or_ten_launches_per_moe_layer() {
    for rows in [1, 2, 8] {
        // The shared expert's down projection beside the routed gate/up of each MoE layer,
        // and attention's chunks combined in its launch.
        let (waiting, beside) = launches(&bench_step(rows, true));
        let (waiting, by_blocks) = one_way(waiting);
        assert_eq!(by_blocks, 24, "{rows} rows");
        assert_eq!(waiting.len(), 217, "{rows} rows: {waiting:?}");
        // The step's rows from every table in one launch.
        assert_eq!(count(&waiting, Kernel::Embed), 1, "{rows} rows");
        assert_eq!(count(&waiting, Kernel::AttendAndCombine), 24, "{rows} rows");
        assert_eq!(count(&waiting, Kernel::Attend), 0, "{rows} rows");
        assert_eq!(count(&waiting, Kernel::AttendCombine), 0, "{rows} rows");
        assert_eq!(
            beside,
            vec![Kernel::Linear(WeightFormat::Bf16, LinearInput::F32); 23],
            "{rows} rows"
        );
        assert_eq!(count(&waiting, Kernel::Route(KeptCapacity::ALL[0])), 23, "{rows} rows");
        // ... or in routing's launch, where launches run one after another.
        let (serial, beside) = launches(&bench_step(rows, false));
        let (serial, by_blocks) = one_way(serial);
        assert_eq!(by_blocks, 24, "{rows} rows");
        assert_eq!(serial.len(), 241, "{rows} rows: {serial:?}");
        assert!(beside.is_empty(), "{rows} rows");
        assert_eq!(count(&serial, Kernel::AttendCombine), 24, "{rows} rows");
        assert_eq!(
            count(&serial, Kernel::RouteLinear(KeptCapacity::ALL[0])),
            23,
            "{rows} rows"
        );
        for kernels in [waiting, serial] {
            // A MoE layer's combine is the next norm's work.
            assert_eq!(count(&kernels, Kernel::CombineRmsNorm), 23, "{rows} rows");
            assert_eq!(count(&kernels, Kernel::GroupSlots), 0, "{rows} rows");
            assert_eq!(count(&kernels, Kernel::PackBf16), 0, "{rows} rows");
        }
    }
}

#[test]
fn steps_of_many_rows_group_their_slots_first() {
    // Each MoE layer groups its slots, and every layer packs two linear inputs as BF16
    // pairs (o_proj's, the routed or MLP down's); the norms, read only by linears, write
    // q/k/v's, the linear pair's or MLP's and the routed gate/up's, and the head's packed.
    let packs = 24 * 2;
    let (waiting, beside) = launches(&bench_step(256, true));
    let (waiting, by_blocks) = one_way(waiting);
    assert_eq!(by_blocks, 24);
    assert_eq!(count(&waiting, Kernel::GroupSlots), 23);
    assert_eq!(count(&waiting, Kernel::PackBf16), packs);
    assert_eq!(waiting.len(), 241 + 23 + packs);
    // Attention's chunks are combined by a launch of their own (see
    // `select::last_chunk_combines`).
    assert_eq!(count(&waiting, Kernel::AttendCombine), 24);
    // The shared expert's down projection beside the routed gate/up reads f32 (routing lists
    // the activation as the linear pair wrote it); every other linear reads pairs.
    assert_eq!(beside, vec![Kernel::Linear(WeightFormat::Bf16, LinearInput::F32); 23]);
    assert!(!waiting.iter().any(reads_f32));
    // One after another: routing and the shared expert's down projection each alone, the
    // latter reading pairs too (a pack more per MoE layer).
    let (serial, beside) = launches(&bench_step(256, false));
    let (serial, _) = one_way(serial);
    assert_eq!(count(&serial, Kernel::GroupSlots), 23);
    assert_eq!(count(&serial, Kernel::PackBf16), packs + 23);
    assert_eq!(serial.len(), 241 + 2 * 23 + packs + 23);
    assert!(beside.is_empty());
    assert!(!serial.iter().any(reads_f32));
}

/// Whether a dense linear launch reads its input as f32.
fn reads_f32(kernel: &Kernel) -> bool {
    matches!(
        kernel,
        Kernel::Linear(_, LinearInput::F32)
            | Kernel::LinearKv(_, LinearInput::F32)
            | Kernel::LinearPair(LinearInput::F32)
    )
}

/// What lets wgpu record no barrier before a linear that runs beside the launch before it:
/// its output's buffer is one no earlier node used, its input is listed by an earlier
/// routing node (whose barrier makes it visible), and no node in between writes that input.
#[test]
fn a_linear_beside_the_launch_before_it_needs_no_barrier_of_its_own() {
    for rows in [1, 8, 256] {
        let graph = bench_step(rows, true);
        let plan = plan(&graph);
        let buffer = |v: &ValueId| plan.value_buffer[v.0];
        let mut checked = 0;
        for (index, node) in graph.nodes.iter().enumerate().filter(|(_, n)| n.op.runs_beside()) {
            let earlier = &graph.nodes[..index];
            let output = buffer(&node.outputs[0]);
            assert!(
                earlier
                    .iter()
                    .all(|n| n.inputs.iter().chain(&n.outputs).all(|v| buffer(v) != output)),
                "{rows} rows: {} writes a buffer an earlier node used",
                node.label
            );
            let input = node.inputs[0];
            let lister = earlier
                .iter()
                .rposition(|n| matches!(n.op, Op::Router { .. }) && n.inputs.get(1) == Some(&input))
                .unwrap_or_else(|| panic!("{rows} rows: no routing lists the input of {}", node.label));
            assert!(
                earlier[lister + 1..]
                    .iter()
                    .all(|n| n.outputs.iter().all(|v| buffer(v) != buffer(&input))),
                "{rows} rows: a node between routing and {} writes its input's buffer",
                node.label
            );
            checked += 1;
        }
        assert_eq!(checked, 23, "{rows} rows");
    }
}

/// The steps whose pipelines the engine builds when it loads use every kernel that a step of
/// any size uses, so no step compiles a pipeline while it runs.
#[test]
fn pipeline_rows_cover_every_step_size() {
    for vulkan in [false, true] {
        let kernels = |rows| {
            let (waiting, beside) = launches(&bench_step(rows, vulkan));
            waiting.into_iter().chain(beside).collect::<Vec<Kernel>>()
        };
        let built: Vec<Kernel> = PIPELINE_ROWS.iter().flat_map(|&rows| kernels(rows)).collect();
        for rows in (1..=40).chain([64, 256]) {
            for kernel in kernels(rows) {
                assert!(
                    built.contains(&kernel),
                    "{rows} rows (Vulkan's form {vulkan}): {kernel:?} is not built at load"
                );
            }
        }
    }
}
