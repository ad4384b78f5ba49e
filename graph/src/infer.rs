//! Output types of every op, and the checks of its inputs: the one place each op's shape
//! and dtype rules live.

use drama_kernels::{KeptCapacity, LinearInput, MAX_EXPERT_GROUPS, MAX_KEPT_EXPERTS, MAX_ROUTED_PER_TOKEN};

use crate::drama3::kv_cache_width;
use crate::ir::{DType, Op, Value, ValueKind};

type Outputs = Vec<(Vec<usize>, DType)>;

fn expect(condition: bool, problem: impl FnOnce() -> String) -> Result<(), String> {
    if condition { Ok(()) } else { Err(problem()) }
}

fn arity(inputs: &[&Value], n: usize) -> Result<(), String> {
    expect(inputs.len() == n, || format!("takes {n} inputs, got {}", inputs.len()))
}

fn rows_of(value: &Value) -> usize {
    value.shape.first().copied().unwrap_or(0)
}

fn width_of(value: &Value) -> usize {
    value.shape.last().copied().unwrap_or(0)
}

fn row_vector(value: &Value, rows: usize, what: &str) -> Result<(), String> {
    expect(value.dtype == DType::U32 && value.shape == [rows], || {
        format!("{what} must be U32 [{rows}], is {:?} {:?}", value.dtype, value.shape)
    })
}

/// row_lane, row_pos, k_cache and v_cache of `rows` rows and caches `width` wide.
fn cache_inputs(inputs: &[&Value], rows: usize, width: usize) -> Result<(), String> {
    row_vector(inputs[0], rows, "row_lane")?;
    row_vector(inputs[1], rows, "row_pos")?;
    for cache in &inputs[2..4] {
        expect(cache.kind == ValueKind::State && width_of(cache) == width, || {
            format!("{} must be a cache state of width {width}", cache.name)
        })?;
    }
    Ok(())
}

