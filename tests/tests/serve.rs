//! `drama serve` as a real process on 127.0.0.1 with a real HTTP client: streamed == whole,
//! repeats, A-B-A voices, cancellation, concurrency, refusals, voices that survive a
//! restart, a bounded soak, graceful shutdown.

use std::io::Read;
use std::path::{Path, PathBuf};

use drama_engine::audio::read_wav;
use drama_tests::server::Server;
use serde_json::{Value, json};

struct Setup {
    _dir: tempfile::TempDir,
    checkpoint: PathBuf,
    data: PathBuf,
}

fn setup(seed: u64) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("tiny");
    drama_fixtures::write_preset("tiny", seed, &checkpoint).unwrap();
    let data = dir.path().join("data");
    Setup {
        checkpoint,
        data,
        _dir: dir,
    }
}

fn request(input: &str, seed: u64) -> Value {
    json!({"model": "drama-3", "input": input, "seed": seed, "response_format": "wav"})
}

fn data_chunk(wav: &[u8]) -> &[u8] {
    let at = wav.windows(4).position(|w| w == b"data").expect("a data chunk");
    &wav[at + 8..]
}

fn sine_wav(path: &Path, rate: u32, seconds: f32, pitch: f32) -> Vec<u8> {
    let bytes = drama_tests::sine_wav(rate, seconds, pitch);
    std::fs::write(path, &bytes).unwrap();
    bytes
}

