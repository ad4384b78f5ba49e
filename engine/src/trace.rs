//! Teacher-forced traces (`drama trace`): the logits, hidden states and router choices of a
//! given text and code sequence, for users to compare against a reference of their own.

use std::collections::HashMap;

use safetensors::Dtype;

use crate::codec::{CodecDecoder, CodecWeights};
use crate::error::EngineError;
use crate::guidance::check_gamma;
use crate::sampling::{exact, gamma_fixed};
use crate::session::{Engine, Row, RowSource, Session};
use drama_checkpoint::names;

/// How the two guidance lanes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneMode {
    /// Both lanes in one batched forward.
    Paired,
    /// Two forwards.
    Separate,
}

/// What to trace.
pub struct TraceRequest<'a> {
    /// Text token ids.
    pub text: &'a [u32],
    /// Audio codes after audio_bos (each < C).
    pub codes: &'a [u32],
    /// The cond lane's voice prefix [P, H] (None: the default prefix).
    pub prefix: Option<&'a [f32]>,
    /// Guidance scale (1: cond only).
    pub gamma: f32,
    /// Paired or separate lanes.
    pub lanes: LaneMode,
}

/// A finished trace: named F32/I32 tensors.
pub struct Trace {
    /// (name, dtype, shape, little-endian bytes), in output order.
    pub tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
}

fn rows(lane: usize, prefix_len: usize, text: &[u32], audio: &[u32]) -> Vec<Row> {
    (0..prefix_len)
        .map(RowSource::Prefix)
        .chain(text.iter().map(|&t| RowSource::Text(t)))
        .chain(audio.iter().map(|&a| RowSource::Audio(a)))
        .enumerate()
        .map(|(pos, source)| Row { source, lane, pos })
        .collect()
}

fn f32_tensor(name: String, shape: Vec<usize>, values: &[f32]) -> (String, Dtype, Vec<usize>, Vec<u8>) {
    (name, Dtype::F32, shape, bytemuck::cast_slice(values).to_vec())
}

