//! Routing, request handling and response encoding.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use base64::Engine as _;
use bytes::Bytes;
use drama_checkpoint::Checkpoint;
use drama_engine::audio::AudioEncoder;
use drama_engine::batch::Batcher;
use drama_engine::sampling::SamplingParams;
use drama_engine::synth::{SpeechSettings, Stop, SynthesisRequest};
use drama_engine::text::TextFrontEnd;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full, Limited, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, oneshot};

use crate::admission::Place;
use crate::api::{ApiError, Policy, StreamFormat, parse_speech};
use crate::metrics::Metrics;
use crate::openai_voices;
use crate::stall::WriteStallLimit;
use crate::unread::{Chunk, Held, check_room};
use crate::uploads::{MAX_UPLOAD_BYTES, MAX_UPLOADS, Upload};
use crate::voices::VoiceStore;
use crate::worker::{Outcome, SpeakJob};
use crate::{ServerConfig, ServerError};

/// A response body. A streamed one fails (and hyper aborts the connection, so the client
/// sees a truncated transfer, not a finished one) when its synthesis fails.
pub(crate) type Body = BoxBody<Bytes, std::io::Error>;

/// What every handler shares.
pub struct State {
    pub text: TextFrontEnd,
    pub provenance: String,
    pub sample_rate: u32,
    pub default_max_audio_tokens: usize,
    pub config: ServerConfig,
    pub store: Arc<VoiceStore>,
    /// The checkpoint served, which saved voices must have been made for.
    pub checkpoint: Arc<Checkpoint>,
    pub metrics: Arc<Metrics>,
    pub ready: Arc<AtomicBool>,
    /// The worker's job channel; taken when shutdown begins, so the worker ends once its
    /// work is done even while connections linger.
    pub commands: Mutex<Option<std::sync::mpsc::Sender<SpeakJob>>>,
    /// The voice encoder's channel; taken when shutdown begins, like `commands`.
    pub uploads: Mutex<Option<std::sync::mpsc::Sender<Upload>>>,
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

pub(crate) fn json(status: u16, value: serde_json::Value) -> Response<Body> {
    let mut response = Response::new(full(value.to_string()));
    *response.status_mut() = StatusCode::from_u16(status).expect("valid status");
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn error(e: &ApiError) -> Response<Body> {
    let mut response = Response::new(full(e.body()));
    *response.status_mut() = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if e.status == 429 {
        response
            .headers_mut()
            .insert("retry-after", HeaderValue::from_static("1"));
    }
    // A body refused before its end (too large, or too slow) is left unread, so the
    // connection cannot carry another request: the client is told it closes.
    if matches!(e.status, 408 | 413) {
        response
            .headers_mut()
            .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Names `fields` in the reply's `x-drama-unapplied-fields` header: fields a request gave
/// that were accepted but change nothing (none: no header).
pub(crate) fn mark_unapplied(response: &mut Response<Body>, fields: &[&str]) {
    if !fields.is_empty() {
        let value = HeaderValue::from_str(&fields.join(", ")).expect("field names are header-safe");
        response.headers_mut().insert("x-drama-unapplied-fields", value);
    }
}

/// Reads a request's body, at most `limit` bytes, within the client timeout.
pub(crate) async fn read_body(state: &State, request: Request<Incoming>, limit: usize) -> Result<Bytes, ApiError> {
    let timeout = state.config.client_timeout;
    let collected = tokio::time::timeout(timeout, Limited::new(request.into_body(), limit).collect())
        .await
        .map_err(|_| {
            ApiError::status(
                408,
                format!("the body did not arrive within {} s", timeout.as_secs_f64()),
            )
        })?;
    collected.map(|collected| collected.to_bytes()).map_err(|e| {
        if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
            ApiError::status(413, format!("the body is larger than {limit} bytes"))
        } else {
            ApiError::status(400, format!("the body could not be read: {e}"))
        }
    })
}

fn content_type_is(request: &Request<Incoming>, accepted: &[&str]) -> bool {
    let value = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    accepted.contains(&essence.as_str())
}

/// A streamed response's body: `header` (a WAV header, or nothing), each chunk of PCM as
/// it comes (16-bit; in SSE a `speech.audio.delta` event of base64 audio), then the end:
/// `speech.audio.done` (SSE) or the end of the bytes if the job finished, else an `error`
/// event carrying the body an error response would have (SSE) or a failed body, which makes
/// hyper abort the transfer so that the client cannot take it for a finished one. `place`
/// (the request's place in flight) is released when the job ends, not when the client has
/// read the last of its audio; each chunk stays counted as unread audio (see `unread`) until
/// its bytes are written. Call within a tokio runtime.
fn streamed_body(
    encoder: Box<dyn AudioEncoder>,
    chunks: mpsc::UnboundedReceiver<Chunk>,
    done: oneshot::Receiver<Outcome>,
    place: impl Send + Sync + 'static,
    sse: bool,
    metrics: Arc<Metrics>,
) -> Body {
    let frame = move |bytes: Vec<u8>| -> Vec<u8> {
        if sse && !bytes.is_empty() {
            let audio = base64::engine::general_purpose::STANDARD.encode(&bytes);
            format!(
                "event: speech.audio.delta\ndata: {}\n\n",
                serde_json::json!({"type": "speech.audio.delta", "audio": audio})
            )
            .into_bytes()
        } else {
            bytes
        }
    };
    // The chunks and the tail (which ends the file) share the encoder.
    let encoder = Arc::new(Mutex::new(encoder));
    let chunk_encoder = encoder.clone();
    // Each chunk stays counted as unread until hyper has written (and dropped) its bytes.
    let chunks = futures_util::stream::unfold(chunks, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) }).map(
        move |chunk| {
            let bytes = chunk_encoder.lock().expect("encoder lock").push(&chunk.pcm);
            bytes
                .map(|bytes| chunk.held.attach(frame(bytes)))
                .map_err(std::io::Error::other)
        },
    );
    let (ended, outcome) = oneshot::channel();
    tokio::spawn(async move {
        let outcome = done.await;
        drop(place);
        let _ = ended.send(outcome);
    });
    let tail = futures_util::stream::once(async move {
        // A runtime shutting down drops the task: as if the worker dropped the job.
        let outcome = outcome.await.unwrap_or_else(Err);
        let (tokens, capped) = match &outcome {
            Ok(Outcome::Ran(stats)) => (stats.tokens, stats.capped_segments),
            _ => (0, 0),
        };
        let failure = failure(outcome);
        if failure.is_some() {
            metrics.failed_streams.fetch_add(1, Ordering::SeqCst);
        }
        let last = match failure {
            None => encoder
                .lock()
                .expect("encoder lock")
                .finish()
                .map_err(std::io::Error::other)?,
            Some(_) => Vec::new(),
        };
        match (failure, sse) {
            (None, true) => {
                let mut events = frame(last);
                events.extend(
                    format!(
                        "event: speech.audio.done\ndata: {}\n\n",
                        serde_json::json!({
                            "type": "speech.audio.done",
                            "usage": {"audio_tokens": tokens},
                            "capped_segments": capped,
                        })
                    )
                    .bytes(),
                );
                Ok(Bytes::from(events))
            }
            (None, false) => Ok(Bytes::from(last)),
            (Some(failure), true) => Ok(Bytes::from(format!("event: error\ndata: {}\n\n", failure.body()))),
            (Some(failure), false) => Err(std::io::Error::other(failure.message)),
        }
    });
    let stream = chunks.chain(tail).map(|b| b.map(Frame::data));
    BodyExt::boxed(StreamBody::new(stream))
}

/// Why a job did not finish, as the error its response reports; `None` when it did.
fn failure(outcome: Result<Outcome, oneshot::error::RecvError>) -> Option<ApiError> {
    match outcome {
        Ok(Outcome::Ran(stats)) if stats.stop == Stop::Finished => None,
        Ok(Outcome::Ran(_)) => Some(ApiError::status(503, "the request ran past the server's time limit")),
        Ok(Outcome::ExpiredWaiting) => Some(ApiError::status(
            503,
            "the request waited for free lanes past the server's time limit",
        )),
        Ok(Outcome::Failed(reason)) => Some(ApiError::status(500, format!("synthesis failed: {reason}"))),
        Err(_) => Some(ApiError::status(500, "the engine stopped before the request finished")),
    }
}

/// Sends `message` on the channel in `slot`; 503 once shutdown has taken it.
fn send<T>(slot: &Mutex<Option<std::sync::mpsc::Sender<T>>>, message: T) -> Result<(), ApiError> {
    let shutting_down = || ApiError::status(503, "the engine is shutting down");
    slot.lock()
        .expect("channel lock")
        .as_ref()
        .ok_or_else(shutting_down)?
        .send(message)
        .map_err(|_| shutting_down())
}

async fn route(state: Arc<State>, request: Request<Incoming>) -> Response<Body> {
    let path = request.uri().path().to_string();
    // HEAD is GET without the body: hyper sends the headers of the GET answer (its length
    // included) and leaves the body out.
    let method = match request.method() {
        &Method::HEAD => Method::GET,
        other => other.clone(),
    };
    let response = match (method, path.as_str()) {
        (Method::GET, "/health") => json(200, serde_json::json!({"status": "ok"})),
        (Method::GET, "/ready") => {
            if state.ready.load(Ordering::SeqCst) {
                json(
                    200,
                    serde_json::json!({"status": "ready", "checkpoint": state.provenance}),
                )
            } else {
                json(503, serde_json::json!({"status": "loading"}))
            }
        }
        (Method::GET, "/metrics") => {
            let mut response = Response::new(full(state.metrics.render()));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
            response
        }
        (Method::POST, "/v1/audio/speech") => speech(state.clone(), request).await.unwrap_or_else(|e| error(&e)),
        (Method::POST, "/v1/voices") => save_voice(state.clone(), request).await.unwrap_or_else(|e| error(&e)),
        (Method::POST, "/v1/audio/voices") => openai_voices::create(state.clone(), request)
            .await
            .unwrap_or_else(|e| error(&e)),
        (Method::GET, "/v1/audio/voices") => openai_voices::list(&state),
        (Method::DELETE, p) if p.starts_with(openai_voices::VOICE_PATH) => {
            openai_voices::delete(&state, &p[openai_voices::VOICE_PATH.len()..]).unwrap_or_else(|e| error(&e))
        }
        (Method::GET, "/v1/voices") => {
            let data: Vec<serde_json::Value> = state
                .store
                .list(&state.checkpoint)
                .into_iter()
                .map(|voice| match voice.damaged {
                    false => serde_json::json!({"id": voice.id, "object": "voice"}),
                    true => serde_json::json!({"id": voice.id, "object": "voice", "damaged": true}),
                })
                .collect();
            json(200, serde_json::json!({"object": "list", "data": data}))
        }
        (Method::DELETE, p) if p.starts_with("/v1/voices/") => {
            let id = &p["/v1/voices/".len()..];
            match state.store.delete(id, &state.checkpoint) {
                Ok(true) => json(200, serde_json::json!({"id": id, "deleted": true})),
                Ok(false) => error(&ApiError::status(404, format!("unknown voice '{id}'"))),
                Err(e) => error(&ApiError::status(500, format!("cannot delete voice '{id}': {e}"))),
            }
        }
        _ => match allowed_methods(&path) {
            Some(allowed) => {
                let mut response = error(&ApiError::status(
                    405,
                    format!("{} is not allowed on {path} (only {allowed})", request.method()),
                ));
                response.headers_mut().insert(ALLOW, HeaderValue::from_static(allowed));
                response
            }
            None => error(&ApiError::status(404, format!("no route {path}"))),
        },
    };
    state.metrics.response(response.status().as_u16());
    response
}

/// The methods a route takes, for a 405's `Allow` header; `None` for no route.
fn allowed_methods(path: &str) -> Option<&'static str> {
    match path {
        "/health" | "/ready" | "/metrics" => Some("GET, HEAD"),
        "/v1/audio/speech" => Some("POST"),
        "/v1/voices" | "/v1/audio/voices" => Some("GET, HEAD, POST"),
        p if p.starts_with("/v1/voices/") || p.starts_with(openai_voices::VOICE_PATH) => Some("DELETE"),
        _ => None,
    }
}