#[test]
fn streamed_whole_repeated_and_voices_agree() {
    let s = setup(41);
    let server = Server::start(&s.checkpoint, &s.data, &[]);
    let whole = server.speech(&request("Hello there. Second sentence.", 11));
    assert_eq!(whole.status, 200, "{}", String::from_utf8_lossy(&whole.body));
    assert_eq!(whole.header("x-drama-seed"), Some("11"));
    // The checkpoint is named by its manifest digest, never by its path on the server.
    let named = whole.header("x-drama-checkpoint").unwrap();
    let manifest = std::fs::read(s.checkpoint.join("SHA256SUMS")).unwrap();
    let digest = drama_checkpoint::manifest::sha256_hex(&manifest);
    assert_eq!(named, format!("local sha256:{}", &digest[..16]));
    assert_eq!(server.get("/ready").json()["checkpoint"], named);
    let pcm = read_wav(&whole.body).unwrap();
    assert!(pcm.frames > 0 && pcm.frames.is_multiple_of(12));
    // Streamed audio: the same samples, under a header of unknown sizes.
    let mut streamed = Vec::new();
    let mut body = json!({"model": "drama-3", "input": "Hello there. Second sentence.", "seed": 11, "stream_format": "audio", "response_format": "wav"});
    server.open_stream(&body).read_to_end(&mut streamed).unwrap();
    assert_eq!(&streamed[4..8], &[0xFF; 4], "a streamed WAV has an unknown RIFF size");
    assert_eq!(data_chunk(&streamed), data_chunk(&whole.body));
    // Raw PCM, whole and as SSE deltas.
    body["response_format"] = json!("pcm");
    body["stream_format"] = Value::Null;
    let raw = server.speech(&body);
    assert_eq!(raw.body, data_chunk(&whole.body));
    body["stream_format"] = json!("sse");
    let events = String::from_utf8(server.speech(&body).body).unwrap();
    let mut decoded = Vec::new();
    for line in events.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let event: Value = serde_json::from_str(line).unwrap();
        if event["type"] == "speech.audio.delta" {
            use base64::Engine as _;
            decoded.extend(
                base64::engine::general_purpose::STANDARD
                    .decode(event["audio"].as_str().unwrap())
                    .unwrap(),
            );
        }
    }
    assert!(events.contains("event: speech.audio.done"));
    assert_eq!(decoded, raw.body, "SSE deltas carry the same PCM");
    // Segments cut at the token cap are counted: in the whole file's header and in the SSE
    // end event, alike for the same request (two tokens: every segment reaches the cap).
    let done_event = |events: &str| -> Value {
        let last = events.lines().rev().find_map(|l| l.strip_prefix("data: ")).unwrap();
        serde_json::from_str(last).unwrap()
    };
    let mut capped = request("Hello there. Second sentence.", 11);
    capped["max_audio_tokens"] = json!(2);
    let counted: usize = server
        .speech(&capped)
        .header("x-drama-capped-segments")
        .unwrap()
        .parse()
        .unwrap();
    assert!(counted >= 1, "{counted}");
    capped["stream_format"] = json!("sse");
    let capped_events = String::from_utf8(server.speech(&capped).body).unwrap();
    assert_eq!(done_event(&capped_events)["capped_segments"], counted);
    assert_eq!(
        done_event(&events)["capped_segments"].to_string(),
        whole.header("x-drama-capped-segments").unwrap()
    );
    // Repeats are identical; the seed matters.
    assert_eq!(
        server.speech(&request("Hello there. Second sentence.", 11)).body,
        whole.body
    );
    assert_ne!(
        server.speech(&request("Hello there. Second sentence.", 12)).body,
        whole.body
    );
    // Voices: A, then B, then A again give what fresh runs give.
    let dir = s.data.parent().unwrap();
    let a = server.post(
        "/v1/voices",
        "audio/wav",
        &sine_wav(&dir.join("a.wav"), 16000, 0.3, 0.05),
    );
    let b = server.post(
        "/v1/voices",
        "audio/wav",
        &sine_wav(&dir.join("b.wav"), 22050, 0.3, 0.21),
    );
    assert_eq!((a.status, b.status), (201, 201), "{}", String::from_utf8_lossy(&a.body));
    let (a, b) = (
        a.json()["id"].as_str().unwrap().to_string(),
        b.json()["id"].as_str().unwrap().to_string(),
    );
    assert_ne!(a, b);
    let with = |voice: &str| {
        let mut r = request("Voices differ.", 5);
        r["voice"] = json!({"id": voice});
        server.speech(&r).body
    };
    let (first_a, then_b, again_a) = (with(&a), with(&b), with(&a));
    assert_eq!(first_a, again_a, "A-B-A: the second A differs from the first");
    assert_ne!(first_a, then_b);
    let listed = server.get("/v1/voices").json();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&a.as_str()) && ids.contains(&b.as_str()));
    // Voices survive a restart; deleting one removes it.
    assert_eq!(server.terminate(), Some(0), "SIGTERM ends the server cleanly");
    let server = Server::start(&s.checkpoint, &s.data, &[]);
    let mut r = request("Voices differ.", 5);
    r["voice"] = json!(a);
    assert_eq!(server.speech(&r).body, first_a, "a saved voice after a restart");
    assert_eq!(server.delete(&format!("/v1/voices/{b}")).status, 200);
    assert_eq!(server.delete(&format!("/v1/voices/{b}")).status, 404);
    r["voice"] = json!(b);
    let gone = server.speech(&r);
    assert_eq!(
        (gone.status, gone.json()["error"]["param"].as_str()),
        (400, Some("voice"))
    );
    // Another checkpoint sharing the data directory neither lists nor uses voice A.
    assert_eq!(server.terminate(), Some(0));
    let other = s.data.parent().unwrap().join("other");
    drama_fixtures::write_preset("tiny", 42, &other).unwrap();
    let server = Server::start(&other, &s.data, &[]);
    assert_eq!(server.get("/v1/voices").json()["data"], json!([]));
    r["voice"] = json!(a);
    let foreign = server.speech(&r);
    let error = &foreign.json()["error"];
    assert_eq!((foreign.status, error["param"].as_str()), (400, Some("voice")));
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("made for checkpoint") && message.contains("POST /v1/voices"),
        "{message}"
    );
    // Nor deletes it: it is the other service's.
    assert_eq!(server.delete(&format!("/v1/voices/{a}")).status, 404);
    assert!(s.data.join("voices").join(format!("{a}.safetensors")).exists());
    // A file with no readable voice header (damaged, or placed there from outside) is
    // listed as damaged, refused with a way out, and deletable.
    let damaged = "00112233aabbccdd";
    let damaged_file = s.data.join("voices").join(format!("{damaged}.safetensors"));
    std::fs::write(&damaged_file, b"not a voice file").unwrap();
    assert_eq!(
        server.get("/v1/voices").json()["data"],
        json!([{"id": damaged, "object": "voice", "damaged": true}])
    );
    r["voice"] = json!(damaged);
    let refused = server.speech(&r);
    let message = refused.json()["error"]["message"].as_str().unwrap().to_string();
    assert_eq!(refused.status, 400);
    assert!(message.contains(&format!("DELETE /v1/voices/{damaged}")), "{message}");
    assert_eq!(server.delete(&format!("/v1/voices/{damaged}")).status, 200);
    assert!(!damaged_file.exists());
    assert_eq!(server.get("/v1/voices").json()["data"], json!([]));
    // `{"id": "default"}` is the default voice, as "default" is.
    let mut by_object = request("Hello there.", 12);
    by_object["voice"] = json!({"id": "default"});
    let mut by_name = by_object.clone();
    by_name["voice"] = json!("default");
    let (object_answer, name_answer) = (server.speech(&by_object), server.speech(&by_name));
    assert_eq!(
        object_answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&object_answer.body)
    );
    assert_eq!(object_answer.body, name_answer.body);
}

