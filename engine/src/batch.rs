//! Continuous batching: synthesis jobs share one session, each on its own lanes (one, or a
//! guidance pair), joining and leaving between steps. Every step is one batched forward of
//! the rows of every job (a new job's whole prompt, a running job's one token per lane);
//! rows never influence each other, so each job gets exactly the bits it would get alone.
//! With separate guidance, cond rows and uncond rows run as two forwards per step.
//!
//! The GPU mixes and samples each job's token behind the forward, and the next step's rows
//! read it there, so the host submits a step before it knows the tokens of the one before:
//! it reads them one step late, while the GPU runs the next. A job's row in a step after
//! the one that drew its audio_eos (or its last segment's end) is wasted work whose token
//! is dropped, never seen by the job.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use crate::codec::{CodecDecoder, CodecWeights};
use crate::error::EngineError;
use crate::gpu::MarkedSpan;
use crate::guidance::check_gamma;
use crate::sampling::gpu::{Draw, DrawnTokens};
use crate::sampling::{SamplingParams, gamma_fixed};
use crate::session::{Engine, Row, RowSource, Session, StepCacheUsage};
use crate::synth::{CODEC_CHUNK, GuidanceMode, LaterSegments, Stop, SynthesisRequest, SynthesisStats, TimeSplit};
use drama_checkpoint::names;

/// Receives a job's PCM as it is produced; returns false to cancel the job.
pub type Sink = Box<dyn FnMut(&[f32]) -> bool + Send>;

/// Identifies an admitted job.
pub type JobId = u64;

/// A job that ended in a step: its stats, or the error that ended it alone (the other jobs
/// of the step went on).
pub type Ended = (JobId, Result<SynthesisStats, EngineError>);

struct Job {
    id: JobId,
    request: SynthesisRequest,
    /// Segments still to come after the request's own ([`Batcher::admit_open`]); the job
    /// waits for them after its last segment.
    later: Option<LaterSegments>,
    cond_lane: usize,
    uncond_lane: Option<usize>,
    segment: usize,
    /// Position of the job's next row; 0 means the segment's prompt is next.
    position: usize,
    /// Codes read in this segment.
    generated: usize,
    /// Tokens read in the request (audio_eos included): the draw index of the first token
    /// not read yet (contract §6.3).
    draws: u64,
    /// The last step that drew a token for this job, and the draw's index in it.
    drawn_in: Option<(u64, usize)>,
    /// Tokens drawn in steps before this one are dropped (the rows of a step submitted
    /// before the job's segment was known to end).
    valid_from: u64,
    gamma_fixed: u32,
    codec: CodecDecoder,
    /// Generated codes not yet given to the codec.
    pending: Vec<u32>,
    /// A full chunk of codes, submitted to the codec right after the next forward.
    chunk: Vec<u32>,
    /// The batcher step in which the codec chunk now in flight was submitted (its last part).
    chunk_submitted: Option<u64>,
    sink: Sink,
    /// The sink refused samples: the job ends with this step.
    cancelled: bool,
    /// What ended this job alone (its logits held a NaN or its codec failed): it ends with
    /// this step, with this error, and the other jobs go on.
    failed: Option<EngineError>,
    /// Test hook ([`Batcher::fail_at_next_step`]): the job fails in its next step.
    fail_next_step: bool,
    stats: SynthesisStats,
    started: Instant,
}

impl Job {
    /// Whether the job has spoken every segment it has and waits for later ones.
    fn waits_for_text(&self) -> bool {
        self.segment == self.request.segments.len()
    }

    /// How much longer the audio handed out so far lasts at `now`, played in real time from
    /// its first sample (zero before the first).
    fn playback_ahead(&self, now: Instant) -> Duration {
        let Some(first) = self.stats.first_audio else {
            return Duration::ZERO;
        };
        let handed_out = Duration::from_secs_f64(self.stats.audio_seconds());
        handed_out.saturating_sub(now.saturating_duration_since(self.started + first))
    }
}

/// A submitted step whose tokens are not read yet.
struct InFlight {
    serial: u64,
    drawn: DrawnTokens,
    /// The job of each draw, in draw order.
    jobs: Vec<JobId>,
}

enum Next {
    Continue,
    Segment,
    Finished(Stop),
    /// The job failed alone (its error is in `Job::failed`).
    Failed,
}