async fn save_voice(state: Arc<State>, request: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    if !content_type_is(
        &request,
        &["audio/wav", "audio/x-wav", "audio/wave", "application/octet-stream"],
    ) {
        return Err(ApiError::status(415, "send the reference recording as audio/wav"));
    }
    let place = take_upload_place(&state)?;
    let wav = read_body(&state, request, MAX_UPLOAD_BYTES).await?.to_vec();
    let id = encode_upload(&state, wav, place).await?;
    Ok(json(201, serde_json::json!({"id": id, "object": "voice"})))
}

/// A place among the uploads being received or encoded; 429 when all are taken.
pub(crate) fn take_upload_place(state: &State) -> Result<Place, ApiError> {
    Place::take(&state.metrics, |m| &m.voice_uploads, MAX_UPLOADS).ok_or_else(|| {
        ApiError::status(
            429,
            format!("{MAX_UPLOADS} voice uploads are already being received or encoded; retry later"),
        )
    })
}

/// Encodes and saves a reference recording; its voice id. The upload keeps its place until
/// it is encoded (or skipped): a client that leaves meanwhile frees no room for another.
pub(crate) async fn encode_upload(state: &State, wav: Vec<u8>, place: Place) -> Result<String, ApiError> {
    let (reply, answer) = oneshot::channel();
    send(&state.uploads, Upload { wav, reply, place })?;
    answer
        .await
        .map_err(|_| ApiError::status(503, "the voice encoder stopped"))?
}

fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

async fn speech(state: Arc<State>, request: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    if !content_type_is(&request, &["application/json"]) {
        return Err(ApiError::status(415, "the body must be application/json"));
    }
    let version = request.version();
    let body = read_body(&state, request, state.config.max_body).await?;
    let policy = Policy {
        allow_request_gamma: state.config.allow_request_gamma,
        max_audio_tokens: state.default_max_audio_tokens,
        max_input_chars: state.config.max_input_chars,
    };
    let speech = parse_speech(&body, &policy)?;
    // Without chunked transfer (HTTP/1.0) a streamed body ends by closing the connection, so
    // a stream cut short by a failure would look complete; SSE ends with an event either way.
    if speech.stream_format == StreamFormat::Audio && version < hyper::Version::HTTP_11 {
        return Err(ApiError::invalid(
            "stream_format",
            "streaming raw audio needs HTTP/1.1 (a failed stream must show as cut short); use \"sse\", or no stream_format for the whole file",
        ));
    }
    let gamma = speech.gamma.unwrap_or(state.config.gamma);
    if Batcher::lanes_needed(gamma) > state.config.max_lanes {
        return Err(ApiError::invalid(
            "gamma",
            "a `gamma` other than 1 guides with two lanes; this server has one (--max-lanes 1)",
        ));
    }
    let max_audio_tokens = speech.max_audio_tokens.unwrap_or(state.default_max_audio_tokens);
    // Refused before a place is taken; the request's own check below cannot fail on it.
    if state.text.budget(max_audio_tokens).is_none() {
        return Err(ApiError::invalid(
            "max_audio_tokens",
            "leaves no room for text in the context",
        ));
    }
    // A place in flight is taken before the text is tokenized, so the queue's limit bounds
    // that work too; it runs off the async threads (a long input takes a while).
    let limit = state
        .config
        .queue
        .saturating_add((state.config.max_lanes / Batcher::lanes_needed(gamma)).max(1));
    check_room(&state.metrics)?;
    let guard = Place::take(&state.metrics, |m| &m.requests_in_flight, limit)
        .ok_or_else(|| ApiError::status(429, "every lane is busy and the queue is full; retry later"))?;
    let shared = state.clone();
    let (input, voice) = (speech.input.clone(), speech.voice.clone());
    // The tokenizing task holds the place while it runs, even if the client leaves and
    // this handler is dropped, and hands it back.
    let seed = speech.seed.unwrap_or_else(random_seed);
    let mut settings = SpeechSettings {
        prefix: None,
        gamma,
        guidance: state.config.guidance,
        sampling: SamplingParams {
            temperature: speech.temperature,
            top_k: speech.top_k,
            top_p: speech.top_p,
            seed,
        },
        max_audio_tokens,
    };
    let (request, later_text, guard) = tokio::task::spawn_blocking(move || {
        settings.prefix = shared.store.prefix_for(&voice, &shared.checkpoint)?;
        let (request, later_text) = SynthesisRequest::opening(&shared.text, &input, settings)
            .map_err(|e| ApiError::invalid("input", e.to_string()))?;
        Ok::<_, ApiError>((request, later_text, guard))
    })
    .await
    .map_err(|e| ApiError::status(500, format!("preparing the request failed: {e}")))??;
    // The format must hold the checkpoint's sample rate before any work starts.
    let encoder = speech
        .response_format
        .encoder(state.sample_rate)
        .map_err(|e| ApiError::invalid("response_format", e.to_string()))?;
    // The text after the first sentence is cut while the first is spoken (its speech starts
    // however long the rest is); the response waits for it, so text that cannot be spoken
    // is still refused before any audio. The cutting task holds the place meanwhile.
    let (cut, rest_cut) = oneshot::channel();
    let later = match later_text {
        Some(text) => {
            let (segments, later) = std::sync::mpsc::channel();
            let shared = state.clone();
            tokio::task::spawn_blocking(move || {
                let result = text.segments(&shared.text);
                let answer = result.as_ref().map(|_| ()).map_err(ToString::to_string);
                let _ = segments.send(result);
                let _ = cut.send((answer, guard));
            });
            Some(later)
        }
        None => {
            let _ = cut.send((Ok(()), guard));
            None
        }
    };
    let (accepted, accepted_answer) = oneshot::channel();
    let (chunks, mut chunk_receiver) = mpsc::unbounded_channel();
    let (done, done_answer) = oneshot::channel();
    send(
        &state.commands,
        SpeakJob {
            request,
            later,
            accepted,
            chunks,
            done,
            deadline: Instant::now() + state.config.request_timeout,
        },
    )?;
    accepted_answer
        .await
        .map_err(|_| ApiError::status(503, "the engine stopped"))??;
    let (cut, guard) = rest_cut
        .await
        .map_err(|e| ApiError::status(500, format!("cutting the text failed: {e}")))?;
    cut.map_err(|e| ApiError::invalid("input", e))?;
    let content_type = match speech.stream_format {
        StreamFormat::Sse => "text/event-stream",
        StreamFormat::Whole | StreamFormat::Audio => speech.response_format.media_type(),
    };
    let rate = state.sample_rate;
    // Segments that reached the token cap, where the whole file's header can say so.
    let mut capped = None;
    let body: Body = match speech.stream_format {
        StreamFormat::Whole => {
            let (mut pcm, mut held) = (Vec::new(), Held::new(0, &state.metrics));
            while let Some(chunk) = chunk_receiver.recv().await {
                pcm.extend(chunk.pcm);
                held.absorb(chunk.held);
            }
            let outcome = done_answer.await;
            if let Ok(Outcome::Ran(stats)) = &outcome {
                capped = Some(stats.capped_segments);
            }
            if let Some(failure) = failure(outcome) {
                return Err(failure);
            }
            // Encoding minutes of speech takes a while: off the async threads.
            let format = speech.response_format;
            let bytes = tokio::task::spawn_blocking(move || format.encode_whole(&pcm, rate))
                .await
                .map_err(|e| ApiError::status(500, format!("encoding failed: {e}")))?
                .map_err(|e| ApiError::status(500, e.to_string()))?;
            drop(guard);
            full(held.attach(bytes))
        }
        StreamFormat::Audio | StreamFormat::Sse => {
            let sse = speech.stream_format == StreamFormat::Sse;
            streamed_body(encoder, chunk_receiver, done_answer, guard, sse, state.metrics.clone())
        }
    };
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        "x-drama-seed",
        HeaderValue::from_str(&seed.to_string()).expect("digits"),
    );
    headers.insert(
        "x-drama-sample-rate",
        HeaderValue::from_str(&rate.to_string()).expect("digits"),
    );
    if let Ok(value) = HeaderValue::from_str(&state.provenance) {
        headers.insert("x-drama-checkpoint", value);
    }
    if let Some(capped) = capped {
        headers.insert(
            "x-drama-capped-segments",
            HeaderValue::from_str(&capped.to_string()).expect("digits"),
        );
    }
    mark_unapplied(&mut response, &speech.unapplied);
    Ok(response)
}

