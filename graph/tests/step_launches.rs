//! How many kernel launches a step of the bench shape takes (`drama fixture --preset bench`:
//! hidden 2048, 24 layers, the first dense, 23 MoE layers keeping 128 of 256 experts, top-8,
//! a shared expert, routed experts in NVFP4). Every launch of a decode step waits for the
//! one before (about 2.1 us each on an H200 before it reads a byte), so the count is part of
//! the step's cost: a change that adds a launch per layer fails here.

use std::collections::BTreeMap;

use drama_graph::drama3::{self, GlobalWeight, LayerWeight, ModelSpec, MoeSpec, StepShape, WeightNames};
use drama_graph::select::kernels_of;
use drama_kernels::{KeptCapacity, Kernel, WeightFormat};

struct Names;

impl WeightNames for Names {
    fn layer(&self, template: LayerWeight, layer: usize) -> String {
        format!("layers.{layer}.{template:?}")
    }

    fn global(&self, which: GlobalWeight) -> String {
        format!("{which:?}")
    }
}

fn bench_spec() -> ModelSpec {
    let moe = MoeSpec {
        kept: 128,
        full_width_router: false,
        score_bias: false,
        expert_formats: [WeightFormat::Nvfp4; 3],
    };
    ModelSpec {
        hidden: 2048,
        heads: 16,
        kv_heads: 4,
        head_dim: 128,
        eps: 1e-6,
        audio_vocab: 4098,
        dense_width: 6144,
        expert_width: 768,
        shared_width: 2048,
        top_k: 8,
        num_experts: 256,
        sigmoid: false,
        norm_topk_prob: true,
        routed_scaling_factor: 1.0,
        n_group: 1,
        topk_group: 1,
        layers: (0..24).map(|i| (i != 0).then(|| moe.clone())).collect(),
        formats: BTreeMap::new(),
    }
}

/// The kernels of a step of `rows` rows, in launch order.
fn step_kernels(rows: usize) -> Vec<Kernel> {
    let lanes = rows.min(8);
    let shape = StepShape {
        rows,
        lanes,
        capacity: 4096,
        prefix_rows: lanes * 8,
        trace: false,
    };
    let graph = drama3::build(&bench_spec(), &Names, shape).expect("the bench shape builds");
    graph.nodes.iter().flat_map(|node| kernels_of(&node.op)).collect()
}

fn count(kernels: &[Kernel], kernel: Kernel) -> usize {
    kernels.iter().filter(|&&k| k == kernel).count()
}

#[test]
fn decode_steps_of_up_to_eight_rows_take_ten_launches_per_moe_layer() {
    for rows in [1, 2, 8] {
        let kernels = step_kernels(rows);
        assert_eq!(kernels.len(), 243, "{rows} rows: {kernels:?}");
        // Routing shares the shared down projection's launch in every MoE layer, and the
        // layer's combine is the next norm's work.
        assert_eq!(
            count(&kernels, Kernel::RouteLinear(KeptCapacity::ALL[0])),
            23,
            "{rows} rows"
        );
        assert_eq!(count(&kernels, Kernel::CombineRmsNorm), 23, "{rows} rows");
        assert_eq!(count(&kernels, Kernel::GroupSlots), 0, "{rows} rows");
    }
}

#[test]
fn steps_of_many_rows_route_apart_and_group_their_slots() {
    let kernels = step_kernels(256);
    // Per MoE layer: routing on its own, and the slots grouped by expert first.
    assert_eq!(count(&kernels, Kernel::GroupSlots), 23);
    assert_eq!(count(&kernels, Kernel::RouteLinear(KeptCapacity::ALL[0])), 0);
    assert_eq!(kernels.len(), 243 + 2 * 23);
}