/// Parts a job's codec chunk is submitted in, one behind each step, when the job's audio
/// is far enough ahead of playback (see [`parts_for`]). A chunk fills every CODEC_CHUNK
/// steps; its last part goes out CODEC_CHUNK - 1 steps after its first, so the step after
/// that reads its samples before the next chunk starts. Queued whole behind one step, a
/// chunk delays the next step by all of its GPU time; in parts, by a part's each time, so
/// the steps keep an even pace (the experiment log at the `lab-notebook` tag measured it).
pub const CODEC_CHUNK_PARTS: usize = CODEC_CHUNK - 1;

/// How many parts a job's next codec chunk is submitted in, given how much longer the audio
/// already handed out lasts if played in real time from its first sample (`ahead`) and the
/// time the last step took (`step_time`): [`CODEC_CHUNK_PARTS`] when `ahead` covers twice
/// the steps a chunk in parts takes to arrive, otherwise one (whole). In parts a chunk's
/// samples arrive about CODEC_CHUNK_PARTS steps later than whole, so a listener playing the
/// stream as it comes would run dry where steps are slow next to the audio they make (a
/// slower GPU's steps, say). With nothing ahead (a job's first
/// chunk) the chunk runs whole, so the first audio does not wait.
pub fn parts_for(ahead: Duration, step_time: Duration) -> usize {
    if !ahead.is_zero() && ahead >= step_time * (2 * (CODEC_CHUNK_PARTS as u32 + 1)) {
        CODEC_CHUNK_PARTS
    } else {
        1
    }
}

/// Jobs sharing one session's lanes.
pub struct Batcher<'e> {
    engine: &'e Engine,
    session: Session<'e>,
    codec: Arc<CodecWeights>,
    free: Vec<usize>,
    jobs: Vec<Job>,
    next_id: JobId,
    /// Lanes in all.
    lanes: usize,
    capacity: usize,
    null_prefix: Vec<f32>,
    default_prefix: Vec<f32>,
    /// Decoders of finished jobs, kept with their compiled chunk programs for the next.
    idle_decoders: Vec<CodecDecoder>,
    /// Steps run so far (the next step's serial).
    steps: u64,
    /// The last step submitted, its tokens not read yet.
    in_flight: Option<InFlight>,
    /// When the last step began.
    last_step_start: Option<Instant>,
    /// The time between the two last steps' beginnings: the pace [`parts_for`] assumes.
    step_time: Duration,
    /// The most rows one forward takes (more run as several, in order: rows never
    /// influence each other, and a prompt in parts equals it whole), and the most the
    /// device allows.
    max_forward_rows: usize,
    device_max_rows: usize,
}

impl<'e> Batcher<'e> {
    /// A batcher over `lanes` lanes of `capacity` positions each.
    pub fn new(engine: &'e Engine, lanes: usize, capacity: usize) -> Result<Self, EngineError> {
        let codec = CodecWeights::upload(engine.gpu.clone(), &engine.checkpoint)?;
        // One decoder with its chunk program compiled, so the first request's first audio
        // does not wait for it.
        let mut warm = CodecDecoder::new(codec.clone());
        warm.prepare(CODEC_CHUNK)?;
        let session = Session::new(engine, lanes, capacity)?;
        let device_max_rows = session.max_step_rows()?;
        Ok(Batcher {
            session,
            codec,
            free: (0..lanes).rev().collect(),
            jobs: Vec::new(),
            next_id: 0,
            lanes,
            capacity,
            null_prefix: engine.checkpoint.float_tensor(names::NULL_PREFIX),
            default_prefix: engine.checkpoint.float_tensor(names::DEFAULT_PREFIX),
            idle_decoders: vec![warm],
            steps: 0,
            in_flight: None,
            last_step_start: None,
            step_time: Duration::ZERO,
            max_forward_rows: device_max_rows,
            device_max_rows,
            engine,
        })
    }

    /// Lanes a request with guidance scale `gamma` needs: two with guidance, one without.
    pub fn lanes_needed(gamma: f32) -> usize {
        if gamma == 1.0 { 1 } else { 2 }
    }

    /// Cache positions a segment of `text_len` tokens needs: the voice prefix, the text,
    /// `audio_bos` and up to `max_audio_tokens` audio tokens (saturating: a cap past any
    /// context never wraps around).
    pub fn positions_needed(prefix_len: usize, text_len: usize, max_audio_tokens: usize) -> usize {
        (prefix_len + text_len + 1).saturating_add(max_audio_tokens)
    }

    /// Lanes not held by a job.
    pub fn free_lanes(&self) -> usize {
        self.free.len()
    }

