//! The plain graph and each pass on its own: what a pass changes, what it leaves, and that
//! the graph stays valid after it.

mod common;

use common::{Names, bench_spec, small_spec};
use drama_graph::drama3::{ModelSpec, StepShape, plain};
use drama_graph::passes::{PASSES, check, pass};
use drama_graph::select::GROUPED_EXPERT_ROWS;
use drama_graph::{Graph, NormOutput, Op};
use drama_kernels::{LinearInput, LinearWidth, WeightFormat};

fn shape(rows: usize, vulkan: bool) -> StepShape {
    StepShape {
        rows,
        lanes: rows,
        capacity: 128,
        prefix_rows: rows * 8,
        trace: false,
        concurrent_launches: vulkan,
        device_barriers: vulkan,
    }
}

/// The plain graph of `spec` after the passes named, in order.
fn after(spec: &ModelSpec, step: StepShape, passes: &[&str]) -> Graph {
    let mut graph = plain(spec, &Names, step).expect("the plain graph builds");
    for name in passes {
        pass(name).unwrap_or_else(|| panic!("no pass {name}"))(&mut graph, &step);
        check(&graph).unwrap_or_else(|e| panic!("after {name}: {e}"));
    }
    graph
}

fn node<'a>(graph: &'a Graph, label: &str) -> &'a Op {
    &graph
        .nodes
        .iter()
        .find(|n| n.label == label)
        .unwrap_or_else(|| panic!("no node {label}"))
        .op
}

fn labels(graph: &Graph) -> Vec<&str> {
    graph.nodes.iter().map(|n| n.label.as_str()).collect()
}

fn output_names(graph: &Graph, label: &str) -> Vec<String> {
    let node = graph.nodes.iter().find(|n| n.label == label).expect("the node");
    node.outputs.iter().map(|&o| graph.value(o).name.clone()).collect()
}

/// The plain graph carries no choice of how it runs: every linear reads f32 in a launch of
/// its own, SwiGLUs and combines are nodes of their own, routing only routes.
#[test]
fn the_plain_graph_makes_no_schedule_choice() {
    for rows in [1, 256] {
        let graph = after(&bench_spec(), shape(rows, true), &[]);
        for n in &graph.nodes {
            match &n.op {
                Op::Linear {
                    swiglu, beside, input, ..
                } => assert!(!swiglu && !beside && *input == LinearInput::F32, "{}", n.label),
                Op::Experts {
                    swiglu,
                    grouped,
                    workgroup,
                    ..
                } => assert!(
                    !swiglu && !grouped && *workgroup == LinearWidth::Standard,
                    "{}",
                    n.label
                ),
                Op::Attention {
                    last_chunk_combines, ..
                } => assert!(!last_chunk_combines),
                Op::Router { linear, .. } => assert!(linear.is_none() && n.inputs.len() == 1),
                Op::LinearPair { .. } | Op::MoeCombineNorm { .. } | Op::GroupSlots { .. } | Op::PackBf16 => {
                    panic!("{}: {} is a schedule's", n.label, n.op.name())
                }
                _ => {}
            }
        }
        let count = |name: &str| graph.nodes.iter().filter(|n| n.op.name() == name).count();
        // A SwiGLU per dense layer, and two per MoE layer (shared and routed).
        assert_eq!(count("swiglu"), 1 + 2 * 23);
        assert_eq!(count("moe_combine"), 23);
    }
}

/// Stackable [gate, up] linears and routed experts compute their SwiGLU in the epilogue:
/// one node, labelled as the SwiGLU was, writing its output. FP8 experts keep theirs apart.
#[test]
fn stack_swiglu_folds_each_stackable_swiglu_into_its_linear() {
    let graph = after(&small_spec(WeightFormat::Nvfp4), shape(1, false), &["stack_swiglu"]);
    assert!(!graph.nodes.iter().any(|n| matches!(n.op, Op::Swiglu { .. })));
    assert!(matches!(
        node(&graph, "layers.0.mlp.act"),
        Op::Linear { swiglu: true, .. }
    ));
    assert!(matches!(
        node(&graph, "layers.1.shared_expert.act"),
        Op::Linear { swiglu: true, .. }
    ));
    assert!(matches!(
        node(&graph, "layers.1.experts.act"),
        Op::Experts { swiglu: true, .. }
    ));
    assert!(!labels(&graph).iter().any(|l| l.ends_with("gate_up")));
    assert_eq!(output_names(&graph, "layers.0.mlp.act"), ["layers.0.mlp.act"]);
    let fp8 = after(&small_spec(WeightFormat::Fp8Block), shape(1, false), &["stack_swiglu"]);
    assert!(matches!(
        node(&fp8, "layers.1.experts.gate_up"),
        Op::Experts { swiglu: false, .. }
    ));
    assert!(matches!(node(&fp8, "layers.1.experts.act"), Op::Swiglu { .. }));
}

