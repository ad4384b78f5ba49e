//! `drama serve`: the local HTTP speech service.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use drama_engine::guidance::check_gamma;
use drama_engine::session::{Engine, MAX_LANES, STEP_CACHE_BYTES};
use drama_engine::synth::GuidanceMode;
use drama_server::{Claimed, ServerConfig, serve};

use crate::checkpoint_arg::CheckpointArg;
use crate::gpu_arg::GpuArg;

/// Guidance lane modes.
#[derive(Clone, Copy, ValueEnum)]
enum Guidance {
    Paired,
    Separate,
}

/// Arguments of `drama serve`.
#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    checkpoint: CheckpointArg,
    #[command(flatten)]
    gpu: GpuArg,
    /// Address to listen on (loopback by default).
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// Run guidance lanes batched (paired) or as two forwards (separate): same output bits.
    #[arg(long, value_enum, default_value = "paired")]
    guidance: Guidance,
    /// Guidance scale of every request (1 disables guidance).
    #[arg(long, default_value_t = 1.5)]
    gamma: f32,
    /// Let requests set `gamma` (in (0, 10], as `--gamma`).
    #[arg(long)]
    allow_request_gamma: bool,
    /// Lanes decoded together; a guided request takes two.
    #[arg(long, default_value_t = 8)]
    max_lanes: usize,
    /// Requests that may wait for lanes; beyond that, 429 with Retry-After.
    #[arg(long, default_value_t = 16)]
    queue: usize,
    /// Where saved voices live (default: the user data directory, drama/).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Longest a request may generate, in seconds (1 to 604800, a week).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=604_800))]
    request_timeout: u64,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// Longest `input`, in characters.
    #[arg(long, default_value_t = 20_000)]
    max_input_chars: usize,
    /// Memory for compiled step shapes (one per row count met) beyond the one in use, in
    /// MiB; the least recently used are dropped first and compile again when next needed.
    #[arg(long, default_value_t = STEP_CACHE_BYTES >> 20, value_parser = clap::value_parser!(u64).range(0..=1 << 20))]
    step_cache_mib: u64,
    /// Longest a client may take to send a request's headers or its body, and longest a
    /// connection may stay idle between requests, in seconds (1 to 3600).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    client_timeout: u64,
    /// Client connections open at once; later clients wait to be accepted (1 to 65536).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    max_connections: u64,
}

/// Resolves at the next SIGINT (Ctrl-C) or SIGTERM.
async fn stop_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(_) => return interrupt.await.unwrap_or(()),
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

/// The exit status of a server stopped by a second signal (128 + SIGINT, as shells report
/// an interrupted program).
const FORCED_EXIT: i32 = 130;

/// Resolves at the first stop signal, so the server stops gracefully; a second signal ends
/// the process at once, cutting off the requests in flight.
async fn shutdown_signal() {
    stop_signal().await;
    eprintln!("drama serve: stopping: finishing the requests in flight; interrupt again to stop at once");
    tokio::spawn(async {
        stop_signal().await;
        eprintln!("drama serve: stopped at once; requests in flight were cut off");
        std::process::exit(FORCED_EXIT);
    });
}

/// Runs `drama serve`.
pub fn run(args: ServeArgs) -> Result<()> {
    anyhow::ensure!(
        (1..=MAX_LANES).contains(&args.max_lanes),
        "--max-lanes must be in 1..={MAX_LANES}"
    );
    check_gamma(args.gamma).context("--gamma")?;
    anyhow::ensure!(
        args.gamma == 1.0 || args.max_lanes >= 2,
        "guidance needs --max-lanes of at least 2"
    );
    let data_dir = match args.data_dir {
        Some(dir) => dir,
        None => dirs::data_dir()
            .context("no user data directory; pass --data-dir")?
            .join("drama"),
    };
    let config = ServerConfig {
        addr: args.addr,
        guidance: match args.guidance {
            Guidance::Paired => GuidanceMode::Paired,
            Guidance::Separate => GuidanceMode::Separate,
        },
        gamma: args.gamma,
        allow_request_gamma: args.allow_request_gamma,
        max_lanes: args.max_lanes,
        queue: args.queue,
        data_dir,
        max_body: args.max_body_bytes,
        request_timeout: Duration::from_secs(args.request_timeout),
        max_input_chars: args.max_input_chars,
        step_cache_bytes: args.step_cache_mib << 20,
        client_timeout: Duration::from_secs(args.client_timeout),
        max_connections: usize::try_from(args.max_connections)?,
    };
    // The address and the data directory first: their failures are immediate, while opening
    // the checkpoint may download it and loading the engine takes seconds.
    let claimed = Claimed::new(&config)?;
    let checkpoint = args.checkpoint.open()?;
    let engine = Engine::load(args.gpu.open()?, checkpoint)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    eprintln!("drama serve: listening on http://{}", claimed.addr());
    runtime.block_on(serve(config, claimed, engine, shutdown_signal()))?;
    eprintln!("drama serve: stopped");
    Ok(())
}