    /// Jobs running.
    pub fn active(&self) -> usize {
        self.jobs.len()
    }

    /// Caps the rows of one forward (at least one; at most what the device allows, which is
    /// the default): a step's rows beyond it run as further forwards, the same bits.
    pub fn set_max_forward_rows(&mut self, rows: usize) {
        self.max_forward_rows = rows.clamp(1, self.device_max_rows);
    }

    /// The most rows one forward takes.
    pub fn max_forward_rows(&self) -> usize {
        self.max_forward_rows
    }

    /// Sets the bytes of compiled step shapes its session keeps beyond the one in use.
    pub fn set_step_cache_budget(&mut self, bytes: u64) {
        self.session.set_step_cache_budget(bytes);
    }

    /// The compiled step shapes its session keeps and the bytes of their buffers.
    pub fn compiled_steps(&self) -> StepCacheUsage {
        self.session.step_cache_usage()
    }

    /// Marks the submissions of the next `steps` steps that feed a job with timestamps
    /// (see [`Session::mark_draws`]): their last forward, their draws and their codec work.
    pub fn mark_steps(&mut self, steps: u32) -> Result<(), EngineError> {
        self.session.mark_draws(steps)
    }

    /// The marked steps' spans so far, in order; waits for them to finish.
    pub fn marked_steps(&self) -> Result<Vec<MarkedSpan>, EngineError> {
        self.session.marked_spans()
    }

    /// Checks a request against the model and this batcher, without admitting it.
    pub fn check(&self, request: &SynthesisRequest) -> Result<(), EngineError> {
        let c = &self.engine.checkpoint.config;
        if request.segments.is_empty() {
            return Err(EngineError::Input("nothing to say: the text has no tokens".into()));
        }
        check_gamma(request.gamma)?;
        if request.max_audio_tokens == 0 {
            return Err(EngineError::Input("max_audio_tokens must be at least 1".into()));
        }
        request.sampling.validate()?;
        let lanes = Self::lanes_needed(request.gamma);
        if lanes > self.lanes {
            return Err(EngineError::Input(format!(
                "gamma {} guides with {lanes} lanes, more than the {} this batcher has",
                request.gamma, self.lanes
            )));
        }
        Self::check_segments(
            self.engine,
            self.capacity,
            &request.segments,
            0,
            request.max_audio_tokens,
        )?;
        let p = c.speech.voice_prefix_len;
        if let Some(prefix) = &request.prefix
            && prefix.len() != p * c.hidden_size
        {
            return Err(EngineError::Input(format!(
                "voice prefix of {} values, expected {}",
                prefix.len(),
                p * c.hidden_size
            )));
        }
        Ok(())
    }

    /// Checks segments `first`, `first + 1`, ... of a request that generates up to
    /// `max_audio_tokens` tokens per segment: each holds a token, every token is a text id,
    /// and each fits a lane of `capacity` positions beside the voice prefix and its speech.
    fn check_segments(
        engine: &Engine,
        capacity: usize,
        segments: &[Vec<u32>],
        first: usize,
        max_audio_tokens: usize,
    ) -> Result<(), EngineError> {
        let c = &engine.checkpoint.config;
        for (s, segment) in segments.iter().enumerate() {
            let s = first + s;
            if segment.is_empty() {
                return Err(EngineError::Input(format!("nothing to say: segment {s} has no tokens")));
            }
            if let Some((t, &id)) = segment
                .iter()
                .enumerate()
                .find(|&(_, &id)| id as usize >= c.text_vocab_size)
            {
                return Err(EngineError::Input(format!(
                    "segment {s}, token {t}: text id {id} is not below text_vocab_size {}",
                    c.text_vocab_size
                )));
            }
            let needed = Self::positions_needed(c.speech.voice_prefix_len, segment.len(), max_audio_tokens);
            if needed > capacity {
                return Err(EngineError::Input(format!(
                    "a segment of {} tokens with up to {max_audio_tokens} audio tokens needs {needed} positions, more than the {capacity} available",
                    segment.len(),
                )));
            }
        }
        Ok(())
    }

    /// Admits a job if its lanes are free; its PCM goes to `sink`.
    pub fn admit(&mut self, request: SynthesisRequest, sink: Sink) -> Result<JobId, EngineError> {
        self.admit_job(request, None, sink)
    }

