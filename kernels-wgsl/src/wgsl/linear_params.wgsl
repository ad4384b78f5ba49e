// The parameter block of the linear kernels (linear.wgsl, linear_ragged.wgsl): the host's
// `LinearParams` fills it for both.
struct Params {
    rows: u32,          // activation rows (linear) or slots (gathered)
    in_features: u32,   // K
    out_features: u32,  // N: weight rows in this segment (per expert when gathered)
    out_offset: u32,    // column of y where this segment's first output goes
    y_stride: u32,      // floats per row of y
    x_row_div: u32,     // gathered: input row = slot / x_row_div
    expert_begin: u32,  // gathered: local expert ids held by this segment
    expert_end: u32,
    flags: u32,         // LINEAR_* bits (flags.rs); SWIGLU: see `plan_rows`
    tensor_scale: f32,  // linear: NVFP4 per-tensor scale (1 for other formats)
    bias_offset: u32,   // bias element of this segment's first output
    head_dim: u32,      // linear_kv: floats per head
    q_width: u32,       // linear_kv: y columns before the keys (the queries)
    capacity: u32,      // linear_kv: positions per lane in the caches
    split_groups: u32,  // linear_pair: workgroups of the first linear
    second_out_features: u32,  // linear_pair: the second linear's weight rows,
    second_y_stride: u32,      //   its output's floats per row
    second_flags: u32,         //   and its flags (its output starts at column 0)
}
