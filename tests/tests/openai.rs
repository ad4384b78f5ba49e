//! `drama serve` as a drop-in OpenAI speech endpoint, driven over real HTTP: every output
//! format whole, streamed and as SSE (the same bytes each way), OpenAI's default format,
//! fields accepted but not applied named in a header, and voices saved, used, listed and
//! deleted by name through OpenAI's `/v1/audio/voices`; then all of it again through the
//! official `openai` Python SDK, whose answers libsndfile decodes.

use std::io::Read;

use drama_tests::server::{Answer, Server};
use serde_json::{Value, json};

fn checkpoint(dir: &std::path::Path) -> std::path::PathBuf {
    let checkpoint = dir.join("tiny");
    drama_fixtures::write_preset("tiny", 7, &checkpoint).unwrap();
    checkpoint
}

/// The audio an SSE answer's `speech.audio.delta` events carry, in order.
fn sse_audio(events: &[u8]) -> Vec<u8> {
    use base64::Engine as _;
    let events = std::str::from_utf8(events).expect("SSE is text");
    assert!(events.contains("event: speech.audio.done"), "{events}");
    events
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str::<Value>(data).unwrap())
        .filter(|event| event["type"] == "speech.audio.delta")
        .flat_map(|event| {
            base64::engine::general_purpose::STANDARD
                .decode(event["audio"].as_str().unwrap())
                .unwrap()
        })
        .collect()
}

/// A multipart/form-data body of `fields` (name, file name, bytes) and its content type.
fn form(fields: &[(&str, Option<&str>, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "drama-test-boundary-7f3a";
    let mut body = Vec::new();
    for (name, file, bytes) in fields {
        body.extend(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"").bytes());
        if let Some(file) = file {
            body.extend(format!("; filename=\"{file}\"\r\nContent-Type: audio/wav").bytes());
        }
        body.extend(b"\r\n\r\n");
        body.extend(*bytes);
        body.extend(b"\r\n");
    }
    body.extend(format!("--{boundary}--\r\n").bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

fn error_param(answer: &Answer) -> Option<String> {
    answer.json()["error"]["param"].as_str().map(str::to_string)
}

#[test]
fn every_format_is_the_same_bytes_whole_streamed_and_as_events() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&checkpoint(dir.path()), &dir.path().join("data"), &[]);
    let request = |format: Option<&str>, stream: Option<&str>| {
        let mut body = json!({"model": "tts-1", "input": "Formats agree. Every one.", "voice": "default", "seed": 3});
        if let Some(format) = format {
            body["response_format"] = json!(format);
        }
        if let Some(stream) = stream {
            body["stream_format"] = json!(stream);
        }
        body
    };
    for (format, media_type) in [
        ("mp3", "audio/mpeg"),
        ("opus", "audio/ogg; codecs=opus"),
        ("flac", "audio/flac"),
        ("wav", "audio/wav"),
        ("pcm", "audio/pcm"),
    ] {
        let whole = server.speech(&request(Some(format), None));
        assert_eq!(whole.status, 200, "{format}: {}", String::from_utf8_lossy(&whole.body));
        assert_eq!(whole.header("content-type"), Some(media_type), "{format}");
        assert!(!whole.body.is_empty(), "{format}: no bytes");
        let mut streamed = Vec::new();
        server
            .open_stream(&request(Some(format), Some("audio")))
            .read_to_end(&mut streamed)
            .unwrap();
        let events = server.speech(&request(Some(format), Some("sse")));
        assert_eq!(events.header("content-type"), Some("text/event-stream"));
        let evented = sse_audio(&events.body);
        if format == "wav" || format == "flac" {
            // Streamed, a WAV's sizes and a FLAC's length and MD5 are unknown; the header
            // they sit in is 44 and 42 bytes long; the rest is the same.
            let header = if format == "wav" { 44 } else { 42 };
            for bytes in [&streamed, &evented] {
                assert_eq!(bytes.len(), whole.body.len());
                assert_eq!(&bytes[header..], &whole.body[header..], "{format}");
            }
        } else {
            assert!(streamed == whole.body, "{format}: streamed differs from whole");
            assert!(evented == whole.body, "{format}: SSE differs from whole");
        }
    }
    // No response_format: MP3, as OpenAI answers.
    let default = server.speech(&request(None, None));
    assert_eq!(default.header("content-type"), Some("audio/mpeg"));
    assert_eq!(default.body, server.speech(&request(Some("mp3"), None)).body);
}

#[test]
fn what_is_accepted_but_not_applied_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&checkpoint(dir.path()), &dir.path().join("data"), &[]);
    let plain = json!({"model": "gpt-4o-mini-tts", "input": "Hello.", "seed": 4, "response_format": "pcm"});
    let answer = server.speech(&plain);
    assert_eq!(answer.header("x-drama-unapplied-fields"), None);
    let mut styled = plain.clone();
    styled["voice"] = json!("coral");
    styled["instructions"] = json!("Speak like a pirate.");
    let styled = server.speech(&styled);
    assert_eq!(styled.status, 200);
    assert_eq!(styled.header("x-drama-unapplied-fields"), Some("voice, instructions"));
    assert_eq!(styled.body, answer.body, "an OpenAI voice name is the default voice");
}

