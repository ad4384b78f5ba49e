//! OpenAI's custom-voice routes over the voice store: `POST /v1/audio/voices` (multipart:
//! `audio_sample`, a WAV recording, and `name`; `consent` optional), `GET /v1/audio/voices`
//! and `DELETE /v1/audio/voices/{id or name}`, answering OpenAI's voice objects.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::{Request, Response};

use crate::api::ApiError;
use crate::http::{Body, State, encode_upload, json, mark_unapplied, read_body, take_upload_place};
use crate::uploads::MAX_UPLOAD_BYTES;
use crate::voices::Label;

/// Room for the form's other fields and part headers beside the recording.
const FORM_OVERHEAD_BYTES: usize = 64 * 1024;

/// The path prefix of one voice.
pub const VOICE_PATH: &str = "/v1/audio/voices/";

/// What a voice-creation form holds.
struct VoiceForm {
    name: String,
    recording: Bytes,
    /// Fields given that drama accepts but does not use.
    unapplied: Vec<&'static str>,
}

/// `POST /v1/audio/voices`: encodes the recording, saves it and gives it the name.
pub async fn create(state: Arc<State>, request: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let boundary = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| multer::parse_boundary(value).ok())
        .ok_or_else(|| {
            ApiError::status(
                415,
                "send the voice as multipart/form-data with `audio_sample` (a WAV file) and `name`",
            )
        })?;
    let place = take_upload_place(&state)?;
    let body = read_body(&state, request, MAX_UPLOAD_BYTES + FORM_OVERHEAD_BYTES).await?;
    let form = read_form(body, boundary).await?;
    state.store.check_free(&form.name)?;
    // A recording that cannot be read is the form's `audio_sample` field at fault.
    let id = encode_upload(&state, form.recording.to_vec(), place)
        .await
        .map_err(|e| match (e.status, &e.param) {
            (400, None) => ApiError::invalid("audio_sample", e.message),
            _ => e,
        })?;
    let label = state.store.name(&id, &form.name, unix_now())?;
    let mut response = json(201, voice_object(&id, &label));
    mark_unapplied(&mut response, &form.unapplied);
    Ok(response)
}

/// `GET /v1/audio/voices`: the served checkpoint's voices (and damaged files, marked), each
/// named by its label or, for a voice saved without a name, by its id (created when its file
/// was last written).
pub fn list(state: &State) -> Response<Body> {
    let data: Vec<serde_json::Value> = state
        .store
        .list(&state.checkpoint)
        .into_iter()
        .map(|voice| {
            let label = state.store.label(&voice.id).unwrap_or_else(|| Label {
                name: voice.id.clone(),
                created_at: state.store.saved_at(&voice.id).unwrap_or(0),
            });
            let mut object = voice_object(&voice.id, &label);
            if voice.damaged {
                object["damaged"] = serde_json::Value::Bool(true);
            }
            object
        })
        .collect();
    json(200, serde_json::json!({"object": "list", "data": data}))
}

/// `DELETE /v1/audio/voices/{id or name}`, the path segment percent-decoded (a name may
/// hold spaces and any other character but control ones).
pub fn delete(state: &State, segment: &str) -> Result<Response<Body>, ApiError> {
    let id_or_name = percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .map_err(|_| ApiError::status(400, format!("the voice '{segment}' is not UTF-8 once percent-decoded")))?;
    let unknown = || ApiError::status(404, format!("unknown voice '{id_or_name}'"));
    let id = state.store.resolve(&id_or_name).ok_or_else(unknown)?;
    match state.store.delete(&id, &state.checkpoint) {
        Ok(true) => Ok(json(
            200,
            serde_json::json!({"id": id, "deleted": true, "object": "audio.voice.deleted"}),
        )),
        Ok(false) => Err(unknown()),
        Err(e) => Err(ApiError::status(500, format!("cannot delete voice '{id}': {e}"))),
    }
}

/// OpenAI's voice object.
fn voice_object(id: &str, label: &Label) -> serde_json::Value {
    serde_json::json!({
        "id": id,
        "name": label.name,
        "created_at": label.created_at,
        "object": "audio.voice",
        "type": "audio_sample",
    })
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_secs())
        .unwrap_or(0)
}

/// Reads the form's fields: `audio_sample` and `name` are required; `type` must be
/// `audio_sample` when given (drama makes voices from recordings only); `consent`, `model`
/// and `script_hint` are accepted and reported as not applied; any other field is refused.
async fn read_form(body: Bytes, boundary: String) -> Result<VoiceForm, ApiError> {
    let malformed = |e: multer::Error| ApiError::status(400, format!("the multipart form cannot be read: {e}"));
    let stream = futures_util::stream::once(async move { Ok::<Bytes, std::convert::Infallible>(body) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    let (mut name, mut recording, mut unapplied) = (None, None, Vec::new());
    while let Some(field) = multipart.next_field().await.map_err(malformed)? {
        let field_name = field.name().unwrap_or("").to_string();
        match field_name.as_str() {
            "name" => name = Some(field.text().await.map_err(malformed)?),
            "audio_sample" => recording = Some(field.bytes().await.map_err(malformed)?),
            "type" => {
                let kind = field.text().await.map_err(malformed)?;
                if kind != "audio_sample" {
                    return Err(ApiError::invalid(
                        "type",
                        format!("drama makes voices from recordings only (`audio_sample`), not '{kind}'"),
                    ));
                }
            }
            "consent" => unapplied.push("consent"),
            "model" => unapplied.push("model"),
            "script_hint" => unapplied.push("script_hint"),
            other => {
                return Err(ApiError::invalid(
                    other,
                    format!("unknown field '{other}'; a voice takes `audio_sample`, `name` and `consent`"),
                ));
            }
        }
    }
    let name = name.ok_or_else(|| ApiError::invalid("name", "the form has no `name`"))?;
    let recording = recording
        .ok_or_else(|| ApiError::invalid("audio_sample", "the form has no `audio_sample` (a WAV recording)"))?;
    Ok(VoiceForm {
        name,
        recording,
        unapplied,
    })
}