    /// Admits a job, as [`Batcher::admit`], whose request holds the first of its segments:
    /// the others come through `later` while it runs ([`crate::synth::SynthesisRequest::opening`]).
    /// After its last segment so far the job waits, its lanes idle, until they come; they
    /// are checked as [`Batcher::check`] checks a request's, and if they fail the check or
    /// never come (an error, or `later` closed) the job fails alone. The job's bits are
    /// those of the whole request admitted at once.
    pub fn admit_open(
        &mut self,
        request: SynthesisRequest,
        later: LaterSegments,
        sink: Sink,
    ) -> Result<JobId, EngineError> {
        self.admit_job(request, Some(later), sink)
    }

    fn admit_job(
        &mut self,
        request: SynthesisRequest,
        later: Option<LaterSegments>,
        sink: Sink,
    ) -> Result<JobId, EngineError> {
        self.check(&request)?;
        let needed = Self::lanes_needed(request.gamma);
        if self.free.len() < needed {
            return Err(EngineError::Input(format!(
                "{needed} free lanes needed, {} free",
                self.free.len()
            )));
        }
        // Everything that can fail comes before the lanes and the decoder are taken.
        let cond_lane = self.free[self.free.len() - 1];
        let uncond_lane = (needed == 2).then(|| self.free[self.free.len() - 2]);
        let prefix = request.prefix.clone().unwrap_or_else(|| self.default_prefix.clone());
        self.session.set_prefix(cond_lane, &prefix)?;
        if let Some(lane) = uncond_lane {
            self.session.set_prefix(lane, &self.null_prefix)?;
        }
        self.free.truncate(self.free.len() - needed);
        let codec = match self.idle_decoders.pop() {
            Some(mut decoder) => {
                decoder.reset();
                decoder
            }
            None => CodecDecoder::new(self.codec.clone()),
        };
        let id = self.next_id;
        self.next_id += 1;
        self.jobs.push(Job {
            id,
            draws: 0,
            drawn_in: None,
            valid_from: 0,
            gamma_fixed: gamma_fixed(request.gamma),
            stats: SynthesisStats {
                tokens: 0,
                samples: 0,
                sample_rate: self.engine.checkpoint.config.codec.sample_rate,
                wall: Duration::ZERO,
                first_audio: None,
                stop: Stop::Finished,
                time_split: TimeSplit::default(),
                chunks_in_parts: 0,
                capped_segments: 0,
            },
            request,
            later,
            cond_lane,
            uncond_lane,
            segment: 0,
            position: 0,
            generated: 0,
            codec,
            pending: Vec::new(),
            chunk: Vec::new(),
            chunk_submitted: None,
            sink,
            cancelled: false,
            failed: None,
            fail_next_step: false,
            started: Instant::now(),
        });
        Ok(id)
    }

    /// Whether a job has rows in step `serial`: its segment's prompt is next, or the token
    /// it drew in the step before is still to be fed back (and, were it a code, would not
    /// be the segment's last). A job whose in-flight token may end its segment by the cap
    /// waits a step for it; one that failed or was cancelled ends when the step is read.
    fn feeds(job: &Job, serial: u64) -> bool {
        if job.failed.is_some() || job.cancelled || job.waits_for_text() {
            return false;
        }
        job.position == 0
            || (job
                .drawn_in
                .is_some_and(|(step, _)| step + 1 == serial && step >= job.valid_from)
                && job.generated + 1 < job.request.max_audio_tokens)
    }

    /// The rows a job feeds this step for one of its lanes: its segment's prompt, or the
    /// token it drew in the step before, read on the GPU.
    fn rows(&self, job: &Job, lane: usize) -> Vec<Row> {
        let c = &self.engine.checkpoint.config;
        if job.position == 0 {
            let segment = &job.request.segments[job.segment];
            (0..c.speech.voice_prefix_len)
                .map(RowSource::Prefix)
                .chain(segment.iter().map(|&t| RowSource::Text(t)))
                .chain(std::iter::once(RowSource::Audio(c.speech.audio_bos() as u32)))
                .enumerate()
                .map(|(pos, source)| Row { source, lane, pos })
                .collect()
        } else {
            let (_, draw) = job.drawn_in.expect("a job feeding a token drew it");
            vec![Row {
                source: RowSource::Drawn(draw),
                lane,
                pos: job.position,
            }]
        }
    }