#[test]
fn cancelled_and_concurrent_requests_do_not_disturb_others() {
    let s = setup(43);
    // No memory for compiled steps beyond the one in use: every new row count compiles
    // again, and each response must still match its solo run.
    let server = Server::start(
        &s.checkpoint,
        &s.data,
        &["--max-lanes", "6", "--queue", "16", "--step-cache-mib", "0"],
    );
    let inputs = [
        "First voice speaks.",
        "Another line here.",
        "Third request!",
        "Short.",
        "Yet one more.",
    ];
    let solo: Vec<Vec<u8>> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| server.speech(&request(t, i as u64)).body)
        .collect();
    // Concurrent requests: each equals its solo run.
    let base = server.base.clone();
    let handles: Vec<_> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let base = base.clone();
            let body = request(t, i as u64).to_string();
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
                let mut response = agent
                    .post(format!("{base}/v1/audio/speech"))
                    .header("content-type", "application/json")
                    .send(body)
                    .unwrap();
                let mut bytes = Vec::new();
                response.body_mut().as_reader().read_to_end(&mut bytes).unwrap();
                bytes
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(
            h.join().unwrap(),
            solo[i],
            "concurrent request {i} differs from its solo run"
        );
    }
    // An early disconnect: read the first bytes of a stream, then drop it. Twelve sentences
    // take far longer than the wait below, so the stream ends by its cancellation, which
    // the server counts. As WAV, whose bytes follow each chunk: the tiny checkpoint's whole
    // speech is shorter than the delay before MP3's first frame.
    let input: String = (0..12)
        .map(|i| format!("Sentence {i} of the one that gets cut off. "))
        .collect();
    let long =
        json!({"model": "drama-3", "input": input, "seed": 99, "stream_format": "audio", "response_format": "wav"});
    let cancellations = server.metric("drama_cancellations_total");
    let mut reader = server.open_stream(&long);
    let mut first = [0u8; 64];
    reader.read_exact(&mut first).unwrap();
    drop(reader);
    assert!(
        gauge_reaches(&server, "drama_cancellations_total", cancellations + 1.0),
        "the disconnected stream was not cancelled"
    );
    let mut settled = false;
    for _ in 0..200 {
        if server.metric("drama_active_lanes") == 0.0 {
            settled = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(settled, "the cancelled request's lanes were not freed");
    // The next request is unaffected: it matches its fresh run.
    assert_eq!(server.speech(&request(inputs[0], 0)).body, solo[0]);
    // A bounded soak: 4 clients x 4 requests, no failure, gauges back to zero.
    let handles: Vec<_> = (0..4)
        .map(|c| {
            let base = base.clone();
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
                (0..4)
                    .map(|r| {
                        let body = request("Soak test line.", (c * 10 + r) as u64).to_string();
                        agent
                            .post(format!("{base}/v1/audio/speech"))
                            .header("content-type", "application/json")
                            .send(body)
                            .unwrap()
                            .status()
                            .as_u16()
                    })
                    .collect::<Vec<u16>>()
            })
        })
        .collect();
    for h in handles {
        assert!(h.join().unwrap().iter().all(|&s| s == 200), "a soak request failed");
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(server.metric("drama_active_lanes"), 0.0);
    assert_eq!(server.metric("drama_queue_depth"), 0.0);
    // The soak's mixes of prompts and running jobs met many row counts; with no budget only
    // the last step's stays compiled.
    assert_eq!(server.metric("drama_compiled_steps"), 1.0);
    assert!(server.metric("drama_compiled_step_bytes") > 0.0);
    assert_eq!(server.terminate(), Some(0));
}

/// `server` refuses a request with `gamma` = `refused` (400 naming `gamma`) and then serves
/// one with `served` (none: the server's own).
fn refuses_gamma_then_serves(server: &Server, refused: f32, served: Option<f32>) {
    let answer = server.speech(&json!({"model": "drama-3", "input": "hi", "gamma": refused}));
    assert_eq!(
        (answer.status, answer.json()["error"]["param"].as_str()),
        (400, Some("gamma"))
    );
    let mut request = json!({"model": "drama-3", "input": "hi", "seed": 1});
    if let Some(gamma) = served {
        request["gamma"] = json!(gamma);
    }
    assert_eq!(server.speech(&request).status, 200);
}

