//! The request and error formats of the HTTP API (OpenAI-compatible `/v1/audio/speech`),
//! validated field by field: every refusal names the field at fault.

use drama_engine::audio::AudioFormat;
use drama_engine::guidance::{MAX_GAMMA, check_gamma};
use drama_engine::sampling::MAX_TEMPERATURE;
use serde_json::{Value, json};

/// The model name requests must give.
pub const MODEL: &str = "drama-3";

/// The model names of OpenAI's speech API, which existing clients send: answered as
/// [`MODEL`], so such a client switches by changing only its base URL.
pub const MODEL_ALIASES: [&str; 5] = [
    "tts-1",
    "tts-1-hd",
    "gpt-4o-mini-tts",
    "gpt-4o-mini-tts-2025-03-20",
    "gpt-4o-mini-tts-2025-12-15",
];

/// A refused request: HTTP status, message and the field at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// What was wrong.
    pub message: String,
    /// The request field at fault, if any.
    pub param: Option<String>,
}

impl ApiError {
    /// A 400 naming `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            param: Some(param.to_string()),
        }
    }

    /// An error without a field.
    pub fn status(status: u16, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> String {
        let kind = match self.status {
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}).to_string()
    }
}

/// How the response is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamFormat {
    /// The whole file at the end (WAV sizes filled in).
    Whole,
    /// The bytes as they are produced (WAV sizes unknown: 0xFFFFFFFF); a synthesis that
    /// fails aborts the transfer, so the client never sees it end cleanly.
    Audio,
    /// Server-sent events: `speech.audio.delta` with base64 audio, then `speech.audio.done`,
    /// or an `error` event (the body an error response would have) if the synthesis failed.
    Sse,
}

/// Which voice a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VoiceChoice {
    /// The checkpoint's default prefix.
    Default,
    /// A saved voice, by its id or its name.
    Saved(String),
}

/// OpenAI's built-in voice names. drama has no such voices: a request naming one gets the
/// checkpoint's default voice, and its reply names `voice` among the fields not applied, so
/// that an OpenAI client works unchanged and can still see what it got.
pub const OPENAI_VOICES: [&str; 13] = [
    "alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage", "shimmer", "verse",
];

/// A validated speech request.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeechRequest {
    /// Text to speak.
    pub input: String,
    /// Voice.
    pub voice: VoiceChoice,
    /// Encoding (absent: mp3, as OpenAI's).
    pub response_format: AudioFormat,
    /// Delivery.
    pub stream_format: StreamFormat,
    /// Seed (None: random, reported in a header).
    pub seed: Option<u64>,
    /// Temperature.
    pub temperature: f32,
    /// Top-k (0: off).
    pub top_k: usize,
    /// Top-p (1: off).
    pub top_p: f32,
    /// Token cap per segment.
    pub max_audio_tokens: Option<usize>,
    /// Guidance scale, when the request may set it.
    pub gamma: Option<f32>,
    /// Fields the request gave that were accepted but do not change the speech (OpenAI's
    /// `instructions`, a built-in OpenAI voice name), for the reply's
    /// `x-drama-unapplied-fields` header.
    pub unapplied: Vec<&'static str>,
}

/// What the server allows requests to set.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Whether `gamma` may be given.
    pub allow_request_gamma: bool,
    /// Largest `max_audio_tokens`.
    pub max_audio_tokens: usize,
    /// Longest `input`, in characters.
    pub max_input_chars: usize,
}

fn number(body: &Value, field: &str) -> Result<Option<f64>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| ApiError::invalid(field, format!("`{field}` must be a number"))),
    }
}

fn whole(body: &Value, field: &str) -> Result<Option<u64>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| ApiError::invalid(field, format!("`{field}` must be a non-negative integer"))),
    }
}

