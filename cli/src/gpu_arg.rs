//! The `--backend` argument: which graphics API to open, never a silent fallback.

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use drama_engine::gpu::{BackendChoice, Gpu, GpuOptions};
use drama_kernels::Numerics;

/// `--numerics`: how the kernels are compiled.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum NumericsArg {
    /// As written.
    AsWritten,
    /// As Metal's default fast math may compile them.
    FastMathEmulation,
}

impl From<NumericsArg> for Numerics {
    fn from(arg: NumericsArg) -> Numerics {
        match arg {
            NumericsArg::AsWritten => Numerics::AsWritten,
            NumericsArg::FastMathEmulation => Numerics::FastMathEmulation,
        }
    }
}

/// GPU selection.
#[derive(Args)]
pub struct GpuArg {
    /// Graphics API: auto (Metal on macOS, DX12 on Windows, Vulkan elsewhere), metal, vulkan
    /// or dx12.
    #[arg(long, default_value = "auto", value_parser = BackendChoice::parse)]
    backend: BackendChoice,
}

impl GpuArg {
    /// The API chosen.
    pub fn backend(&self) -> BackendChoice {
        self.backend
    }

    /// Opens the device.
    pub fn open(&self) -> Result<Arc<Gpu>> {
        self.open_with(Numerics::AsWritten)
    }

    /// Opens the device with its kernels compiled for `numerics`.
    pub fn open_with(&self, numerics: Numerics) -> Result<Arc<Gpu>> {
        let gpu = Gpu::new(&GpuOptions {
            backend: self.backend,
            numerics,
            ..Default::default()
        })
        .context("opening the GPU")?;
        Ok(Arc::new(gpu))
    }
}