    /// Runs one batched step: submits every feeding job's rows, their draws and the codec
    /// work in one submission, then reads the tokens of the step before (the GPU runs this
    /// one meanwhile) and moves their jobs on. Returns the jobs that ended, with their stats
    /// or the error that ended one alone (its codec failed, or its logits held a NaN: the
    /// other jobs go on, with the bits they would have alone). An error of the step itself (the GPU) is the
    /// `Err`; the running jobs should then be cancelled.
    pub fn step(&mut self) -> Result<Vec<Ended>, EngineError> {
        if self.jobs.is_empty() && self.in_flight.is_none() {
            return Ok(Vec::new());
        }
        self.receive_later_segments();
        let serial = self.steps;
        self.steps += 1;
        let began = Instant::now();
        if let Some(last) = self.last_step_start.replace(began) {
            self.step_time = began - last;
        }
        // The codec work goes behind the step's draws, in the same submission (each
        // submission waits for the one before to signal it): the GPU decodes after them
        // while the host reads the tokens before and moves on. The step after a chunk's
        // last part reads its samples, once its own forward is submitted.
        let (codec_commands, encode_time) = self.encode_chunks(serial);
        let submitted = self
            .submit_step(serial, codec_commands)
            .inspect_err(|_| self.in_flight = None)?;
        let codec_time = encode_time + self.deliver_finished_chunks(serial);
        // The tokens of the step before, by job, and that step's serial.
        let mut tokens = HashMap::new();
        let mut read_serial = 0;
        if let Some(read) = std::mem::replace(&mut self.in_flight, submitted) {
            tokens.extend(read.jobs.into_iter().zip(self.session.drawn(read.drawn)?));
            read_serial = read.serial;
        }
        // The codec submissions inside the window are counted as codec time.
        let forward = began.elapsed().saturating_sub(codec_time);
        let split = self.session.take_forward_split();
        for job in &mut self.jobs {
            job.stats.time_split.forward += forward;
            job.stats.time_split.forward_split += split;
        }
        let mut outcomes = Vec::new();
        for job in &mut self.jobs {
            if std::mem::take(&mut job.fail_next_step) {
                job.failed
                    .get_or_insert(EngineError::Input("a failure injected by a test".into()));
            }
            let token = tokens.get(&job.id).copied().filter(|_| read_serial >= job.valid_from);
            let outcome = if job.failed.is_some() {
                Ok(Next::Failed)
            } else if job.cancelled {
                Ok(Next::Finished(Stop::Cancelled))
            } else {
                match token {
                    None => Ok(Next::Continue),
                    Some(None) => Err(EngineError::Unsupported(
                        "a logit the job's token is drawn from is NaN".into(),
                    )),
                    Some(Some(token)) => Self::advance(self.engine, job, token),
                }
            };
            outcomes.push(outcome.unwrap_or_else(|error| {
                job.failed = Some(error);
                Next::Failed
            }));
        }
        let mut finished = Vec::new();
        let mut index = 0;
        for outcome in outcomes {
            let job = &mut self.jobs[index];
            match outcome {
                Next::Continue => index += 1,
                Next::Segment => {
                    job.segment += 1;
                    job.position = 0;
                    job.generated = 0;
                    // The row this step fed the job is the old segment's: its token goes.
                    job.valid_from = self.steps;
                    index += 1;
                }
                Next::Finished(stop) => {
                    let (id, stats) = self.release(index, stop);
                    finished.push((id, Ok(stats)));
                }
                Next::Failed => {
                    let error = job.failed.take().expect("a failed job has its error");
                    let (id, _) = self.release(index, Stop::Failed);
                    finished.push((id, Err(error)));
                }
            }
        }
        Ok(finished)
    }

    /// Appends the later segments that have come to the jobs admitted open, each checked
    /// as a request's; a job whose segments fail the check or will not come fails alone.
    /// While every job waits for them and no step is in flight, waits up to a millisecond
    /// for the first job's, so that an idle batcher does not spin.
    fn receive_later_segments(&mut self) {
        let idle = self.in_flight.is_none() && self.jobs.iter().all(Job::waits_for_text);
        let (engine, capacity) = (self.engine, self.capacity);
        for (i, job) in self.jobs.iter_mut().enumerate() {
            let Some(later) = &job.later else { continue };
            let received = if idle && i == 0 {
                later.recv_timeout(Duration::from_millis(1)).map_err(|e| match e {
                    RecvTimeoutError::Timeout => TryRecvError::Empty,
                    RecvTimeoutError::Disconnected => TryRecvError::Disconnected,
                })
            } else {
                later.try_recv()
            };
            let segments = match received {
                Err(TryRecvError::Empty) => continue,
                Err(TryRecvError::Disconnected) => Err(EngineError::Input(
                    "the rest of the text was never cut into segments".into(),
                )),
                Ok(Ok(segments)) if segments.is_empty() => {
                    Err(EngineError::Input("the rest of the text holds no segment".into()))
                }
                Ok(segments) => segments,
            };
            job.later = None;
            let (first, cap) = (job.request.segments.len(), job.request.max_audio_tokens);
            let checked = segments
                .and_then(|segments| Self::check_segments(engine, capacity, &segments, first, cap).map(|()| segments));
            match checked {
                Ok(segments) => job.request.segments.extend(segments),
                Err(error) => {
                    job.failed.get_or_insert(error);
                }
            }
        }
    }