/// An open client connection: its place among `max_connections`, counted in the metrics
/// while it lasts.
struct Connection {
    _place: tokio::sync::OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Connection {
    fn open(place: tokio::sync::OwnedSemaphorePermit, metrics: Arc<Metrics>) -> Connection {
        metrics.open_connections.fetch_add(1, Ordering::SeqCst);
        Connection { _place: place, metrics }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.metrics.open_connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How long accepting waits after the operating system refused a connection.
const ACCEPT_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

/// Accepts connections until `shutdown`, then waits for the open ones to finish. At most
/// `max_connections` are open at once (later clients wait in the listen backlog), and each
/// closes when its client takes longer than the client timeout to send a request's headers
/// (or to start the next request), or leaves a response unread that long.
pub async fn listen(
    state: Arc<State>,
    listener: std::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServerError> {
    let addr = state.config.addr;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(|reason| ServerError::Bind { addr, reason })?;
    let client_timeout = state.config.client_timeout;
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(client_timeout);
    let places = Arc::new(tokio::sync::Semaphore::new(state.config.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let place = tokio::select! {
            place = places.clone().acquire_owned() => place.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // Out of file descriptors, say: waiting a moment lets connections close
                    // instead of spinning on the same error.
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                };
                let open = Connection::open(place, state.metrics.clone());
                let state = state.clone();
                let service = hyper::service::service_fn(move |request| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(route(state, request).await) }
                });
                let io = TokioIo::new(WriteStallLimit::new(stream, client_timeout));
                let watched = graceful.watch(http.serve_connection(io, service));
                tokio::spawn(async move {
                    let _ = watched.await;
                    drop(open);
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    // New requests on open connections get 503 from here on; the worker and the voice
    // encoder finish what they hold and end.
    state.commands.lock().expect("channel lock").take();
    state.uploads.lock().expect("channel lock").take();
    let limit = state.config.request_timeout + std::time::Duration::from_secs(5);
    drop(state);
    let _ = tokio::time::timeout(limit, graceful.shutdown()).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, Hasher};
    use std::time::Duration;

    use drama_engine::audio::{AudioFormat, SampleFormat, encode_samples};
    use drama_engine::synth::{SynthesisStats, TimeSplit};

    use super::*;

    /// Fresh samples in [-1, 1) for every run (the process's random hasher keys).
    fn random_pcm(n: usize) -> Vec<f32> {
        let state = std::collections::hash_map::RandomState::new();
        (0..n)
            .map(|i| {
                let mut hasher = state.build_hasher();
                hasher.write_usize(i);
                (hasher.finish() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    fn stats(stop: Stop) -> SynthesisStats {
        SynthesisStats {
            tokens: 7,
            samples: 0,
            sample_rate: 24_000,
            wall: Duration::from_millis(5),
            first_audio: None,
            stop,
            time_split: TimeSplit::default(),
            chunks_in_parts: 0,
            capped_segments: 2,
        }
    }

    /// A streamed body over one chunk of `pcm` whose job ended with `outcome` (`None`: the
    /// worker dropped the job): its bytes up to its end or its failure, the failure, and
    /// whether it released its place.
    fn stream(pcm: &[f32], outcome: Option<Outcome>, sse: bool) -> (String, Vec<u8>, Option<String>, bool) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let metrics = Arc::new(Metrics::default());
        let (chunks, chunk_receiver) = mpsc::unbounded_channel();
        chunks.send(Chunk::new(pcm.to_vec(), &metrics)).unwrap();
        drop(chunks);
        let (done, done_answer) = oneshot::channel();
        let fails = !matches!(&outcome, Some(Outcome::Ran(stats)) if stats.stop == Stop::Finished);
        match outcome {
            Some(outcome) => done.send(outcome).unwrap(),
            None => drop(done),
        }
        let place = Arc::new(());
        let (mut bytes, mut failed) = (Vec::new(), None);
        runtime.block_on(async {
            let mut body = streamed_body(
                AudioFormat::Pcm.encoder(24_000).unwrap(),
                chunk_receiver,
                done_answer,
                place.clone(),
                sse,
                metrics.clone(),
            );
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(frame) => bytes.extend_from_slice(&frame.into_data().unwrap()),
                    Err(e) => {
                        failed = Some(e.to_string());
                        break;
                    }
                }
            }
        });
        assert_eq!(metrics.unread_audio_bytes.load(Ordering::SeqCst), 0);
        let failures = metrics.failed_streams.load(Ordering::SeqCst);
        assert_eq!(failures, u64::from(fails), "drama_failed_streams_total");
        (
            String::from_utf8_lossy(&bytes).into_owned(),
            bytes,
            failed,
            Arc::strong_count(&place) == 1,
        )
    }

    #[test]
    fn a_streamed_body_ends_the_way_its_job_ended() {
        let pcm = random_pcm(300);
        let wire = encode_samples(&pcm, SampleFormat::Pcm16);
        // Audio bytes: every sample, then a clean end or a failed body naming why.
        let (_, bytes, failed, released) = stream(&pcm, Some(Outcome::Ran(stats(Stop::Finished))), false);
        assert_eq!((bytes, failed, released), (wire.clone(), None, true));
        for (outcome, why) in [
            (
                Some(Outcome::Ran(stats(Stop::Cancelled))),
                "ran past the server's time limit",
            ),
            (
                Some(Outcome::Failed("a step failed: device lost".to_string())),
                "synthesis failed: a step failed: device lost",
            ),
            (
                Some(Outcome::ExpiredWaiting),
                "waited for free lanes past the server's time limit",
            ),
            (None, "the engine stopped before the request finished"),
        ] {
            let (_, bytes, failed, released) = stream(&pcm, outcome, false);
            assert_eq!(bytes, wire);
            assert!(failed.as_deref().is_some_and(|f| f.contains(why)), "{failed:?}");
            assert!(released);
        }
        // SSE: the deltas, then `speech.audio.done` or an `error` event with the error body.
        let delta = base64::engine::general_purpose::STANDARD.encode(&wire);
        let (text, _, failed, released) = stream(&pcm, Some(Outcome::Ran(stats(Stop::Finished))), true);
        assert!(text.contains(&delta) && failed.is_none() && released);
        assert!(
            text.ends_with(
                "event: speech.audio.done\ndata: {\"capped_segments\":2,\"type\":\"speech.audio.done\",\"usage\":{\"audio_tokens\":7}}\n\n"
            ),
            "{text}"
        );
        for (outcome, code) in [
            (Some(Outcome::Ran(stats(Stop::Cancelled))), 503),
            (Some(Outcome::ExpiredWaiting), 503),
            (Some(Outcome::Failed("boom".into())), 500),
            (None, 500),
        ] {
            let (text, _, failed, released) = stream(&pcm, outcome, true);
            assert!(text.contains(&delta) && failed.is_none() && released);
            assert!(!text.contains("speech.audio.done"), "{text}");
            let event = text.rsplit("event: error\ndata: ").next().unwrap().trim_end();
            let error: serde_json::Value = serde_json::from_str(event).unwrap();
            assert_eq!(error["error"]["code"], code, "{text}");
        }
    }

    /// A streamed request's place in flight is released when its job ends, while its client
    /// has not read a byte yet (a listener playing the audio in real time would otherwise
    /// hold it for the audio's length); the body still carries every chunk and the end, and
    /// its audio counts as unread until the body yields it.
    #[test]
    fn a_streamed_body_releases_its_place_when_the_job_ends_not_when_it_is_read() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let metrics = Arc::new(Metrics::default());
        let unread = || metrics.unread_audio_bytes.load(Ordering::SeqCst);
        let (chunks, chunk_receiver) = mpsc::unbounded_channel();
        let (done, done_answer) = oneshot::channel();
        let place = Arc::new(());
        let pcm = random_pcm(5);
        runtime.block_on(async {
            let mut body = streamed_body(
                AudioFormat::Pcm.encoder(24_000).unwrap(),
                chunk_receiver,
                done_answer,
                place.clone(),
                false,
                metrics.clone(),
            );
            chunks.send(Chunk::new(pcm.clone(), &metrics)).unwrap();
            drop(chunks);
            tokio::task::yield_now().await;
            assert_eq!(Arc::strong_count(&place), 2, "held while the job runs");
            done.send(Outcome::Ran(stats(Stop::Finished))).unwrap();
            tokio::task::yield_now().await;
            assert_eq!(Arc::strong_count(&place), 1, "released when the job ends");
            assert_eq!(unread(), 20, "the unread audio stays counted");
            let mut bytes = Vec::new();
            while let Some(frame) = body.frame().await {
                bytes.extend_from_slice(&frame.unwrap().into_data().unwrap());
            }
            assert_eq!(bytes, encode_samples(&pcm, SampleFormat::Pcm16));
            assert_eq!(unread(), 0, "written audio is no longer counted");
        });
    }
}