/// The router logits and the shared expert's stacked SwiGLU, over the same row, share one
/// launch; with the shared expert in NVFP4 (its own launches), they do not.
#[test]
fn pair_linears_pairs_the_router_logits_with_the_shared_expert() {
    let spec = small_spec(WeightFormat::Nvfp4);
    let graph = after(&spec, shape(1, false), &["stack_swiglu", "pair_linears"]);
    assert!(matches!(node(&graph, "layers.1.router_logits"), Op::LinearPair { .. }));
    assert_eq!(
        output_names(&graph, "layers.1.router_logits"),
        ["layers.1.router_logits", "layers.1.router_logits.1"]
    );
    assert!(!labels(&graph).contains(&"layers.1.shared_expert.act"));
    assert_eq!(
        graph
            .nodes
            .iter()
            .filter(|n| matches!(n.op, Op::LinearPair { .. }))
            .count(),
        1
    );
    let mut quantized = spec.clone();
    for projection in ["Gate", "Up"] {
        quantized
            .formats
            .insert(format!("layers.1.Shared({projection})"), WeightFormat::Nvfp4);
    }
    let apart = after(&quantized, shape(1, false), &["stack_swiglu", "pair_linears"]);
    assert!(!apart.nodes.iter().any(|n| matches!(n.op, Op::LinearPair { .. })));
}

/// The shared expert's down projection: in routing's launch for a decode step whose
/// launches run one after another; a launch of its own beside the routed experts, its
/// input listed by routing, where launches run side by side; apart and waiting for a step
/// of nine rows one after another.
#[test]
fn route_with_shared_down_follows_the_device_and_the_rows() {
    let spec = small_spec(WeightFormat::Nvfp4);
    let passes = ["stack_swiglu", "pair_linears", "route_with_shared_down"];
    let serial = after(&spec, shape(1, false), &passes);
    assert!(matches!(
        node(&serial, "layers.1.router"),
        Op::Router { linear: Some(_), .. }
    ));
    assert_eq!(output_names(&serial, "layers.1.router")[2], "layers.1.router.2");
    assert!(!labels(&serial).contains(&"layers.1.shared_expert.down"));
    let side_by_side = after(&spec, shape(1, true), &passes);
    let router = side_by_side
        .nodes
        .iter()
        .find(|n| n.label == "layers.1.router")
        .unwrap();
    assert!(matches!(router.op, Op::Router { linear: None, .. }));
    assert_eq!(side_by_side.value(router.inputs[1]).name, "layers.1.router_logits.1");
    assert!(node(&side_by_side, "layers.1.shared_expert.down").runs_beside());
    let nine = after(&spec, shape(9, false), &passes);
    assert!(!node(&nine, "layers.1.shared_expert.down").runs_beside());
    assert_eq!(
        nine.nodes
            .iter()
            .find(|n| n.label == "layers.1.router")
            .unwrap()
            .inputs
            .len(),
        1
    );
}

/// A MoE combine and the norm after it are one launch, labelled as the combine.
#[test]
fn combine_into_norm_fuses_every_combine() {
    let graph = after(&bench_spec(), shape(1, false), &["combine_into_norm"]);
    assert!(!graph.nodes.iter().any(|n| matches!(n.op, Op::MoeCombine { .. })));
    assert!(matches!(node(&graph, "layers.23.hidden"), Op::MoeCombineNorm { .. }));
    assert_eq!(
        output_names(&graph, "layers.5.hidden"),
        ["layers.5.hidden", "layers.5.hidden.1"]
    );
    assert!(!labels(&graph).contains(&"final_norm"));
    assert!(labels(&graph).contains(&"layers.1.input_norm"));
}

