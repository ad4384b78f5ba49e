//! The bits of the parameter blocks' `flags` fields, defined once: the host sets them by
//! these names, and [`wgsl_constants`] declares the same names in every kernel's source.

/// [`crate::LinearParams::flags`] and `second_flags` (`linear.wgsl`, `linear_ragged.wgsl`).
pub mod linear {
    /// Add the bias.
    pub const BIAS: u32 = 1;
    /// Round the output to BF16.
    pub const ROUND: u32 = 2;
    /// Add the residual stream.
    pub const RESIDUAL: u32 = 4;
    /// The weight rows are stacked [gate | up] pairs: write SwiGLU(gate, up).
    pub const SWIGLU: u32 = 8;
}

/// [`crate::NormParams::flags`] (`norm.wgsl`).
pub mod norm {
    /// Round the output to BF16.
    pub const ROUND: u32 = 1;
    /// `combine_rms_norm` combines a shared expert too.
    pub const SHARED_EXPERT: u32 = 2;
}

/// [`crate::AttentionParams::flags`] (`attention.wgsl`).
pub mod attention {
    /// Round the output to BF16.
    pub const ROUND: u32 = 1;
}

/// [`crate::RouterParams::flags`] (`router.wgsl`).
pub mod router {
    /// Sigmoid scores (else softmax).
    pub const SIGMOID: u32 = 1;
    /// The logits cover every original expert (else the kept ones).
    pub const FULL_WIDTH: u32 = 2;
    /// Add the selection bias before choosing.
    pub const SCORE_BIAS: u32 = 4;
    /// Renormalise the chosen weights to sum to 1.
    pub const RENORMALIZE: u32 = 8;
}

/// [`crate::CodecParams::flags`] (`codec.wgsl`).
pub mod codec {
    /// Add the bias.
    pub const BIAS: u32 = 1;
    /// Round the output to BF16.
    pub const ROUND: u32 = 2;
}

/// [`crate::ElementwiseParams::flags`] (`elementwise.wgsl`).
pub mod elementwise {
    /// swiglu, gelu, add, mean_rows: round the output to BF16.
    pub const ROUND: u32 = 1;
    /// embed: the voice-prefix rows too.
    pub const PREFIX_ROWS: u32 = 1;
}

/// The flags as WGSL constants (`LINEAR_BIAS`, `ROUTER_SIGMOID`, ...), prepended to every
/// kernel's source.
pub fn wgsl_constants() -> String {
    let groups: [(&str, &[(&str, u32)]); 6] = [
        (
            "LINEAR",
            &[
                ("BIAS", linear::BIAS),
                ("ROUND", linear::ROUND),
                ("RESIDUAL", linear::RESIDUAL),
                ("SWIGLU", linear::SWIGLU),
            ],
        ),
        (
            "NORM",
            &[("ROUND", norm::ROUND), ("SHARED_EXPERT", norm::SHARED_EXPERT)],
        ),
        ("ATTENTION", &[("ROUND", attention::ROUND)]),
        (
            "ROUTER",
            &[
                ("SIGMOID", router::SIGMOID),
                ("FULL_WIDTH", router::FULL_WIDTH),
                ("SCORE_BIAS", router::SCORE_BIAS),
                ("RENORMALIZE", router::RENORMALIZE),
            ],
        ),
        ("CODEC", &[("BIAS", codec::BIAS), ("ROUND", codec::ROUND)]),
        (
            "ELEMENTWISE",
            &[("ROUND", elementwise::ROUND), ("PREFIX_ROWS", elementwise::PREFIX_ROWS)],
        ),
    ];
    groups
        .iter()
        .flat_map(|(group, bits)| {
            bits.iter()
                .map(move |(name, bit)| format!("const {group}_{name}: u32 = {bit}u;\n"))
        })
        .collect()
}

/// `flag` when `set`, else 0: a parameter block's flags as `bit(a, A) | bit(b, B)`.
pub fn bit(set: bool, flag: u32) -> u32 {
    if set { flag } else { 0 }
}