    /// Submits step `serial`: the rows of every job that feeds ([`Batcher::feeds`]) as one
    /// forward (two with separate guidance; more past the forward limit), each job's last
    /// cond and uncond logit rows kept, and one draw per job behind them, then
    /// `codec_commands` (alone when no job feeds), whose submission each job's decoder
    /// learns. The jobs move on only once all of it is submitted. `None` when no job feeds.
    fn submit_step(
        &mut self,
        serial: u64,
        codec_commands: Vec<wgpu::CommandBuffer>,
    ) -> Result<Option<InFlight>, EngineError> {
        let forbidden = self.engine.checkpoint.config.speech.audio_bos();
        let separate = self.jobs.iter().any(|j| j.request.guidance == GuidanceMode::Separate);
        let mut cond_rows = Vec::new();
        let mut uncond_rows = Vec::new();
        // (row, kept row): each job's last row in each kind of lane, kept for its draw.
        let mut keep_cond = Vec::new();
        let mut keep_uncond = Vec::new();
        let mut kept = 0;
        let mut draws = Vec::new();
        let mut feeding = Vec::new();
        for (i, job) in self.jobs.iter().enumerate() {
            if !Self::feeds(job, serial) {
                continue;
            }
            let rows = self.rows(job, job.cond_lane);
            let fed = rows.len();
            cond_rows.extend(rows);
            let cond = kept;
            keep_cond.push((cond_rows.len() - 1, cond));
            kept += 1;
            let mut uncond = None;
            if let Some(lane) = job.uncond_lane {
                uncond_rows.extend(self.rows(job, lane));
                keep_uncond.push((uncond_rows.len() - 1, kept));
                uncond = Some((kept, job.gamma_fixed));
                kept += 1;
            }
            // A decode row feeds a token not read yet, whose draw comes before this one.
            let index = job.draws + u64::from(job.position != 0);
            draws.push(Draw {
                settings: job.request.sampling.exact(index),
                forbidden,
                cond,
                uncond,
            });
            feeding.push((i, fed));
        }
        if feeding.is_empty() {
            if !codec_commands.is_empty() {
                let submission = self.engine.gpu.submit_commands(codec_commands);
                self.codecs_submitted(&submission);
            }
            return Ok(None);
        }
        let forwards = if separate {
            vec![(cond_rows, keep_cond), (uncond_rows, keep_uncond)]
        } else {
            let n = cond_rows.len();
            cond_rows.extend(uncond_rows);
            keep_cond.extend(keep_uncond.into_iter().map(|(row, kept)| (row + n, kept)));
            vec![(cond_rows, keep_cond)]
        };
        // Rows past the forward limit run as further forwards behind the first.
        for (rows, keep) in &forwards {
            for (part, chunk) in rows.chunks(self.max_forward_rows).enumerate() {
                let first = part * self.max_forward_rows;
                let kept: Vec<(usize, usize)> = keep
                    .iter()
                    .filter(|&&(row, _)| (first..first + chunk.len()).contains(&row))
                    .map(|&(row, kept)| (row - first, kept))
                    .collect();
                self.session.submit_for_draws(chunk, &kept)?;
            }
        }
        let drawn = self.session.draw(&draws, codec_commands)?;
        self.codecs_submitted(drawn.submission());
        let mut jobs = Vec::with_capacity(feeding.len());
        for (draw, &(i, fed)) in feeding.iter().enumerate() {
            let job = &mut self.jobs[i];
            job.position = if job.position == 0 { fed } else { job.position + 1 };
            job.drawn_in = Some((serial, draw));
            jobs.push(job.id);
        }
        Ok(Some(InFlight { serial, drawn, jobs }))
    }