/// Checks `inputs` against `op` and returns the output shapes and dtypes.
pub fn infer(op: &Op, inputs: &[&Value]) -> Result<Outputs, String> {
    match op {
        Op::Embed { .. } => {
            arity(inputs, 3)?;
            let rows = rows_of(inputs[0]);
            row_vector(inputs[0], rows, "row_table")?;
            row_vector(inputs[1], rows, "row_index")?;
            let width = width_of(inputs[2]);
            Ok(vec![(vec![rows, width], DType::F32)])
        }
        Op::RmsNorm { output, .. } => {
            arity(inputs, 1)?;
            let x = inputs[0];
            expect(x.shape.len() == 2, || format!("x must be 2-D, is {:?}", x.shape))?;
            Ok(vec![(x.shape.clone(), output.dtype())])
        }
        Op::Linear {
            members,
            in_features,
            round_output,
            residual,
            swiglu,
            cache_write,
            input,
            ..
        } => {
            let cached = if cache_write.is_some() { 4 } else { 0 };
            arity(inputs, if *residual { 2 } else { 1 } + cached)?;
            let x = inputs[0];
            expect(x.dtype == linear_input_dtype(*input), || {
                format!(
                    "the input must hold BF16 values as {:?} (round it where it is made)",
                    linear_input_dtype(*input)
                )
            })?;
            expect(width_of(x) == *in_features, || {
                format!("input width {} != in_features {in_features}", width_of(x))
            })?;
            expect(!members.is_empty(), || "no linears".into())?;
            let out: usize = members.iter().map(|m| m.out).sum();
            if *swiglu {
                expect(is_gate_up(members) && !*residual, || {
                    "a SwiGLU linear needs [gate, up] members of one width and no residual".into()
                })?;
                let dtype = if *round_output { DType::Bf16 } else { DType::F32 };
                return Ok(vec![(vec![rows_of(x), members[0].out], dtype)]);
            }
            if let Some(w) = cache_write {
                let qkv = (w.heads + 2 * w.kv_heads) * w.head_dim;
                expect(!*residual && !*swiglu && out == qkv, || {
                    format!("a KV-cache write needs a plain [q|k|v] projection {qkv} wide")
                })?;
                expect(
                    w.head_dim % 2 == 0 && members.iter().all(|m| m.out % w.head_dim == 0),
                    || format!("a KV-cache write needs whole heads of an even width {}", w.head_dim),
                )?;
                cache_inputs(&inputs[1..5], rows_of(x), kv_cache_width(w.kv_heads, w.head_dim))?;
            }
            if *residual {
                expect(shape_of(inputs[1]) == [rows_of(x), out], || {
                    format!("the residual must be [rows, {out}]")
                })?;
                return Ok(vec![(vec![rows_of(x), out], DType::F32)]);
            }
            let dtype = if *round_output { DType::Bf16 } else { DType::F32 };
            Ok(vec![(vec![rows_of(x), out], dtype)])
        }
        Op::LinearPair {
            first,
            second,
            in_features,
            input,
        } => {
            arity(inputs, 1)?;
            let x = inputs[0];
            let dtype = linear_input_dtype(*input);
            expect(x.dtype == dtype && width_of(x) == *in_features, || {
                format!("x must be {dtype:?} of width {in_features}")
            })?;
            let half_fits =
                |half: &crate::ir::PairHalf| !half.members.is_empty() && (!half.swiglu || is_gate_up(&half.members));
            expect(half_fits(first) && half_fits(second), || {
                "a linear pair needs members in each half, a SwiGLU half [gate, up] of one width".into()
            })?;
            let output = |half: &crate::ir::PairHalf| {
                let dtype = if half.round_output { DType::Bf16 } else { DType::F32 };
                (vec![rows_of(x), half.width()], dtype)
            };
            Ok(vec![output(first), output(second)])
        }
        Op::Attention {
            heads,
            kv_heads,
            head_dim,
            round_output,
            ..
        } => {
            arity(inputs, 5)?;
            let rows = rows_of(inputs[0]);
            expect(heads % kv_heads == 0, || {
                format!("{heads} heads over {kv_heads} kv heads")
            })?;
            let qkv = (heads + 2 * kv_heads) * head_dim;
            expect(shape_of(inputs[0]) == [rows, qkv], || {
                format!("[q|k|v] must be [rows, {qkv}]")
            })?;
            cache_inputs(&inputs[1..5], rows, kv_cache_width(*kv_heads, *head_dim))?;
            let dtype = if *round_output { DType::Bf16 } else { DType::F32 };
            Ok(vec![(vec![rows, heads * head_dim], dtype)])
        }
        Op::Router { route: r, linear } => {
            expect(
                (1..=2).contains(&inputs.len()) && (linear.is_none() || inputs.len() == 2),
                || format!("takes the logits and the linear's input, got {} inputs", inputs.len()),
            )?;
            let logits = inputs[0];
            let width = if r.full_width { r.group_size * r.n_group } else { r.kept } + usize::from(r.gate_column);
            expect(logits.dtype == DType::F32 && width_of(logits) == width, || {
                format!(
                    "logits must be F32 of width {width}, are {:?} {:?}",
                    logits.dtype, logits.shape
                )
            })?;
            expect((1..=MAX_ROUTED_PER_TOKEN).contains(&r.k) && r.k <= r.kept, || {
                format!("k {} must be in 1..=min({MAX_ROUTED_PER_TOKEN}, kept)", r.k)
            })?;
            expect(
                KeptCapacity::for_kept(r.kept).is_some() && r.n_group <= MAX_EXPERT_GROUPS,
                || format!("at most {MAX_KEPT_EXPERTS} kept experts and {MAX_EXPERT_GROUPS} groups"),
            )?;
            let rows = rows_of(logits);
            let mut outputs = vec![(vec![rows, r.k], DType::U32), (vec![rows, r.k], DType::F32)];
            if let Some(&x) = inputs.get(1) {
                expect(is_bf16(x.dtype) && rows_of(x) == rows, || {
                    format!("the linear's input must be BF16 with {rows} rows")
                })?;
            }
            if let Some(linear) = linear {
                expect(!linear.members.is_empty() && !linear.swiglu, || {
                    "the linear beside routing needs members and no SwiGLU".into()
                })?;
                let dtype = if linear.round_output { DType::Bf16 } else { DType::F32 };
                outputs.push((vec![rows, linear.width()], dtype));
            }
            Ok(outputs)
        }
        Op::Experts {
            projections,
            out,
            in_features,
            k,
            swiglu,
            grouped,
            ..
        } => {
            arity(inputs, if *grouped { 4 } else { 2 })?;
            let (x, ids) = (inputs[0], inputs[1]);
            if *grouped {
                expect(
                    inputs[2].dtype == DType::U32 && width_of(inputs[2]) == 4 && inputs[3].dtype == DType::U32,
                    || "grouped experts need the blocks and order of a group_slots node".into(),
                )?;
                expect(rows_of(inputs[3]) == rows_of(ids) * k, || {
                    "the slot order must hold every slot".into()
                })?;
            }
            expect(
                matches!(x.dtype, DType::Bf16 | DType::Bf16Pairs) && width_of(x) == *in_features,
                || format!("x must be BF16 values of width {in_features}"),
            )?;
            expect(ids.dtype == DType::U32 && width_of(ids) == *k, || {
                "ids must be U32 [tokens, k]".into()
            })?;
            let slots = rows_of(ids) * k;
            expect(!projections.is_empty(), || "no projections".into())?;
            let down = projections.iter().any(|(p, _)| *p == crate::ir::Projection::Down);
            expect(!down || projections.len() == 1, || "down reads its own input".into())?;
            let x_rows = if down { slots } else { rows_of(ids) };
            expect(rows_of(x) == x_rows, || {
                format!("x must have {x_rows} rows, has {}", rows_of(x))
            })?;
            if *swiglu {
                let gate_up = matches!(
                    projections.as_slice(),
                    [(crate::ir::Projection::Gate, _), (crate::ir::Projection::Up, _)]
                );
                expect(gate_up, || "a SwiGLU expert node needs [gate, up]".into())?;
                return Ok(vec![(vec![slots, *out], DType::Bf16)]);
            }
            Ok(vec![(vec![slots, out * projections.len()], DType::Bf16)])
        }
        Op::GroupSlots { experts } => {
            arity(inputs, 1)?;
            let ids = inputs[0];
            expect(ids.dtype == DType::U32 && ids.shape.len() == 2, || {
                "ids must be U32 [tokens, k]".into()
            })?;
            expect((1..=MAX_KEPT_EXPERTS).contains(experts), || {
                format!("{experts} experts: grouping takes 1 to {MAX_KEPT_EXPERTS}")
            })?;
            let slots = rows_of(ids) * width_of(ids);
            let blocks = slots.div_ceil(drama_kernels::EXPERT_GROUP_SLOTS) + experts;
            Ok(vec![(vec![blocks, 4], DType::U32), (vec![slots, 1], DType::U32)])
        }
        Op::PackBf16 => {
            arity(inputs, 1)?;
            let x = inputs[0];
            expect(x.dtype == DType::Bf16 && x.shape.len() == 2, || {
                "x must be BF16 rows".into()
            })?;
            // Whole vec4s of pairs per row: the linears load eight values at a time.
            expect(width_of(x).is_multiple_of(8), || {
                format!("BF16 pairs need a width that is a multiple of 8, not {}", width_of(x))
            })?;
            Ok(vec![(x.shape.clone(), DType::Bf16Pairs)])
        }
        Op::Swiglu { round_output } => {
            arity(inputs, 1)?;
            let width = width_of(inputs[0]);
            expect(width.is_multiple_of(2), || "[gate | up] rows need an even width".into())?;
            let dtype = if *round_output { DType::Bf16 } else { DType::F32 };
            Ok(vec![(vec![rows_of(inputs[0]), width / 2], dtype)])
        }
        Op::MoeCombine { k, shared } => {
            let residual = combine_inputs(inputs, *k, *shared)?;
            Ok(vec![(residual.to_vec(), DType::F32)])
        }
        Op::MoeCombineNorm { k, shared, output, .. } => {
            let residual = combine_inputs(inputs, *k, *shared)?;
            Ok(vec![
                (residual.to_vec(), DType::F32),
                (residual.to_vec(), output.dtype()),
            ])
        }
    }
}