#[test]
fn voices_are_saved_used_listed_and_deleted_by_name() {
    // A name with a space and a non-ASCII letter, as a path takes it.
    const NAME: &str = "night narrator \u{e9}";
    const ENCODED: &str = "/v1/audio/voices/night%20narrator%20%C3%A9";
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&checkpoint(dir.path()), &dir.path().join("data"), &[]);
    let recording = drama_tests::sine_wav(16_000, 0.4, 0.07);
    let (content_type, body) = form(&[
        ("name", None, NAME.as_bytes()),
        ("consent", None, b"cons_123"),
        ("audio_sample", Some("narrator.wav"), &recording),
    ]);
    let created = server.post("/v1/audio/voices", &content_type, &body);
    assert_eq!(created.status, 201, "{}", String::from_utf8_lossy(&created.body));
    assert_eq!(created.header("x-drama-unapplied-fields"), Some("consent"));
    let voice = created.json();
    let id = voice["id"].as_str().unwrap().to_string();
    assert_eq!(
        (&voice["name"], &voice["object"], &voice["type"]),
        (&json!(NAME), &json!("audio.voice"), &json!("audio_sample"))
    );
    assert!(voice["created_at"].as_u64().unwrap() > 1_700_000_000);
    // The same recording posted the old way gets the same id.
    let plain = server.post("/v1/voices", "audio/wav", &recording);
    assert_eq!(plain.json()["id"], json!(id));
    // By name, by id, and as {"id": name}: the same speech.
    let speak = |voice: Value| {
        let answer = server.speech(
            &json!({"model": "tts-1", "input": "Named voices.", "voice": voice, "seed": 8, "response_format": "pcm"}),
        );
        assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
        answer.body
    };
    let by_name = speak(json!(NAME));
    assert_eq!(by_name, speak(json!(id)));
    assert_eq!(by_name, speak(json!({ "id": NAME })));
    assert_ne!(by_name, speak(json!("default")));
    let listed = server.get("/v1/audio/voices").json();
    assert_eq!(listed["object"], json!("list"));
    assert_eq!(listed["data"][0]["name"], json!(NAME));
    // A voice saved the old way, without a name, is listed by its id, dated by its file.
    let unnamed = server.post("/v1/voices", "audio/wav", &drama_tests::sine_wav(16_000, 0.4, 0.31));
    let unnamed = unnamed.json()["id"].as_str().unwrap().to_string();
    let listed = server.get("/v1/audio/voices").json();
    let entry = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == json!(unnamed))
        .unwrap()
        .clone();
    assert_eq!(entry["name"], json!(unnamed));
    assert!(entry["created_at"].as_u64().unwrap() > 1_700_000_000, "{entry}");
    assert_eq!(server.delete(&format!("/v1/audio/voices/{unnamed}")).status, 200);
    // A name belongs to one voice; refusals name what was wrong.
    let other = drama_tests::sine_wav(16_000, 0.4, 0.19);
    let (content_type, body) = form(&[("name", None, NAME.as_bytes()), ("audio_sample", Some("b.wav"), &other)]);
    let taken = server.post("/v1/audio/voices", &content_type, &body);
    assert_eq!(taken.status, 409, "{}", String::from_utf8_lossy(&taken.body));
    for (fields, param) in [
        (vec![("audio_sample", Some("b.wav"), other.as_slice())], "name"),
        (
            vec![
                ("name", None, b"alloy".as_slice()),
                ("audio_sample", Some("b.wav"), &other),
            ],
            "name",
        ),
        (vec![("name", None, b"reader".as_slice())], "audio_sample"),
        (
            vec![
                ("name", None, b"reader".as_slice()),
                ("type", None, b"prompt"),
                ("audio_sample", Some("b.wav"), &other),
            ],
            "type",
        ),
        (
            vec![
                ("name", None, b"reader".as_slice()),
                ("audio_sample", Some("b.wav"), b"RIFFjunk"),
            ],
            "audio_sample",
        ),
    ] {
        let (content_type, body) = form(&fields);
        let refused = server.post("/v1/audio/voices", &content_type, &body);
        assert_eq!(
            (refused.status, error_param(&refused).as_deref()),
            (400, Some(param)),
            "{}",
            String::from_utf8_lossy(&refused.body)
        );
    }
    assert_eq!(server.post("/v1/audio/voices", "audio/wav", &other).status, 415);
    // Deleted by name, percent-encoded in the path: gone for every way of naming it.
    let deleted = server.delete(ENCODED);
    assert_eq!(deleted.status, 200);
    assert_eq!(
        deleted.json(),
        json!({"id": id, "deleted": true, "object": "audio.voice.deleted"})
    );
    assert_eq!(server.delete(ENCODED).status, 404);
    assert_eq!(server.delete("/v1/audio/voices/%FF").status, 400, "not UTF-8");
    assert_eq!(server.delete(&format!("/v1/voices/{id}")).status, 404);
    let gone = server.speech(&json!({"model": "tts-1", "input": "hi", "voice": NAME}));
    assert_eq!((gone.status, error_param(&gone).as_deref()), (400, Some("voice")));
    assert_eq!(server.get("/v1/audio/voices").json()["data"], json!([]));
}