/// Runs the trace.
pub fn trace(engine: &Engine, request: &TraceRequest<'_>) -> Result<Trace, EngineError> {
    let c = engine.checkpoint.config.clone();
    if let Some(&code) = request
        .codes
        .iter()
        .find(|&&code| code as usize >= c.speech.audio_codes)
    {
        return Err(EngineError::Input(format!(
            "code {code} is not below audio_codes {}",
            c.speech.audio_codes
        )));
    }
    check_gamma(request.gamma)?;
    let p = c.speech.voice_prefix_len;
    let v = c.speech.audio_vocab_size;
    let mut audio = vec![c.speech.audio_bos() as u32];
    audio.extend_from_slice(request.codes);
    let cond_rows = rows(0, p, request.text, &audio);
    let s = cond_rows.len();
    if s > c.max_position_embeddings {
        return Err(EngineError::Input(format!(
            "{} text tokens and {} codes make {s} positions with the voice prefix ({p}) and audio_bos, more than the {} the model holds",
            request.text.len(),
            request.codes.len(),
            c.max_position_embeddings
        )));
    }
    let t = audio.len();
    let guided = request.gamma != 1.0;
    let null = engine.checkpoint.float_tensor(names::NULL_PREFIX);
    let (cond, uncond) = match (guided, request.lanes) {
        (false, _) => {
            let mut session = Session::new(engine, 1, s)?;
            if let Some(prefix) = request.prefix {
                session.set_prefix(0, prefix)?;
            }
            (session.step(&cond_rows, true)?, None)
        }
        (true, LaneMode::Paired) => {
            let mut session = Session::new(engine, 2, s)?;
            if let Some(prefix) = request.prefix {
                session.set_prefix(0, prefix)?;
            }
            session.set_prefix(1, &null)?;
            let mut both = cond_rows.clone();
            both.extend(rows(1, p, request.text, &audio));
            let out = session.step(&both, true)?;
            let h = c.hidden_size;
            let k = c.num_experts_per_tok;
            let split = |values: &[f32], width: usize| (values[..s * width].to_vec(), values[s * width..].to_vec());
            let (cond_logits, uncond_logits) = split(&out.logits, v);
            let cond = crate::session::StepOutput {
                logits: cond_logits,
                hidden: out.hidden.iter().map(|x| split(x, h).0).collect(),
                routes: out
                    .routes
                    .iter()
                    .map(|r| r.as_ref().map(|(ids, w)| (ids[..s * k].to_vec(), split(w, k).0)))
                    .collect(),
            };
            let uncond = crate::session::StepOutput {
                logits: uncond_logits,
                hidden: Vec::new(),
                routes: Vec::new(),
            };
            (cond, Some(uncond))
        }
        (true, LaneMode::Separate) => {
            let mut cond_session = Session::new(engine, 1, s)?;
            if let Some(prefix) = request.prefix {
                cond_session.set_prefix(0, prefix)?;
            }
            let cond = cond_session.step(&cond_rows, true)?;
            let mut uncond_session = Session::new(engine, 1, s)?;
            uncond_session.set_prefix(0, &null)?;
            (cond, Some(uncond_session.step(&cond_rows, false)?))
        }
    };
    // Row t of the logits: after audio_bos and the first t codes.
    let last_t = |logits: &[f32]| logits[(s - t) * v..].to_vec();
    let cond_logits = last_t(&cond.logits);
    let mut tensors = vec![f32_tensor("logits.cond".into(), vec![t, v], &cond_logits)];
    if let Some(uncond) = &uncond {
        let uncond_logits = last_t(&uncond.logits);
        let gamma = gamma_fixed(request.gamma);
        let mut mixed = Vec::with_capacity(t * v);
        for (row, (cond, uncond)) in cond_logits.chunks(v).zip(uncond_logits.chunks(v)).enumerate() {
            mixed.extend(
                exact::guided_levels(cond, uncond, gamma)
                    .ok_or_else(|| EngineError::Unsupported(format!("row {row} of the logits has a NaN")))?,
            );
        }
        tensors.push(f32_tensor("logits.uncond".into(), vec![t, v], &uncond_logits));
        tensors.push((
            "levels.mixed".into(),
            Dtype::I32,
            vec![t, v],
            bytemuck::cast_slice(&mixed).to_vec(),
        ));
    }
    let k = c.num_experts_per_tok;
    for (i, hidden) in cond.hidden.iter().enumerate() {
        tensors.push(f32_tensor(format!("layers.{i}.hidden"), vec![s, c.hidden_size], hidden));
        if let Some(Some((ids, route_weights))) = cond.routes.get(i) {
            let ids: Vec<i32> = ids.iter().map(|&id| id as i32).collect();
            tensors.push((
                format!("layers.{i}.router.ids"),
                Dtype::I32,
                vec![s, k],
                bytemuck::cast_slice(&ids).to_vec(),
            ));
            tensors.push(f32_tensor(
                format!("layers.{i}.router.weights"),
                vec![s, k],
                route_weights,
            ));
        }
    }
    let mut decoder = CodecDecoder::new(CodecWeights::upload(engine.gpu.clone(), &engine.checkpoint)?);
    let pcm = decoder.decode(request.codes)?;
    tensors.push(f32_tensor("pcm".into(), vec![pcm.len()], &pcm));
    Ok(Trace { tensors })
}

impl Trace {
    /// The trace as a safetensors file.
    pub fn to_safetensors(&self) -> Result<Vec<u8>, EngineError> {
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = self
            .tensors
            .iter()
            .map(|(name, dtype, shape, data)| {
                safetensors::tensor::TensorView::new(*dtype, shape.clone(), data)
                    .map(|view| (name.clone(), view))
                    .map_err(|e| EngineError::Input(format!("{name}: {e}")))
            })
            .collect::<Result<_, _>>()?;
        let metadata = HashMap::from([("format".to_string(), "drama-trace".to_string())]);
        safetensors::serialize(views, Some(metadata)).map_err(|e| EngineError::Input(e.to_string()))
    }

    /// A tensor's F32 values by name.
    pub fn f32s(&self, name: &str) -> Option<Vec<f32>> {
        self.tensors
            .iter()
            .find(|t| t.0 == name && t.1 == Dtype::F32)
            .map(|t| bytemuck::pod_collect_to_vec(&t.3))
    }
}
