//! The bits of the parameter blocks' `flags` fields, defined once: the host sets them by
//! these names, and [`wgsl_constants`] declares the same names in every kernel's source.

/// A group of flag bits: a module of constants, and the same names for the WGSL (`PREFIX_NAME`).
macro_rules! flag_group {
    ($(#[$doc:meta])* $module:ident, $prefix:literal, { $($(#[$bit_doc:meta])* $name:ident = $value:literal,)* }) => {
        $(#[$doc])*
        pub mod $module {
            $($(#[$bit_doc])* pub const $name: u32 = $value;)*
            /// The group's bits as WGSL names and values.
            pub(super) const WGSL: &[(&str, u32)] = &[$((concat!($prefix, "_", stringify!($name)), $name),)*];
        }
    };
}

flag_group!(
    /// [`crate::LinearParams::flags`] and `second_flags` (`linear.wgsl`, `linear_ragged.wgsl`).
    linear, "LINEAR", {
        /// Add the bias.
        BIAS = 1,
        /// Round the output to BF16.
        ROUND = 2,
        /// Add the residual stream.
        RESIDUAL = 4,
        /// The weight rows are stacked [gate | up] pairs: write SwiGLU(gate, up).
        SWIGLU = 8,
    }
);

flag_group!(
    /// [`crate::NormParams::flags`] (`norm.wgsl`).
    norm, "NORM", {
        /// Round the output to BF16.
        ROUND = 1,
        /// `combine_rms_norm` combines a shared expert too.
        SHARED_EXPERT = 2,
        /// Write the output as BF16 pairs (`y_pairs`, binding 12) instead of f32 (`y`);
        /// only with [`ROUND`].
        PAIRS = 4,
    }
);

flag_group!(
    /// [`crate::AttentionParams::flags`] (`attention.wgsl`).
    attention, "ATTENTION", {
        /// Round the output to BF16.
        ROUND = 1,
    }
);

flag_group!(
    /// [`crate::RouterParams::flags`] (`router.wgsl`).
    router, "ROUTER", {
        /// Sigmoid scores (else softmax).
        SIGMOID = 1,
        /// The logits cover every original expert (else the kept ones).
        FULL_WIDTH = 2,
        /// Add the selection bias before choosing.
        SCORE_BIAS = 4,
        /// Renormalise the chosen weights to sum to 1.
        RENORMALIZE = 8,
    }
);

flag_group!(
    /// [`crate::CodecParams::flags`] (`codec.wgsl`).
    codec, "CODEC", {
        /// Add the bias.
        BIAS = 1,
        /// Round the output to BF16.
        ROUND = 2,
    }
);

flag_group!(
    /// [`crate::ElementwiseParams::flags`] (`elementwise.wgsl`).
    elementwise, "ELEMENTWISE", {
        /// swiglu, gelu, add, mean_rows: round the output to BF16.
        ROUND = 1,
        /// embed: the voice-prefix rows too.
        PREFIX_ROWS = 1,
    }
);

/// The flags as WGSL constants (`LINEAR_BIAS`, `ROUTER_SIGMOID`, ...), prepended to every
/// kernel's source.
pub fn wgsl_constants() -> String {
    [
        linear::WGSL,
        norm::WGSL,
        attention::WGSL,
        router::WGSL,
        codec::WGSL,
        elementwise::WGSL,
    ]
    .iter()
    .flat_map(|group| group.iter())
    .map(|(name, bit)| format!("const {name}: u32 = {bit}u;\n"))
    .collect()
}

/// `flag` when `set`, else 0: a parameter block's flags as `bit(a, A) | bit(b, B)`.
pub fn bit(set: bool, flag: u32) -> u32 {
    if set { flag } else { 0 }
}