    /// Test hook: job `id` fails in its next step, as if its logits or codec had, so tests
    /// can show that the other jobs go on untouched. False when no such job runs.
    pub fn fail_at_next_step(&mut self, id: JobId) -> bool {
        let job = self.jobs.iter_mut().find(|j| j.id == id);
        job.map(|job| job.fail_next_step = true).is_some()
    }

    /// Encodes every job's codec work for this step (its time is counted as codec time): a
    /// full chunk (whole or its first part: see [`parts_for`]), or the next part of a chunk
    /// begun earlier; returns the command buffers, for the step's submission, and the time
    /// it took.
    fn encode_chunks(&mut self, step: u64) -> (Vec<wgpu::CommandBuffer>, Duration) {
        let all = Instant::now();
        let mut commands = Vec::new();
        for job in self.jobs.iter_mut().filter(|job| job.failed.is_none()) {
            let start = Instant::now();
            if !job.chunk.is_empty() {
                let parts = parts_for(job.playback_ahead(start), self.step_time);
                if let Err(error) = job.codec.encode_in_parts(&job.chunk, parts) {
                    job.failed = Some(error);
                    continue;
                }
                job.chunk.clear();
                job.stats.chunks_in_parts += usize::from(job.codec.parts_left());
            } else if job.codec.parts_left() {
                job.codec.encode_next_part();
            } else {
                continue;
            }
            commands.extend(job.codec.take_encoded());
            if !job.codec.parts_left() {
                job.chunk_submitted = Some(step);
            }
            job.stats.time_split.codec += start.elapsed();
        }
        (commands, all.elapsed())
    }

    /// Tells every job's decoder the submission that carried the codec work of
    /// [`Batcher::encode_chunks`].
    fn codecs_submitted(&mut self, submission: &wgpu::SubmissionIndex) {
        for job in &mut self.jobs {
            job.codec.submitted(submission);
        }
    }

    /// Hands out the samples of every codec chunk whose last part was submitted before this
    /// step (so it ran before this step's forward, which is submitted: the GPU has work while
    /// the host reads and hands them out); a job whose sink refuses them is marked cancelled.
    /// Returns the time it took (codec time).
    fn deliver_finished_chunks(&mut self, step: u64) -> Duration {
        let all = Instant::now();
        for job in &mut self.jobs {
            if job.failed.is_none() && job.chunk_submitted.is_some_and(|submitted| submitted < step) {
                job.chunk_submitted = None;
                match Self::deliver(job, |codec| codec.finish()) {
                    Ok(accepted) => job.cancelled |= !accepted,
                    Err(error) => job.failed = Some(error),
                }
            }
        }
        all.elapsed()
    }

    /// Moves a job on with its drawn `token`, read from the GPU: records it and fills the
    /// next chunk (at the request's end, decodes and hands out everything left).
    fn advance(engine: &Engine, job: &mut Job, token: u32) -> Result<Next, EngineError> {
        let c = &engine.checkpoint.config;
        job.draws += 1;
        let ended = token as usize == c.speech.audio_eos();
        if !ended {
            job.stats.tokens += 1;
            job.generated += 1;
            job.pending.push(token);
        }
        let segment_done = ended || job.generated == job.request.max_audio_tokens;
        if segment_done && !ended {
            job.stats.capped_segments += 1;
        }
        let last_segment = job.segment + 1 == job.request.segments.len() && job.later.is_none();
        if segment_done && last_segment {
            // The request's last samples: the chunk in flight and the codes not yet decoded,
            // read at once. (No full chunk waits here: each is submitted in the step after
            // it fills, before the tokens that step reads.)
            debug_assert!(job.chunk.is_empty(), "a chunk waits at the end of a request");
            job.chunk_submitted = None;
            let pending = std::mem::take(&mut job.pending);
            if !Self::deliver(job, |codec| {
                codec.submit(&pending)?;
                codec.finish()
            })? {
                return Ok(Next::Finished(Stop::Cancelled));
            }
            return Ok(Next::Finished(Stop::Finished));
        }
        if job.pending.len() == CODEC_CHUNK || (segment_done && !job.pending.is_empty()) {
            job.chunk.append(&mut job.pending);
        }
        if segment_done {
            Ok(Next::Segment)
        } else {
            Ok(Next::Continue)
        }
    }