#[test]
fn refusals_have_the_right_status_and_name_the_field() {
    let s = setup(47);
    // A time limit of zero (every request would fail) or past a week is refused at start.
    for limit in ["0", "604801", &u64::MAX.to_string()] {
        let checkpoint = s.checkpoint.to_str().unwrap();
        let (code, _, err) =
            drama_tests::drama_text(&["serve", "--checkpoint", checkpoint, "--request-timeout", limit]);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains("--request-timeout"), "{err}");
    }
    // A step-cache budget past a TiB is refused at start, naming the flag.
    let checkpoint = s.checkpoint.to_str().unwrap();
    let (code, _, err) = drama_tests::drama_text(&["serve", "--checkpoint", checkpoint, "--step-cache-mib", "1048577"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--step-cache-mib"), "{err}");
    // So are more lanes than a session takes.
    let huge = u64::MAX.to_string();
    let (code, _, err) = drama_tests::drama_text(&["serve", "--checkpoint", checkpoint, "--max-lanes", &huge]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--max-lanes must be in 1..=4096"), "{err}");
    // A guidance scale a request could not ask for is refused at start too.
    let (code, _, err) = drama_tests::drama_text(&["serve", "--checkpoint", checkpoint, "--gamma", "50"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("--gamma") && err.contains("gamma 50 must be in (0, 10]"),
        "{err}"
    );
    // A busy address and an unusable data directory are refused before the checkpoint is
    // even opened (here it does not exist), naming the operating system's reason once.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_addr = busy.local_addr().unwrap().to_string();
    let missing = s.data.join("no-checkpoint-here");
    let missing = missing.to_str().unwrap();
    let (code, _, err) = drama_tests::drama_text(&["serve", "--checkpoint", missing, "--addr", &busy_addr]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(&format!("cannot listen on {busy_addr}")), "{err}");
    assert_eq!(err.matches("os error").count(), 1, "{err}");
    let file = s.data.with_extension("file");
    std::fs::write(&file, b"not a directory").unwrap();
    let (code, _, err) = drama_tests::drama_text(&[
        "serve",
        "--checkpoint",
        missing,
        "--addr",
        "127.0.0.1:0",
        "--data-dir",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(&format!("data directory {}", file.display())), "{err}");
    assert_eq!(err.matches("os error").count(), 1, "{err}");
    drop(busy);
    let server = Server::start(
        &s.checkpoint,
        &s.data,
        &["--max-body-bytes", "4096", "--max-input-chars", "300"],
    );
    let mut checks = 0;
    let mut expect = |answer: drama_tests::server::Answer, status: u16, param: Option<&str>| {
        assert_eq!(answer.status, status, "{}", String::from_utf8_lossy(&answer.body));
        let body = answer.json();
        assert!(body["error"]["message"].is_string());
        if let Some(param) = param {
            assert_eq!(body["error"]["param"], param, "{body}");
        }
        checks += 1;
    };
    expect(
        server.post("/v1/audio/speech", "application/json", b"{not json"),
        400,
        None,
    );
    expect(
        server.post(
            "/v1/audio/speech",
            "text/plain",
            request("hi", 1).to_string().as_bytes(),
        ),
        415,
        None,
    );
    expect(
        server.speech(&json!({"model": "drama-3", "input": "  "})),
        400,
        Some("input"),
    );
    expect(
        server.speech(&json!({"model": "drama-3", "input": "a".repeat(301)})),
        400,
        Some("input"),
    );
    expect(
        server.speech(&json!({"model": "drama-3", "input": "hi", "voice": "nobody"})),
        400,
        Some("voice"),
    );
    expect(
        server.speech(&json!({"model": "tts-2", "input": "hi"})),
        400,
        Some("model"),
    );
    expect(
        server.speech(&json!({"model": "tts-1", "input": "hi", "instructions": 3})),
        400,
        Some("instructions"),
    );
    let aac = server.speech(&json!({"model": "drama-3", "input": "hi", "response_format": "aac"}));
    assert!(
        aac.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no AAC") && m.contains("mp3, opus, flac")),
        "{}",
        String::from_utf8_lossy(&aac.body)
    );
    expect(aac, 400, Some("response_format"));
    expect(
        server.speech(&json!({"model": "drama-3", "input": "hi", "speed": 1.5})),
        400,
        Some("speed"),
    );
    expect(
        server.speech(&json!({"model": "drama-3", "input": "hi", "gamma": 2.0})),
        400,
        Some("gamma"),
    );
    let too_large = server.post("/v1/audio/speech", "application/json", &vec![b' '; 8192]);
    assert_eq!(
        too_large.header("connection"),
        Some("close"),
        "a 413 closes the connection"
    );
    expect(too_large, 413, None);
    expect(server.post("/v1/voices", "audio/wav", b"RIFF....WAVEjunk"), 400, None);
    // A reference longer than a voice is made from (61 s at 20 Hz: small, but long).
    let long = server.post(
        "/v1/voices",
        "audio/wav",
        &sine_wav(&s.data.join("long.wav"), 20, 61.0, 0.1),
    );
    let message = long.json()["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("61.0 s is longer than the 60 s"), "{message}");
    expect(long, 400, None);
    expect(server.get("/v1/nothing"), 404, None);
    // A route asked with a method it does not take: 405 naming the ones it does.
    for (answer, allowed) in [
        (server.get("/v1/audio/speech"), "POST"),
        (server.delete("/v1/voices"), "GET, HEAD, POST"),
        (server.get("/v1/voices/0123456789abcdef"), "DELETE"),
    ] {
        assert_eq!(answer.header("allow"), Some(allowed));
        expect(answer, 405, None);
    }
    let refused = server.head("/v1/audio/speech");
    assert_eq!((refused.status, refused.header("allow")), (405, Some("POST")));
    // HEAD on every GET route: the GET answer's status and headers, no body.
    for path in ["/health", "/ready", "/metrics", "/v1/voices"] {
        let (get, head) = (server.get(path), server.head(path));
        assert_eq!((head.status, get.status), (200, 200), "{path}");
        assert!(head.body.is_empty(), "{path}: HEAD answered with a body");
        for name in ["content-type", "content-length"] {
            assert_eq!(head.header(name), get.header(name), "{path}: {name}");
        }
    }
    // Ids are quoted once in messages (the JSON escapes them, nothing else).
    let unknown = server.speech(&json!({"model": "drama-3", "input": "hi", "voice": "no\"body"}));
    let message = unknown.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(message, "unknown voice 'no\"body'");
    // A model that is not a string is named as such.
    let typed = server.speech(&json!({"model": 3, "input": "hi"}));
    let message = typed.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("must be the string \"drama-3\""), "{message}");
    expect(typed, 400, Some("model"));
    assert_eq!(checks, 18);
    // OpenAI's model names get drama-3's answer, byte for byte.
    let as_named =
        |model: &str| server.speech(&json!({"model": model, "input": "hi", "seed": 5, "max_audio_tokens": 8}));
    let drama = as_named("drama-3");
    assert_eq!(drama.status, 200);
    for alias in ["tts-1", "tts-1-hd", "gpt-4o-mini-tts"] {
        assert_eq!(as_named(alias).body, drama.body, "{alias}");
    }
    // Raw audio streamed over HTTP/1.0 would end by closing the connection, failed or not:
    // refused, naming the field; the whole file over HTTP/1.0 is served.
    let http10 = |format: Value| {
        let body =
            json!({"model": "drama-3", "input": "hi", "stream_format": format, "max_audio_tokens": 4, "seed": 5})
                .to_string();
        raw_exchange(
            server.address(),
            format!(
                "POST /v1/audio/speech HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
    };
    let refused = http10(json!("audio"));
    assert!(refused.starts_with("HTTP/1.0 400"), "{refused}");
    assert!(
        refused.contains("\"param\":\"stream_format\"") && refused.contains("needs HTTP/1.1"),
        "{refused}"
    );
    let served = http10(Value::Null);
    assert!(
        served.starts_with("HTTP/1.0 200"),
        "{}",
        &served[..served.len().min(300)]
    );
    assert_eq!(server.terminate(), Some(0));

    // Gamma allowed: out of range is still refused, in range works.
    let server = Server::start(
        &s.checkpoint,
        &s.data,
        &["--allow-request-gamma", "--max-lanes", "2", "--queue", "0"],
    );
    refuses_gamma_then_serves(&server, 50.0, Some(2.0));
    // Queue full: with one guided request allowed in flight, concurrent ones get 429.
    let base = server.base.clone();
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let base = base.clone();
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
                let body = request("Queue pressure test sentence.", i).to_string();
                let r = agent
                    .post(format!("{base}/v1/audio/speech"))
                    .header("content-type", "application/json")
                    .send(body)
                    .unwrap();
                (r.status().as_u16(), r.headers().get("retry-after").is_some())
            })
        })
        .collect();
    let answers: Vec<(u16, bool)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(answers.iter().any(|a| a.0 == 200), "{answers:?}");
    assert!(answers.contains(&(429, true)), "no 429 with Retry-After: {answers:?}");
    assert!(answers.iter().all(|a| a.0 == 200 || a.0 == 429), "{answers:?}");
    assert_eq!(server.terminate(), Some(0));

    // One lane: a guided request is refused (it could never get its two lanes), and the
    // server goes on serving unguided ones.
    let server = Server::start(
        &s.checkpoint,
        &s.data,
        &[
            "--allow-request-gamma",
            "--gamma",
            "1",
            "--max-lanes",
            "1",
            "--queue",
            "1",
        ],
    );
    refuses_gamma_then_serves(&server, 2.0, None);
    assert_eq!(server.terminate(), Some(0));
}

/// A connection that never finishes its request does not keep a stopping server alive: the
/// server stops taking requests, waits out its requests' time limit (1 s here, plus 5 s of
/// grace) and exits.
#[test]
fn a_stalled_connection_does_not_hold_up_shutdown() {
    use std::io::Write;
    let s = setup(53);
    let server = Server::start(
        &s.checkpoint,
        &s.data,
        &["--request-timeout", "1", "--gamma", "1", "--max-lanes", "1"],
    );
    let address = server.base.trim_start_matches("http://").to_string();
    let mut stalled = std::net::TcpStream::connect(&address).unwrap();
    stalled
        .write_all(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let (exited, exit) = std::sync::mpsc::channel();
    std::thread::spawn(move || exited.send(server.terminate()));
    let code = exit
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the server did not exit within 60 s of SIGTERM");
    assert_eq!(code, Some(0));
    drop(stalled);
}

/// A GPU worker that cannot start (here: KV caches for 4096 lanes, past the device's
/// binding limit) stops the service with its error and a non-zero exit, instead of leaving
/// a listener that answers 503 forever.
#[test]
fn a_worker_that_fails_to_start_stops_the_service() {
    let s = setup(53);
    let mut child = std::process::Command::new(drama_tests::drama_binary())
        .args(["serve", "--checkpoint", s.checkpoint.to_str().unwrap()])
        .args(["--data-dir", s.data.to_str().unwrap(), "--addr", "127.0.0.1:0"])
        .args(["--max-lanes", "4096"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > std::time::Duration::from_secs(120) {
            child.kill().unwrap();
            panic!("the service still runs without its worker");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(err.contains("KV cache of 4096 lanes"), "{err}");
}

/// Sends `bytes` on a fresh connection and returns what comes back until the server closes
/// it (or 60 s pass).
fn raw_exchange(address: &str, bytes: &[u8]) -> String {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    stream.write_all(bytes).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// A client that does not finish its headers within `--client-timeout` loses its connection
/// (without an answer), one that does not finish its body gets 408 naming the wait, and
/// beyond `--max-connections` a client waits to be accepted rather than being refused: here
/// the one place is held by a stalled client until its timeout frees it.
#[test]
fn slow_clients_time_out_and_connections_are_capped() {
    use std::io::Write;
    use std::time::{Duration, Instant};
    let s = setup(59);
    let server = Server::start(
        &s.checkpoint,
        &s.data,
        &[
            "--client-timeout",
            "2",
            "--max-connections",
            "1",
            "--gamma",
            "1",
            "--max-lanes",
            "1",
        ],
    );
    let mut stalled = std::net::TcpStream::connect(server.address()).unwrap();
    stalled.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    let answer = raw_exchange(
        server.address(),
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let waited = start.elapsed();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        waited > Duration::from_millis(1500) && waited < Duration::from_secs(30),
        "the second client waited {waited:?}, not about the first one's 2 s timeout"
    );
    let mut rest = Vec::new();
    let _ = stalled.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    let start = Instant::now();
    let answer = raw_exchange(
        server.address(),
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"input\":",
    );
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    // The client asked to keep the connection; the server says it closes it.
    assert!(
        answer.to_ascii_lowercase().contains("\r\nconnection: close\r\n"),
        "{answer}"
    );
    assert!(answer.contains("the body did not arrive within 2 s"), "{answer}");
    assert!(start.elapsed() > Duration::from_millis(1500), "{:?}", start.elapsed());
    // Only the connection asking for the metrics is open once the others are gone.
    let mut open = f64::NAN;
    for _ in 0..100 {
        open = server.metric("drama_open_connections");
        if open == 1.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(open, 1.0);
    assert_eq!(server.terminate(), Some(0));
}

/// A first interrupt stops the server gracefully, waiting for the requests in flight (here
/// a stalled one, for up to its 600 s); a second one stops it at once, with status 130.
#[test]
fn a_second_interrupt_stops_the_server_at_once() {
    use std::io::Write;
    use std::time::Duration;
    let s = setup(61);
    let mut server = Server::start(
        &s.checkpoint,
        &s.data,
        &[
            "--request-timeout",
            "600",
            "--client-timeout",
            "600",
            "--gamma",
            "1",
            "--max-lanes",
            "1",
        ],
    );
    // A request in flight whose body never comes. The server answers `Expect:
    // 100-continue` once its handler reads the body, so the request is known to be in
    // flight before the interrupt: a connection on which the server has read nothing yet
    // is closed at once by a graceful stop (hyper), and only waiting for it to be accepted
    // left that race open (it failed once in eight runs on a busy machine).
    let mut stalled = std::net::TcpStream::connect(server.address()).unwrap();
    stalled
        .write_all(
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\nExpect: 100-continue\r\n\r\n",
        )
        .unwrap();
    stalled.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut interim = Vec::new();
    let mut byte = [0u8; 1];
    while !interim.ends_with(b"\r\n\r\n") {
        assert_eq!(std::io::Read::read(&mut stalled, &mut byte).unwrap(), 1, "closed early");
        interim.push(byte[0]);
    }
    let interim = String::from_utf8_lossy(&interim);
    assert!(interim.starts_with("HTTP/1.1 100 Continue"), "{interim}");
    server.signal("INT");
    assert!(
        server.wait_for_stderr("interrupt again to stop at once", Duration::from_secs(30)),
        "{}",
        server.stderr()
    );
    assert_eq!(
        server.exit_within(Duration::from_secs(1)),
        None,
        "the first interrupt waits"
    );
    server.signal("INT");
    let code = server
        .exit_within(Duration::from_secs(30))
        .expect("the server still runs 30 s after a second interrupt");
    assert_eq!(code, Some(130));
    assert!(
        server.wait_for_stderr("stopped at once", Duration::from_secs(5)),
        "{}",
        server.stderr()
    );
    drop(stalled);
}

/// Polls a gauge of `server` until it reads `value`; false if it does not within 10 s.
fn gauge_reaches(server: &Server, name: &str, value: f64) -> bool {
    for _ in 0..500 {
        if server.metric(name) == value {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

/// Whether the gauge `name` goes above `value` within ten seconds.
fn gauge_exceeds(server: &Server, name: &str, value: f64) -> bool {
    (0..500).any(|_| {
        let above = server.metric(name) > value;
        if !above {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        above
    })
}

/// Voice uploads are encoded beside synthesis, at most two received or encoding at once: a
/// third while two bodies are still arriving gets 429 naming the uploads, and once those
/// clients leave an upload is saved (and the same recording again gets the same id).
#[test]
fn voice_uploads_are_limited_and_encoded_beside_synthesis() {
    use std::io::Write;
    let s = setup(67);
    let server = Server::start(&s.checkpoint, &s.data, &["--gamma", "1", "--max-lanes", "1"]);
    let partial: &[u8] =
        b"POST /v1/voices HTTP/1.1\r\nHost: x\r\nContent-Type: audio/wav\r\nContent-Length: 100000\r\n\r\nRIFF";
    let arriving: Vec<std::net::TcpStream> = (0..2)
        .map(|_| {
            let mut stream = std::net::TcpStream::connect(server.address()).unwrap();
            stream.write_all(partial).unwrap();
            stream
        })
        .collect();
    assert!(gauge_reaches(&server, "drama_voice_uploads", 2.0));
    let wav = sine_wav(&s.data.with_extension("ref.wav"), 16_000, 1.5, 0.05);
    let refused = server.post("/v1/voices", "audio/wav", &wav);
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("1"));
    let message = refused.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("2 voice uploads are already being received or encoded"),
        "{message}"
    );
    drop(arriving);
    assert!(gauge_reaches(&server, "drama_voice_uploads", 0.0));
    // Speech runs while the upload encodes; both succeed.
    let speech = {
        let base = server.base.clone();
        std::thread::spawn(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
            agent
                .post(format!("{base}/v1/audio/speech"))
                .header("content-type", "application/json")
                .send(request("Spoken beside an upload.", 5).to_string())
                .unwrap()
                .status()
                .as_u16()
        })
    };
    let saved = server.post("/v1/voices", "audio/wav", &wav);
    assert_eq!(saved.status, 201, "{}", String::from_utf8_lossy(&saved.body));
    assert_eq!(speech.join().unwrap(), 200);
    let again = server.post("/v1/voices", "audio/wav", &wav);
    assert_eq!(again.json()["id"], saved.json()["id"]);
    assert_eq!(server.terminate(), Some(0));
}

/// Opens a speech request on a raw connection (so that the test decides when its client
/// goes away) and sends it whole.
fn raw_speech(address: &str, request: &Value) -> std::net::TcpStream {
    use std::io::Write;
    let body = request.to_string();
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(
        stream,
        "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    stream
}

/// A request waiting for a lane whose client goes away leaves the queue at once, whole or
/// streamed, while the request holding the lane runs on; it is never admitted. The audio
/// the holder made counts as unread until its client goes too.
#[test]
fn a_waiting_request_whose_client_leaves_is_dropped_from_the_queue() {
    let s = setup(71);
    let server = Server::start(&s.checkpoint, &s.data, &["--gamma", "1", "--max-lanes", "1"]);
    // Twelve sentences, synthesized one after another, hold the lane for a while.
    let holder = request(&"Hold the lane for a while. ".repeat(12), 4);
    for (round, format) in ["audio", "none"].iter().enumerate() {
        let running = raw_speech(server.address(), &holder);
        assert!(gauge_reaches(&server, "drama_active_lanes", 1.0));
        let mut waiter = request("I wait in line.", 9);
        if *format == "audio" {
            waiter["stream_format"] = json!("audio");
        }
        let waiting = raw_speech(server.address(), &waiter);
        assert!(gauge_reaches(&server, "drama_queue_depth", 1.0));
        drop(waiting);
        let cancelled = (2 * round + 1) as f64;
        assert!(gauge_reaches(&server, "drama_cancellations_total", cancelled));
        // Read in one answer: the holder still runs, nothing waits.
        let text = String::from_utf8(server.get("/metrics").body).unwrap();
        for line in [
            "drama_queue_depth 0",
            "drama_active_lanes 1",
            "drama_requests_in_flight 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        // The holder's audio so far waits for its client, counted as unread until it goes.
        assert!(gauge_exceeds(&server, "drama_unread_audio_bytes", 0.0));
        drop(running);
        assert!(gauge_reaches(&server, "drama_cancellations_total", cancelled + 1.0));
        assert!(gauge_reaches(&server, "drama_active_lanes", 0.0));
        assert!(gauge_reaches(&server, "drama_unread_audio_bytes", 0.0));
    }
    assert_eq!(server.terminate(), Some(0));
}

/// The text after the first sentence is cut while the first is spoken, and the response
/// waits for it: a later word that cannot fit the context is still refused with a 400
/// naming `input`, before any audio, and the server goes on. A text cut that way is
/// spoken as `drama synth` speaks it whole. (A checkpoint of 113 positions: 12 tokens of
/// text beside the 4-position voice prefix, `audio_bos` and the 96-token cap.)
#[test]
fn a_later_sentence_that_cannot_be_spoken_is_refused_before_any_audio() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("short");
    let mut preset = drama_fixtures::Preset::by_name("tiny").unwrap();
    preset.config.max_position_embeddings = 113;
    drama_fixtures::generate(&preset, 53)
        .unwrap()
        .write(&checkpoint)
        .unwrap();
    let server = Server::start(&checkpoint, &dir.path().join("data"), &[]);
    for stream_format in [Value::Null, json!("audio"), json!("sse")] {
        let mut body = request("Hi. Then Supercalifragilisticexpialidocious follows.", 3);
        body["stream_format"] = stream_format;
        let refused = server.speech(&body);
        assert_eq!(refused.status, 400, "{}", String::from_utf8_lossy(&refused.body));
        let error = &refused.json()["error"];
        assert_eq!(error["param"], "input", "{error}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains("\"Supercalifragilisticexpialidocious\" alone needs more than the 12 tokens"),
            "{message}"
        );
    }
    let text = "Hi. A second one. And a third.";
    let served = server.speech(&request(text, 5));
    assert_eq!(served.status, 200, "{}", String::from_utf8_lossy(&served.body));
    let out = dir.path().join("synth.wav");
    let (code, _, err) = drama_tests::drama_text(&[
        "synth",
        "--checkpoint",
        checkpoint.to_str().unwrap(),
        "--text",
        text,
        "--seed",
        "5",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let whole = std::fs::read(&out).unwrap();
    assert!(!data_chunk(&whole).is_empty(), "the comparison needs audio");
    assert_eq!(
        data_chunk(&served.body),
        data_chunk(&whole),
        "served and synthesized differ"
    );
}