/// Steps of [`GROUPED_EXPERT_ROWS`] rows or more group each layer's slots right after
/// routing and launch the experts over the groups, in narrow workgroups; smaller steps do
/// neither.
#[test]
fn group_expert_slots_and_expert_workgroups_follow_the_rows() {
    let spec = small_spec(WeightFormat::Nvfp4);
    let passes = ["group_expert_slots", "expert_workgroups"];
    let graph = after(&spec, shape(GROUPED_EXPERT_ROWS, false), &passes);
    let at = labels(&graph).iter().position(|&l| l == "layers.1.router").unwrap();
    assert_eq!(graph.nodes[at + 1].label, "layers.1.group_slots");
    for label in ["layers.1.experts.gate_up", "layers.1.experts.down"] {
        assert!(matches!(
            node(&graph, label),
            Op::Experts {
                grouped: true,
                workgroup: LinearWidth::Narrow,
                ..
            }
        ));
    }
    let fewer = after(&spec, shape(GROUPED_EXPERT_ROWS - 1, false), &passes);
    assert!(!labels(&fewer).contains(&"layers.1.group_slots"));
    assert!(matches!(
        node(&fewer, "layers.1.experts.down"),
        Op::Experts {
            grouped: false,
            workgroup: LinearWidth::Standard,
            ..
        }
    ));
}

/// Steps of [`GROUPED_EXPERT_ROWS`] rows or more pack each linear input once and every
/// linear reads the packed copy: a norm read only by such linears writes its output packed,
/// any other input is packed right before its first reader; a BF16 width only the ragged
/// kernel reads stays f32. Smaller steps pack nothing.
#[test]
fn pack_linear_inputs_packs_each_input_once() {
    let mut spec = small_spec(WeightFormat::Nvfp4);
    spec.dense_width = 100;
    let passes = ["group_expert_slots", "pack_linear_inputs"];
    let graph = after(&spec, shape(GROUPED_EXPERT_ROWS, false), &passes);
    let packs: Vec<&str> = graph
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::PackBf16))
        .map(|n| n.label.as_str())
        .collect();
    assert_eq!(
        packs,
        [
            "layers.0.o_proj.input",
            "layers.1.o_proj.input",
            "layers.1.shared_expert.down.input",
            "layers.1.experts.down.input",
        ]
    );
    for norm in [
        "layers.0.input_norm",
        "layers.0.post_norm",
        "layers.1.input_norm",
        "layers.1.post_norm",
        "final_norm",
    ] {
        assert!(
            matches!(
                node(&graph, norm),
                Op::RmsNorm {
                    output: NormOutput::Bf16Pairs,
                    ..
                }
            ),
            "{norm}"
        );
    }
    assert!(matches!(
        node(&graph, "layers.0.hidden"),
        Op::Linear {
            input: LinearInput::F32,
            ..
        }
    ));
    assert!(matches!(
        node(&graph, "layers.1.shared_expert.gate_up"),
        Op::Linear {
            input: LinearInput::Bf16Pairs,
            ..
        }
    ));
    let decode = after(&spec, shape(GROUPED_EXPERT_ROWS - 1, false), &passes);
    assert!(!decode.nodes.iter().any(|n| matches!(n.op, Op::PackBf16)));
    assert!(matches!(
        node(&decode, "final_norm"),
        Op::RmsNorm {
            output: NormOutput::Bf16,
            ..
        }
    ));
}

/// Attention's last chunk combines them for steps under [`GROUPED_EXPERT_ROWS`] rows on
/// devices whose barriers reach the whole device.
#[test]
fn attention_combine_follows_the_device_and_the_rows() {
    let spec = small_spec(WeightFormat::Nvfp4);
    let many = GROUPED_EXPERT_ROWS;
    for (rows, vulkan, combines) in [
        (1, true, true),
        (many - 1, true, true),
        (many, true, false),
        (1, false, false),
    ] {
        let graph = after(&spec, shape(rows, vulkan), &["attention_combine"]);
        assert!(
            matches!(
                node(&graph, "layers.0.attention"),
                Op::Attention { last_chunk_combines, .. } if *last_chunk_combines == combines
            ),
            "{rows} rows, vulkan {vulkan}"
        );
    }
}

/// Every pass is run by the schedule, once, and each keeps a step of every size valid on its
/// own (from the plain graph).
#[test]
fn each_pass_alone_keeps_the_graph_valid() {
    let mut names: Vec<&str> = PASSES.iter().map(|(name, _)| *name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), PASSES.len());
    for (name, _) in PASSES {
        for rows in [1, 9, 256] {
            for vulkan in [false, true] {
                after(&bench_spec(), shape(rows, vulkan), &[name]);
            }
        }
    }
}
