//! The receipt `drama qualify` writes: what ran where, every check with its figure and its
//! limit, and a short bench. It holds no paths, no audio and no voice data, so it can be
//! shared as it is.

use std::time::Instant;

use drama_engine::gpu::Capabilities;
use serde::Serialize;

/// The receipt's layout version; bumped when a field changes meaning or goes away.
pub const RECEIPT_SCHEMA: u32 = 1;

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Its figure is within its limit.
    Pass,
    /// Its figure is beyond its limit, or it could not run to the end.
    Fail,
    /// Not run here; `detail` says why.
    Skipped,
}

/// One check: a measured figure against the limit the engine promises.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Dotted name: group, then what is checked (`kernel.linear.nvfp4`).
    pub name: String,
    /// How it ended.
    pub status: Status,
    /// What was measured (an error relative to the reference, or a count of differing
    /// values for an exactness check); None when it could not be measured.
    pub figure: Option<f64>,
    /// The largest figure that passes.
    pub limit: Option<f64>,
    /// What the figure is, or why the check failed or was skipped.
    pub detail: String,
    /// Wall time of the check.
    pub seconds: f64,
}

/// What a check measured: its figure against its limit, in words too.
pub struct Measured {
    /// The figure.
    pub figure: f64,
    /// The largest figure that passes.
    pub limit: f64,
    /// What the figure is.
    pub detail: String,
}

impl Measured {
    /// A measurement of `figure` against `limit`.
    pub fn new(figure: f64, limit: f64, detail: impl Into<String>) -> Measured {
        Measured {
            figure,
            limit,
            detail: detail.into(),
        }
    }

    /// An exactness check: `differing` values differ between two results that must be the
    /// same bits.
    pub fn exact(differing: usize, detail: impl Into<String>) -> Measured {
        Measured::new(differing as f64, 0.0, detail)
    }

    /// Whether the figure is within its limit (a NaN figure is not).
    pub fn passes(&self) -> bool {
        self.figure <= self.limit
    }
}

impl Check {
    /// Runs `body` as the check `name`: pass when its figure is within its limit (a NaN
    /// figure fails), fail when it is not or when `body` returns an error.
    pub fn run(name: &str, body: impl FnOnce() -> anyhow::Result<Measured>) -> Check {
        let started = Instant::now();
        let outcome = body();
        let seconds = started.elapsed().as_secs_f64();
        match outcome {
            Ok(m) => Check::measured(name, m, seconds),
            Err(e) => Check {
                name: name.into(),
                status: Status::Fail,
                figure: None,
                limit: None,
                detail: format!("{e:#}"),
                seconds,
            },
        }
    }

    /// A check of what was measured in `seconds`: pass when its figure is within its limit
    /// (a NaN figure fails).
    pub fn measured(name: &str, m: Measured, seconds: f64) -> Check {
        Check {
            name: name.into(),
            status: if m.passes() { Status::Pass } else { Status::Fail },
            figure: Some(m.figure),
            limit: Some(m.limit),
            detail: m.detail,
            seconds,
        }
    }

    /// A check not run here, and why.
    pub fn skipped(name: &str, why: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status: Status::Skipped,
            figure: None,
            limit: None,
            detail: why.into(),
            seconds: 0.0,
        }
    }
}

/// Which drama and which wgpu ran.
#[derive(Debug, Clone, Serialize)]
pub struct Build {
    /// drama's version.
    pub version: &'static str,
    /// The source commit (`+dirty` when built from a changed tree).
    pub commit: &'static str,
    /// wgpu's version.
    pub wgpu: &'static str,
    /// The build profile's optimisation: `release` or `debug`.
    pub profile: &'static str,
}

/// Where it ran: the operating system and the GPU as the backend reports it.
#[derive(Debug, Clone, Serialize)]
pub struct Platform {
    /// Operating system family and version (`linux 6.8.0`, `macos 15.1`).
    pub os: String,
    /// CPU architecture.
    pub arch: &'static str,
    /// The capability report: backend, adapter, driver, limits, math mode.
    pub capabilities: Capabilities,
}