/// Parses and validates a `/v1/audio/speech` JSON body.
pub fn parse_speech(bytes: &[u8], policy: &Policy) -> Result<SpeechRequest, ApiError> {
    let body: Value =
        serde_json::from_slice(bytes).map_err(|e| ApiError::status(400, format!("the body is not valid JSON: {e}")))?;
    if !body.is_object() {
        return Err(ApiError::status(400, "the body must be a JSON object"));
    }
    match body.get("model") {
        Some(Value::String(name)) if name == MODEL || MODEL_ALIASES.contains(&name.as_str()) => {}
        Some(Value::String(other)) => {
            return Err(ApiError::invalid(
                "model",
                format!(
                    "unknown model {other:?}; this server runs {MODEL:?} (also answering to {})",
                    MODEL_ALIASES.map(|a| format!("{a:?}")).join(", ")
                ),
            ));
        }
        None | Some(Value::Null) => {
            return Err(ApiError::invalid("model", format!("`model` is required (\"{MODEL}\")")));
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "model",
                format!("`model` must be the string \"{MODEL}\""),
            ));
        }
    }
    let input = body
        .get("input")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid("input", "`input` is required and must be a string"))?;
    if input.trim().is_empty() {
        return Err(ApiError::invalid("input", "`input` is empty"));
    }
    if input.chars().count() > policy.max_input_chars {
        return Err(ApiError::invalid(
            "input",
            format!("`input` is longer than {} characters", policy.max_input_chars),
        ));
    }
    // A name, or {"id": name}; "default" (or none) is the default voice either way.
    let voice_name = match body.get("voice") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) => Some(name.as_str()),
        Some(Value::Object(object)) => match object.get("id").and_then(Value::as_str) {
            Some(id) => Some(id),
            None => return Err(ApiError::invalid("voice", "a voice object needs a string `id`")),
        },
        Some(_) => return Err(ApiError::invalid("voice", "`voice` must be a name or {\"id\": ...}")),
    };
    let mut unapplied = Vec::new();
    let voice = match voice_name {
        None | Some("default") => VoiceChoice::Default,
        Some(name) if OPENAI_VOICES.contains(&name) => {
            unapplied.push("voice");
            VoiceChoice::Default
        }
        Some(id) => VoiceChoice::Saved(id.to_string()),
    };
    let response_format = match body.get("response_format") {
        None | Some(Value::Null) => AudioFormat::Mp3,
        Some(v) => match v.as_str().and_then(AudioFormat::from_name) {
            Some(format) => format,
            None => {
                let names: Vec<&str> = AudioFormat::ALL.iter().map(|f| f.name()).collect();
                let aac = if v.as_str() == Some("aac") {
                    "drama offers no AAC (no AAC encoder crate with a licence it can ship); "
                } else {
                    ""
                };
                return Err(ApiError::invalid(
                    "response_format",
                    format!("{aac}supported formats: {}", names.join(", ")),
                ));
            }
        },
    };
    let stream_format = match body.get("stream_format") {
        None | Some(Value::Null) => StreamFormat::Whole,
        Some(v) => match v.as_str() {
            Some("audio") => StreamFormat::Audio,
            Some("sse") => StreamFormat::Sse,
            _ => {
                return Err(ApiError::invalid(
                    "stream_format",
                    "supported stream formats: \"audio\", \"sse\"",
                ));
            }
        },
    };
    // OpenAI's style instructions: drama-3 has no such input. They are accepted, so that an
    // OpenAI client works unchanged, and named in the reply as not applied.
    match body.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) if text.trim().is_empty() => {}
        Some(Value::String(_)) => unapplied.push("instructions"),
        Some(_) => return Err(ApiError::invalid("instructions", "`instructions` must be a string")),
    }
    if let Some(speed) = number(&body, "speed")?
        && speed != 1.0
    {
        return Err(ApiError::invalid("speed", "only speed 1.0 is supported"));
    }
    let temperature = number(&body, "temperature")?.unwrap_or(1.0);
    if !(0.0..=f64::from(MAX_TEMPERATURE)).contains(&temperature) {
        return Err(ApiError::invalid(
            "temperature",
            format!("`temperature` must be in [0, {MAX_TEMPERATURE}]"),
        ));
    }
    // Checked as the f32 the sampler gets (1e-50 is 0 there).
    let top_p = number(&body, "top_p")?.unwrap_or(1.0) as f32;
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid("top_p", "`top_p` must be in (0, 1]"));
    }
    let top_k = whole(&body, "top_k")?.unwrap_or(0) as usize;
    let seed = whole(&body, "seed")?;
    let max_audio_tokens = whole(&body, "max_audio_tokens")?.map(|v| v as usize);
    if let Some(n) = max_audio_tokens
        && (n == 0 || n > policy.max_audio_tokens)
    {
        return Err(ApiError::invalid(
            "max_audio_tokens",
            format!("`max_audio_tokens` must be in 1..={}", policy.max_audio_tokens),
        ));
    }
    let gamma = match number(&body, "gamma")? {
        None => None,
        Some(_) if !policy.allow_request_gamma => {
            return Err(ApiError::invalid(
                "gamma",
                "this server does not accept `gamma` (start it with --allow-request-gamma)",
            ));
        }
        Some(g) => {
            check_gamma(g as f32)
                .map_err(|_| ApiError::invalid("gamma", format!("`gamma` must be in (0, {MAX_GAMMA}]")))?;
            Some(g as f32)
        }
    };
    Ok(SpeechRequest {
        input: input.to_string(),
        voice,
        response_format,
        stream_format,
        seed,
        temperature: temperature as f32,
        top_k,
        top_p,
        max_audio_tokens,
        gamma,
        unapplied,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Policy = Policy {
        allow_request_gamma: false,
        max_audio_tokens: 100,
        max_input_chars: 50,
    };

    fn refusal(body: &str) -> ApiError {
        parse_speech(body.as_bytes(), &POLICY).unwrap_err()
    }

    /// OpenAI's model names are answered as drama-3; empty instructions are no instructions,
    /// others and OpenAI's voice names are accepted and named as not applied.
    #[test]
    fn openai_names_are_accepted_and_what_is_not_applied_is_named() {
        for model in ["drama-3", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"] {
            for instructions in ["null", "\"\"", "\"  \""] {
                let body = format!(r#"{{"model": "{model}", "input": "hi", "instructions": {instructions}}}"#);
                let parsed = parse_speech(body.as_bytes(), &POLICY).unwrap();
                assert!(parsed.unapplied.is_empty(), "{body}");
            }
        }
        let styled = parse_speech(
            br#"{"model": "gpt-4o-mini-tts", "input": "hi", "voice": "coral", "instructions": "Speak calmly."}"#,
            &POLICY,
        )
        .unwrap();
        assert_eq!(styled.voice, VoiceChoice::Default);
        assert_eq!(styled.unapplied, ["voice", "instructions"]);
        let named = parse_speech(br#"{"model": "tts-1", "input": "hi", "voice": "narrator"}"#, &POLICY).unwrap();
        assert_eq!(
            (named.voice, named.unapplied),
            (VoiceChoice::Saved("narrator".into()), vec![])
        );
        let unknown = refusal(r#"{"model": "tts-2", "input": "hi"}"#);
        assert_eq!(
            unknown.message,
            r#"unknown model "tts-2"; this server runs "drama-3" (also answering to "tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-03-20", "gpt-4o-mini-tts-2025-12-15")"#
        );
    }

    #[test]
    fn every_refusal_names_its_field() {
        for (body, param) in [
            (r#"{"input": "hi"}"#, "model"),
            (r#"{"model": "tts-2", "input": "hi"}"#, "model"),
            (
                r#"{"model": "drama-3", "input": "hi", "instructions": 3}"#,
                "instructions",
            ),
            (r#"{"model": "drama-3", "input": "  "}"#, "input"),
            (r#"{"model": "drama-3", "input": 5}"#, "input"),
            (r#"{"model": "drama-3", "input": "hi", "speed": 1.25}"#, "speed"),
            (r#"{"model": "drama-3", "input": "hi", "gamma": 2}"#, "gamma"),
            (
                r#"{"model": "drama-3", "input": "hi", "response_format": "ogg"}"#,
                "response_format",
            ),
            (
                r#"{"model": "drama-3", "input": "hi", "stream_format": "chunks"}"#,
                "stream_format",
            ),
            (r#"{"model": "drama-3", "input": "hi", "top_p": 0}"#, "top_p"),
            (r#"{"model": "drama-3", "input": "hi", "top_p": 1e-50}"#, "top_p"),
            (
                r#"{"model": "drama-3", "input": "hi", "max_audio_tokens": 101}"#,
                "max_audio_tokens",
            ),
            (r#"{"model": "drama-3", "input": "hi", "seed": -1}"#, "seed"),
            (r#"{"model": "drama-3", "input": "hi", "voice": 3}"#, "voice"),
        ] {
            assert_eq!(refusal(body).param.as_deref(), Some(param), "{body}");
        }
        let long = format!(r#"{{"model": "drama-3", "input": "{}"}}"#, "a".repeat(51));
        assert_eq!(refusal(&long).param.as_deref(), Some("input"));
        assert_eq!(refusal("not json").status, 400);
    }

    #[test]
    fn a_full_request_parses() {
        let r = parse_speech(
            br#"{"model": "drama-3", "input": "Hello", "voice": {"id": "0123456789abcdef"}, "response_format": "pcm",
                "stream_format": "sse", "speed": 1.0, "seed": 7, "temperature": 0.5, "top_k": 20, "top_p": 0.9}"#,
            &POLICY,
        )
        .unwrap();
        assert_eq!(r.voice, VoiceChoice::Saved("0123456789abcdef".into()));
        assert_eq!(
            (r.response_format, r.stream_format, r.seed, r.top_k),
            (AudioFormat::Pcm, StreamFormat::Sse, Some(7), 20)
        );
    }
}
