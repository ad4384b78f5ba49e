//! The checkpoint the user gave, end to end: the same seed twice, voices A, B, then A
//! again, and a real `drama serve` on loopback (streamed == whole; a request cancelled
//! mid-stream, then the same request again, equals a fresh process's answer).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use drama_engine::session::Engine;
use drama_engine::text::TextFrontEnd;
use drama_engine::tower::VoiceTower;
use drama_engine::voice::prefix_from_wav;

use super::Plant;
use super::exact::{differing_bits, recording, request, speak};
use super::receipt::{Check, Measured};

/// The text every check speaks.
const TEXT: &str = "A receipt is proof of what ran. Every check is kept.";

/// Seconds a `drama serve` may take to load and answer `/ready`.
const SERVER_START_LIMIT: Duration = Duration::from_secs(300);

/// The checks on `engine` (the given checkpoint); `serve_args` start `drama serve` on it
/// (`--checkpoint ...`, `--backend ...`).
pub fn checks(engine: &Engine, seed: u64, serve_args: &[String], scratch: &Path, plant: &Plant) -> Vec<Check> {
    let text = match text_ids(engine) {
        Ok(text) => text,
        Err(e) => return vec![Check::run("given.text", || Err(e))],
    };
    let mut checks = vec![
        Check::run("given.same-seed", || {
            let a = speak(engine, &request(text.clone(), None, seed))?;
            let mut b = speak(engine, &request(text.clone(), None, seed))?;
            plant.corrupt("given.same-seed", &mut b);
            Ok(Measured::exact(
                differing_bits(&a, &b),
                format!("{} samples, one seed, twice", a.len()),
            ))
        }),
        Check::run("given.voice-a-b-a", || {
            let tower = VoiceTower::new(engine.gpu.clone(), &engine.checkpoint)?;
            let voice_b = prefix_from_wav(&recording(), &tower)?;
            let a = speak(engine, &request(text.clone(), None, seed))?;
            let b = speak(engine, &request(text.clone(), Some(voice_b), seed))?;
            ensure!(differing_bits(&a, &b) > 0, "voices A and B gave the same samples");
            let mut again = speak(engine, &request(text.clone(), None, seed))?;
            plant.corrupt("given.voice-a-b-a", &mut again);
            Ok(Measured::exact(
                differing_bits(&a, &again),
                format!("{} samples of voice A, before and after voice B", a.len()),
            ))
        }),
    ];
    checks.extend(serve_checks(seed, serve_args, scratch, plant));
    checks
}

fn text_ids(engine: &Engine) -> Result<Vec<u32>> {
    let segments = TextFrontEnd::new(&engine.checkpoint).segments_for(TEXT, 24)?;
    Ok(segments.concat())
}

/// A `drama serve` child on an ephemeral loopback port; killed when dropped.
struct Server {
    child: Child,
    base: String,
}

impl Server {
    fn start(serve_args: &[String], data_dir: &Path) -> Result<Server> {
        let mut child = Command::new(std::env::current_exe().context("finding the drama binary")?)
            .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(serve_args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting drama serve")?;
        let stderr = child.stderr.take().context("drama serve's stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        let base = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(rest) = line.split("listening on ").nth(1) {
                        break rest.trim().to_string();
                    }
                }
                _ => bail!("drama serve exited before listening"),
            }
        };
        // Keep reading its stderr so it never blocks writing it.
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
        let server = Server { child, base };
        let started = Instant::now();
        while started.elapsed() < SERVER_START_LIMIT {
            if server
                .agent()
                .get(format!("{}/ready", server.base))
                .call()
                .is_ok_and(|r| r.status() == 200)
            {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("drama serve did not become ready within {SERVER_START_LIMIT:?}")
    }

    fn agent(&self) -> ureq::Agent {
        ureq::Agent::config_builder().http_status_as_error(false).build().into()
    }

    fn speech(&self, body: &serde_json::Value) -> Result<ureq::http::Response<ureq::Body>> {
        let response = self
            .agent()
            .post(format!("{}/v1/audio/speech", self.base))
            .header("content-type", "application/json")
            .send(body.to_string().as_bytes())?;
        ensure!(
            response.status() == 200,
            "POST /v1/audio/speech answered {}",
            response.status()
        );
        Ok(response)
    }

    /// The whole answer's body.
    fn whole(&self, body: &serde_json::Value) -> Result<Vec<u8>> {
        Ok(self.speech(body)?.into_body().read_to_vec()?)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

fn serve_checks(seed: u64, serve_args: &[String], scratch: &Path, plant: &Plant) -> Vec<Check> {
    let body = serde_json::json!({
        "model": "drama-3",
        "input": TEXT,
        "seed": seed,
        "response_format": "pcm",
        "max_audio_tokens": 24,
    });
    let mut streamed_body = body.clone();
    streamed_body["stream_format"] = "audio".into();
    let servers = (|| -> Result<(Server, Server)> {
        Ok((
            Server::start(serve_args, &scratch.join("serve-a"))?,
            Server::start(serve_args, &scratch.join("serve-b"))?,
        ))
    })();
    let (first, fresh) = match servers {
        Ok(servers) => servers,
        Err(e) => {
            let why = format!("{e:#}");
            return vec![
                Check::run("given.serve-stream-whole", || Err(anyhow::anyhow!(why.clone()))),
                Check::skipped("given.serve-after-cancel", "drama serve did not start"),
            ];
        }
    };
    vec![
        Check::run("given.serve-stream-whole", || {
            let whole = fresh.whole(&body)?;
            let mut streamed = Vec::new();
            fresh
                .speech(&streamed_body)?
                .into_body()
                .into_reader()
                .read_to_end(&mut streamed)?;
            plant.corrupt_bytes("given.serve-stream-whole", &mut streamed);
            Ok(Measured::exact(
                differing_bytes(&whole, &streamed),
                format!("{} bytes of PCM over HTTP, streamed vs whole", whole.len()),
            ))
        }),
        Check::run("given.serve-after-cancel", || {
            // Read the stream's first bytes, then hang up mid-stream.
            let mut reader = first.speech(&streamed_body)?.into_body().into_reader();
            let mut opening = [0u8; 2];
            reader.read_exact(&mut opening)?;
            drop(reader);
            let mut again = first.whole(&body)?;
            plant.corrupt_bytes("given.serve-after-cancel", &mut again);
            let fresh_answer = fresh.whole(&body)?;
            Ok(Measured::exact(
                differing_bytes(&again, &fresh_answer),
                format!(
                    "{} bytes, after a stream hung up on after 2 bytes vs a fresh process's",
                    fresh_answer.len()
                ),
            ))
        }),
    ]
}

fn differing_bytes(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count() + a.len().abs_diff(b.len())
}