    /// Runs `codec` work on the job's decoder (timed as codec time) and hands the samples it
    /// returns to the sink; false when the sink cancels the job.
    fn deliver(
        job: &mut Job,
        codec: impl FnOnce(&mut CodecDecoder) -> Result<Vec<f32>, EngineError>,
    ) -> Result<bool, EngineError> {
        let codec_start = Instant::now();
        let pcm = codec(&mut job.codec)?;
        job.stats.time_split.codec += codec_start.elapsed();
        if pcm.is_empty() {
            return Ok(true);
        }
        job.stats.first_audio.get_or_insert_with(|| job.started.elapsed());
        job.stats.samples += pcm.len();
        Ok((job.sink)(&pcm))
    }

    /// Runs one short throwaway job with `guidance` and `gamma` (as the server's requests
    /// use them; unguided when fewer lanes exist than guidance needs) through a prompt,
    /// decoding steps and, unless it samples audio_eos early, a codec chunk, so that what a
    /// process pays once is paid before its first request; returns the job's stats (None:
    /// the session's lanes are too short for the job, which is skipped). Refused while jobs
    /// run. Every lane is free again afterwards, and later jobs get exactly the bits they
    /// would get without it (rows never see other positions than their own job's).
    pub fn warm_up(&mut self, guidance: GuidanceMode, gamma: f32) -> Result<Option<SynthesisStats>, EngineError> {
        if !self.jobs.is_empty() {
            return Err(EngineError::Input("warming up needs a batcher without jobs".into()));
        }
        // Positions left after the voice prefix, a one-token prompt and audio_bos.
        let room = self
            .capacity
            .saturating_sub(self.engine.checkpoint.config.speech.voice_prefix_len + 2);
        if room == 0 {
            return Ok(None);
        }
        let gamma = if self.free.len() >= Self::lanes_needed(gamma) {
            gamma
        } else {
            1.0
        };
        let request = SynthesisRequest {
            segments: vec![vec![0]],
            prefix: None,
            gamma,
            guidance,
            sampling: SamplingParams::unfiltered(0),
            max_audio_tokens: (CODEC_CHUNK + 1).min(room),
        };
        let id = self.admit(request, Box::new(|_| true))?;
        loop {
            if let Some((_, ended)) = self.step()?.into_iter().find(|(ended, _)| *ended == id) {
                return ended.map(Some);
            }
        }
    }

    /// Cancels a job (its lanes free at once).
    pub fn cancel(&mut self, id: JobId) -> Option<SynthesisStats> {
        let index = self.jobs.iter().position(|j| j.id == id)?;
        Some(self.release(index, Stop::Cancelled).1)
    }

    /// Ends job `index`: its lanes are free, its decoder kept for the next job.
    fn release(&mut self, index: usize, stop: Stop) -> (JobId, SynthesisStats) {
        let mut job = self.jobs.remove(index);
        job.stats.stop = stop;
        job.stats.wall = job.started.elapsed();
        self.free.push(job.cond_lane);
        self.free.extend(job.uncond_lane);
        // A decoder whose work failed is not trusted with the next job's.
        if stop != Stop::Failed {
            self.idle_decoders.push(job.codec);
        }
        (job.id, job.stats)
    }
}

/// Synthesizes the request alone, handing PCM to `sink` as it is produced; `sink` returns
/// false to cancel (generation stops before the next step). Runs through the same batcher
/// as the server, so the CLI and a served request give the same bits.
pub fn synthesize(
    engine: &Engine,
    request: &SynthesisRequest,
    sink: &mut dyn FnMut(&[f32]) -> bool,
) -> Result<SynthesisStats, EngineError> {
    let c = &engine.checkpoint.config;
    let longest = request.segments.iter().map(Vec::len).max().unwrap_or(0);
    let capacity = Batcher::positions_needed(c.speech.voice_prefix_len, longest, request.max_audio_tokens)
        .min(c.max_position_embeddings);
    let mut batcher = Batcher::new(engine, Batcher::lanes_needed(request.gamma), capacity.max(1))?;
    // The batcher's sink must be 'static: collect chunks through a channel and forward them.
    let (sender, receiver) = std::sync::mpsc::channel::<Vec<f32>>();
    let cancelled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = cancelled.clone();
    batcher.admit(
        request.clone(),
        Box::new(move |pcm: &[f32]| {
            !flag.load(std::sync::atomic::Ordering::SeqCst) && sender.send(pcm.to_vec()).is_ok()
        }),
    )?;
    loop {
        let finished = batcher.step()?;
        for pcm in receiver.try_iter() {
            if !sink(&pcm) {
                cancelled.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        if let Some((_, ended)) = finished.into_iter().next() {
            return ended;
        }
        if cancelled.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(batcher.cancel(0).expect("the one job is running"));
        }
    }
}