/// A Python virtual environment with the pinned `openai` SDK and `soundfile`
/// (`tests/openai-sdk/requirements.txt`), made under `target/` on first use.
fn sdk_python() -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let venv = root.join("target").join("openai-sdk-venv");
    let python = venv.join("bin").join("python");
    let stamp = venv.join("requirements.txt");
    let requirements = root.join("tests").join("openai-sdk").join("requirements.txt");
    let wanted = std::fs::read(&requirements).unwrap();
    if std::fs::read(&stamp).ok().as_ref() == Some(&wanted) {
        return python;
    }
    let run = |program: &std::path::Path, args: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new(program)
            .args(args)
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success(),
            "making the SDK's environment failed ({} {:?}; it needs python3 with venv and PyPI): {}",
            program.display(),
            args,
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let _ = std::fs::remove_dir_all(&venv);
    run(
        std::path::Path::new("python3"),
        &["-m".as_ref(), "venv".as_ref(), venv.as_os_str()],
    );
    run(
        &python,
        &["-m", "pip", "install", "--quiet", "--no-deps", "-r"]
            .map(std::ffi::OsStr::new)
            .into_iter()
            .chain([requirements.as_os_str()])
            .collect::<Vec<_>>(),
    );
    std::fs::write(&stamp, wanted).unwrap();
    python
}

#[test]
fn the_openai_python_sdk_works_unchanged() {
    let python = sdk_python();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&checkpoint(dir.path()), &dir.path().join("data"), &[]);
    let recording = dir.path().join("narrator.wav");
    std::fs::write(&recording, drama_tests::sine_wav(16_000, 0.4, 0.07)).unwrap();
    let driver = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("openai-sdk")
        .join("drive.py");
    let out = std::process::Command::new(python)
        .arg(driver)
        .arg(format!("http://{}/v1", server.address()))
        .arg(&recording)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the SDK run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("the driver reports JSON");
    eprintln!("{report}");
    assert_eq!(report["sdk"], json!("3.63.0"));
    for format in ["wav", "flac"] {
        assert_eq!(report["formats"][format]["exact"], json!(true), "{format}");
    }
    for format in ["mp3", "opus"] {
        assert!(report["formats"][format]["samples"].as_u64().unwrap() > 0, "{format}");
    }
    assert_eq!(report["voice"]["deleted"], json!(true));
}