/// Checks a MoE combine's inputs (residual, routed outputs, weights, and with `shared` the
/// router logits and the shared expert's output) and returns the residual's shape.
fn combine_inputs<'a>(inputs: &[&'a Value], k: usize, shared: bool) -> Result<&'a [usize], String> {
    arity(inputs, if shared { 5 } else { 3 })?;
    let residual = inputs[0];
    let tokens = rows_of(residual);
    let width = width_of(residual);
    expect(residual.shape.len() == 2, || {
        format!("the residual must be 2-D, is {:?}", residual.shape)
    })?;
    expect(shape_of(inputs[1]) == [tokens * k, width], || {
        "expert outputs must be [tokens * k, width]".into()
    })?;
    expect(shape_of(inputs[2]) == [tokens, k], || {
        "weights must be [tokens, k]".into()
    })?;
    if shared {
        expect(inputs[3].shape.len() == 2 && rows_of(inputs[3]) == tokens, || {
            "the router logits must be [tokens, width]".into()
        })?;
        expect(shape_of(inputs[4]) == [tokens, width], || {
            "the shared expert's output must be [tokens, width]".into()
        })?;
    }
    Ok(&residual.shape)
}

/// Whether linear members are a [gate, up] pair of one width (a SwiGLU's).
fn is_gate_up(members: &[crate::ir::LinearMember]) -> bool {
    members.len() == 2 && members[0].out == members[1].out
}

/// The dtype a linear reading `input` takes.
fn linear_input_dtype(input: LinearInput) -> DType {
    match input {
        LinearInput::F32 => DType::Bf16,
        LinearInput::Bf16Pairs => DType::Bf16Pairs,
    }
}

/// Shorthand used by inference rules.
fn shape_of(value: &Value) -> &[usize] {
    &value.shape
}

/// Whether a dtype can feed a linear.
fn is_bf16(dtype: DType) -> bool {
    dtype == DType::Bf16
}
