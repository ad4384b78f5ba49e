//! The local HTTP speech service (`drama serve`), on hyper and tokio.
//!
//! - `POST /v1/audio/speech`: OpenAI-compatible speech; whole WAV/PCM, streamed audio, or
//!   server-sent events.
//! - `POST /v1/voices` (WAV body), `GET /v1/voices`, `DELETE /v1/voices/{id}`: saved voices.
//! - `GET /health`, `GET /ready`, `GET /metrics`.
//!
//! The GPU work runs on one worker thread ([`worker`]) that batches every running request
//! into shared steps; each response is bit-identical to the same request served alone.
//! Voice uploads are encoded on a thread of their own ([`uploads`]) beside it.

mod admission;
pub mod api;
mod http;
pub mod metrics;
mod openai_voices;
mod stall;
mod unread;
mod uploads;
pub mod voices;
mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use drama_engine::session::Engine;
use drama_engine::synth::GuidanceMode;
use drama_engine::text::TextFrontEnd;

/// How the service runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Listening address (loopback by default).
    pub addr: SocketAddr,
    /// Paired or separate guidance lanes.
    pub guidance: GuidanceMode,
    /// Guidance scale of every request.
    pub gamma: f32,
    /// Whether requests may set `gamma`.
    pub allow_request_gamma: bool,
    /// Lanes decoded together (a guided request takes two).
    pub max_lanes: usize,
    /// Requests that may wait for lanes before new ones get 429.
    pub queue: usize,
    /// Where saved voices live.
    pub data_dir: PathBuf,
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// Longest a request may generate.
    pub request_timeout: Duration,
    /// Longest `input`, in characters.
    pub max_input_chars: usize,
    /// Bytes of compiled step shapes kept beyond the one in use (see
    /// [`drama_engine::session::Session::set_step_cache_budget`]).
    pub step_cache_bytes: u64,
    /// Longest a client may take to send a request's headers, or its body, longest a
    /// connection may stay idle between requests, and longest a client may leave a response
    /// unread once the socket's buffers are full; then the connection is closed (or, for a
    /// body, answered 408).
    pub client_timeout: Duration,
    /// Connections open at once; beyond them, new clients wait to be accepted.
    pub max_connections: usize,
}

/// Why the service stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {reason}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The reason.
        reason: std::io::Error,
    },
    /// The data directory could not be used.
    #[error("data directory {dir}: {reason}")]
    DataDir {
        /// The directory.
        dir: PathBuf,
        /// The reason.
        reason: std::io::Error,
    },
    /// The engine could not start serving.
    #[error("engine: {0}")]
    Engine(String),
}

/// What the service claims from the operating system (its listening socket and its voice
/// store), claimed before the engine loads: a busy address or an unusable data directory
/// fails at once, not after seconds of loading weights.
pub struct Claimed {
    listener: std::net::TcpListener,
    addr: SocketAddr,
    store: voices::VoiceStore,
}

impl Claimed {
    /// Binds `config.addr` and opens the voice store under `config.data_dir`.
    pub fn new(config: &ServerConfig) -> Result<Self, ServerError> {
        let addr = config.addr;
        let bind_error = |reason| ServerError::Bind { addr, reason };
        let listener = std::net::TcpListener::bind(addr).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let bound = listener.local_addr().map_err(bind_error)?;
        let store = voices::VoiceStore::open(&config.data_dir).map_err(|reason| ServerError::DataDir {
            dir: config.data_dir.clone(),
            reason,
        })?;
        Ok(Claimed {
            listener,
            addr: bound,
            store,
        })
    }

    /// The bound address (with the port the system chose for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Serves on `claimed` until `shutdown` resolves or the GPU worker ends (an error: it failed
/// to start or panicked), then stops accepting, lets requests in flight finish (up to their
/// time limit) and returns. Runs inside a tokio runtime.
pub async fn serve(
    config: ServerConfig,
    claimed: Claimed,
    engine: Engine,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServerError> {
    let Claimed { listener, store, .. } = claimed;
    let store = Arc::new(store);
    let text = TextFrontEnd::new(&engine.checkpoint);
    let c = engine.checkpoint.config.clone();
    let metrics = Arc::new(metrics::Metrics::default());
    let ready = Arc::new(AtomicBool::new(false));
    let (commands, receiver) = std::sync::mpsc::channel();
    let (upload_sender, upload_receiver) = std::sync::mpsc::channel();
    let state = Arc::new(http::State {
        text,
        provenance: engine.checkpoint.public_label(),
        sample_rate: c.codec.sample_rate,
        default_max_audio_tokens: c.speech.max_audio_tokens,
        config: config.clone(),
        store: store.clone(),
        checkpoint: engine.checkpoint.clone(),
        metrics: metrics.clone(),
        ready: ready.clone(),
        commands: std::sync::Mutex::new(Some(commands)),
        uploads: std::sync::Mutex::new(Some(upload_sender)),
    });
    let encoder = {
        let (gpu, checkpoint, store) = (engine.gpu.clone(), engine.checkpoint.clone(), store.clone());
        std::thread::Builder::new()
            .name("drama-voices".into())
            .spawn(move || uploads::run(gpu, checkpoint, store, upload_receiver))
            .map_err(|e| ServerError::Engine(e.to_string()))?
    };
    let capacity = c.max_position_embeddings;
    let worker_config = config.clone();
    // Dropped when the worker returns or panics: a worker that ends on its own (a failed
    // start, a panic) stops the service too, rather than leave it answering 503 forever.
    let (worker_alive, worker_ended) = tokio::sync::oneshot::channel::<()>();
    let worker = std::thread::Builder::new()
        .name("drama-gpu".into())
        .spawn(move || {
            let _alive = worker_alive;
            worker::run(engine, worker_config, capacity, metrics, ready, receiver)
        })
        .map_err(|e| ServerError::Engine(e.to_string()))?;
    let stop = async move {
        tokio::select! {
            () = shutdown => {}
            _ = worker_ended => {}
        }
    };
    let result = http::listen(state, listener, stop).await;
    // The job sender is gone: the worker drains and ends.
    let worker_result = tokio::task::spawn_blocking(move || worker.join())
        .await
        .map_err(|e| ServerError::Engine(e.to_string()))?
        .map_err(|_| ServerError::Engine("the GPU worker panicked".into()))?;
    // So is the upload sender: the encoder finishes the upload it holds and ends.
    tokio::task::spawn_blocking(move || encoder.join())
        .await
        .map_err(|e| ServerError::Engine(e.to_string()))?
        .map_err(|_| ServerError::Engine("the voice encoder panicked".into()))?;
    result?;
    worker_result.map_err(ServerError::Engine)
}