/// The short bench's figures (None where not measured).
#[derive(Debug, Clone, Default, Serialize)]
pub struct BenchFigures {
    /// The checkpoint measured (its label).
    pub checkpoint: String,
    /// Wall milliseconds per decode step (inputs written, the step's pass, logits read
    /// back) at a context of `context` positions, per lane count: (lanes, ms).
    pub decode_step_ms: Vec<(usize, f64)>,
    /// GPU milliseconds of those steps' passes (from timestamps where the adapter has them,
    /// else the wall time of the pass): (lanes, ms).
    pub decode_step_gpu_ms: Vec<(usize, f64)>,
    /// Context of the decode steps.
    pub context: usize,
    /// Prefill time of `prefill_rows` rows.
    pub prefill_ms: Option<f64>,
    /// Rows of the prefill.
    pub prefill_rows: usize,
    /// Wall time over audio time of a guided synthesis (below 1: faster than real time).
    pub real_time_factor: Option<f64>,
    /// Seconds to the synthesis's first audio.
    pub first_audio_s: Option<f64>,
    /// The process's peak resident memory, in MiB (on unified-memory GPUs this includes
    /// the weights).
    pub peak_resident_mib: Option<f64>,
}

/// Everything `drama qualify` found.
#[derive(Debug, Clone, Serialize)]
pub struct Receipt {
    /// [`RECEIPT_SCHEMA`].
    pub schema: u32,
    /// Which drama.
    pub build: Build,
    /// Where.
    pub platform: Platform,
    /// The given checkpoint's label (`pinned <repo>@<rev>` or `local sha256:<16 hex>`),
    /// None when none was given.
    pub checkpoint: Option<String>,
    /// `--quick`: fewer presets and shorter runs.
    pub quick: bool,
    /// Every check, in the order run.
    pub checks: Vec<Check>,
    /// The short bench.
    pub bench: BenchFigures,
    /// Checks that passed, failed and were skipped.
    pub passed: usize,
    /// See `passed`.
    pub failed: usize,
    /// See `passed`.
    pub skipped: usize,
    /// Wall time of the whole run.
    pub total_s: f64,
}

impl Receipt {
    /// Counts the checks' outcomes into `passed`, `failed` and `skipped`.
    pub fn count(&mut self) {
        let count = |status| self.checks.iter().filter(|c| c.status == status).count();
        (self.passed, self.failed, self.skipped) = (count(Status::Pass), count(Status::Fail), count(Status::Skipped));
    }

    /// The human summary: one line per check, the bench, the verdict.
    pub fn summary(&self) -> String {
        let caps = &self.platform.capabilities;
        let units: Vec<String> = caps
            .matrix_units
            .iter()
            .map(|u| format!("{}x{}x{} {}->{}", u.m, u.n, u.k, u.inputs, u.accumulator))
            .collect();
        let mut text = format!(
            "drama {} ({}, wgpu {}) on {} {}: {} via {} ({}), compiler math: {}, kernels: {:?}, matrix units: {}\n",
            self.build.version,
            self.build.commit,
            self.build.wgpu,
            self.platform.os,
            self.platform.arch,
            caps.adapter,
            caps.backend,
            caps.driver,
            caps.compiler_math,
            caps.numerics,
            if units.is_empty() {
                "none".to_string()
            } else {
                units.join(", ")
            }
        );
        for check in &self.checks {
            let status = match check.status {
                Status::Pass => "pass",
                Status::Fail => "FAIL",
                Status::Skipped => "skip",
            };
            let figure = match (check.figure, check.limit) {
                (Some(f), Some(l)) => format!("{f:.3e} (limit {l:.1e})"),
                _ => String::new(),
            };
            text.push_str(&format!("{status}  {:<34} {figure:<26} {}\n", check.name, check.detail));
        }
        let b = &self.bench;
        let steps: Vec<String> = b
            .decode_step_gpu_ms
            .iter()
            .zip(&b.decode_step_ms)
            .map(|((l, gpu), (_, wall))| format!("{l} lane(s) {gpu:.3} / {wall:.3}"))
            .collect();
        text.push_str(&format!(
            "bench ({}): decode step at context {} (GPU / wall ms): {}; prefill of {} rows {}; real-time factor {}; first audio {}; peak resident memory {}\n",
            b.checkpoint,
            b.context,
            steps.join(", "),
            b.prefill_rows,
            optional(b.prefill_ms, "ms"),
            optional(b.real_time_factor, ""),
            optional(b.first_audio_s, "s"),
            optional(b.peak_resident_mib, "MiB"),
        ));
        text.push_str(&format!(
            "{} passed, {} failed, {} skipped in {:.1} s\n",
            self.passed, self.failed, self.skipped, self.total_s
        ));
        text
    }
}

fn optional(value: Option<f64>, unit: &str) -> String {
    value.map_or("not measured".into(), |v| {
        format!("{v:.3} {unit}").trim_end().to_string()
    })
}
