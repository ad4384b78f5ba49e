//! The GPU worker: one thread owns the engine and a continuous batcher. Requests queue for
//! lanes, join the batch between steps, stream PCM back through channels, and leave when
//! they finish, when their client disconnects (checked before every step) or when their
//! time limit passes.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use drama_engine::batch::{Batcher, JobId};
use drama_engine::session::Engine;
use drama_engine::synth::{Stop, SynthesisRequest, SynthesisStats};
use tokio::sync::{mpsc, oneshot};

use crate::ServerConfig;
use crate::api::ApiError;
use crate::metrics::Metrics;
use crate::unread::Chunk;

/// A speech job handed to the worker.
pub struct SpeakJob {
    /// What to synthesize, its voice prefix resolved.
    pub request: SynthesisRequest,
    /// Answered once the job is queued (Ok) or refused (unknown voice...).
    pub accepted: oneshot::Sender<Result<(), ApiError>>,
    /// PCM chunks as they are produced.
    pub chunks: mpsc::UnboundedSender<Chunk>,
    /// How the job ended.
    pub done: oneshot::Sender<Outcome>,
    /// When to give up.
    pub deadline: Instant,
}

/// How a job ended: its stats (stopped early if its time ran out or its client left), or why
/// it failed (a step's error, which fails every job of the step).
pub type Outcome = Result<SynthesisStats, String>;

/// A job waiting for lanes.
struct Queued {
    request: SynthesisRequest,
    chunks: mpsc::UnboundedSender<Chunk>,
    done: oneshot::Sender<Outcome>,
    deadline: Instant,
}

struct Running {
    chunks: mpsc::UnboundedSender<Chunk>,
    done: oneshot::Sender<Outcome>,
    deadline: Instant,
    lanes: usize,
}

/// Runs the worker until every command sender is gone and the work is finished.
pub fn run(
    engine: Engine,
    config: ServerConfig,
    capacity: usize,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    jobs: std::sync::mpsc::Receiver<SpeakJob>,
) -> Result<(), String> {
    let mut batcher = Batcher::new(&engine, config.max_lanes, capacity).map_err(|e| e.to_string())?;
    batcher.set_step_cache_budget(config.step_cache_bytes);
    let warming = Instant::now();
    match batcher.warm_up(config.guidance, config.gamma) {
        Ok(Some(stats)) => eprintln!(
            "drama serve: warmed up in {:.2} s ({} tokens)",
            warming.elapsed().as_secs_f64(),
            stats.tokens
        ),
        Ok(None) => eprintln!("drama serve: no warm-up (the lanes are too short for it)"),
        Err(e) => return Err(format!("warming up: {e}")),
    }
    ready.store(true, Ordering::SeqCst);
    let mut waiting: VecDeque<Queued> = VecDeque::new();
    let mut running: HashMap<JobId, Running> = HashMap::new();
    let mut open = true;
    while open || !waiting.is_empty() || !running.is_empty() {
        // Take every new job; block only when there is nothing else to do.
        loop {
            let job = if running.is_empty() && waiting.is_empty() && open {
                match jobs.recv() {
                    Ok(job) => job,
                    Err(_) => {
                        open = false;
                        break;
                    }
                }
            } else {
                match jobs.try_recv() {
                    Ok(job) => job,
                    Err(std::sync::mpsc::TryRecvError::Empty) => break,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            };
            let SpeakJob {
                request,
                accepted,
                chunks,
                done,
                deadline,
            } = job;
            let checked = batcher
                .check(&request)
                .map_err(|e| ApiError::invalid("input", e.to_string()));
            let ok = checked.is_ok();
            let _ = accepted.send(checked);
            if ok {
                waiting.push_back(Queued {
                    request,
                    chunks,
                    done,
                    deadline,
                });
            }
        }
        let abandoned = drop_abandoned(&mut waiting);
        metrics.cancellations.fetch_add(abandoned as u64, Ordering::SeqCst);
        // Admit waiting jobs, in order, while their lanes are free.
        while let Some(job) = waiting.front() {
            let needed = Batcher::lanes_needed(job.request.gamma);
            if batcher.free_lanes() < needed {
                break;
            }
            let job = waiting.pop_front().expect("front exists");
            let sender = job.chunks.clone();
            let counted = metrics.clone();
            let sink = Box::new(move |pcm: &[f32]| sender.send(Chunk::new(pcm.to_vec(), &counted)).is_ok());
            match batcher.admit(job.request, sink) {
                Ok(id) => {
                    running.insert(
                        id,
                        Running {
                            chunks: job.chunks,
                            done: job.done,
                            deadline: job.deadline,
                            lanes: needed,
                        },
                    );
                }
                // Checked at queueing time; a refusal here drops the job's channels, which
                // its handler reports as a server error.
                Err(e) => eprintln!("drama serve: admitting a checked job failed: {e}"),
            }
        }
        // Drop jobs whose client left or whose time is up: within one step.
        let gone: Vec<JobId> = running
            .iter()
            .filter(|(_, r)| r.chunks.is_closed() || Instant::now() > r.deadline)
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            if let (Some(stats), Some(job)) = (batcher.cancel(id), running.remove(&id)) {
                metrics.cancellations.fetch_add(1, Ordering::SeqCst);
                let _ = job.done.send(Ok(stats));
            }
        }
        metrics.queue_depth.store(waiting.len() as u64, Ordering::SeqCst);
        metrics
            .active_lanes
            .store(running.values().map(|r| r.lanes as u64).sum(), Ordering::SeqCst);
        if running.is_empty() {
            continue;
        }
        let finished = match batcher.step() {
            Ok(finished) => finished,
            Err(e) => {
                // A failed step fails every running job; their lanes are freed.
                eprintln!("drama serve: step failed: {e}");
                for (id, job) in running.drain() {
                    batcher.cancel(id);
                    let _ = job.done.send(Err(format!("a step failed: {e}")));
                }
                continue;
            }
        };
        let compiled = batcher.compiled_steps();
        metrics.compiled_steps.store(compiled.steps as u64, Ordering::SeqCst);
        metrics.compiled_step_bytes.store(compiled.bytes, Ordering::SeqCst);
        for (id, stats) in finished {
            if let Some(job) = running.remove(&id) {
                if stats.stop == Stop::Cancelled {
                    metrics.cancellations.fetch_add(1, Ordering::SeqCst);
                } else {
                    let audio = stats.audio_seconds();
                    let first = stats.first_audio.map_or(f64::NAN, |d| d.as_secs_f64());
                    metrics.synthesis(first, stats.wall.as_secs_f64() / audio.max(1e-9));
                }
                let _ = job.done.send(Ok(stats));
            }
        }
        metrics
            .active_lanes
            .store(running.values().map(|r| r.lanes as u64).sum(), Ordering::SeqCst);
    }
    metrics.queue_depth.store(0, Ordering::SeqCst);
    metrics.active_lanes.store(0, Ordering::SeqCst);
    Ok(())
}

/// Drops the waiting jobs whose client has left (they would hold memory and queue places),
/// keeping the others in order; returns how many went.
fn drop_abandoned(waiting: &mut VecDeque<Queued>) -> usize {
    let before = waiting.len();
    waiting.retain(|job| !job.chunks.is_closed());
    before - waiting.len()
}

#[cfg(test)]
mod tests {
    use drama_engine::sampling::SamplingParams;
    use drama_engine::synth::GuidanceMode;

    use super::*;

    fn queued(seed: u64) -> (Queued, mpsc::UnboundedReceiver<Chunk>) {
        let (chunks, receiver) = mpsc::unbounded_channel();
        let request = SynthesisRequest {
            segments: vec![vec![3, 1, 4]],
            prefix: None,
            gamma: 1.0,
            guidance: GuidanceMode::Paired,
            sampling: SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                seed,
            },
            max_audio_tokens: 8,
        };
        let (done, _) = oneshot::channel();
        let job = Queued {
            request,
            chunks,
            done,
            deadline: Instant::now(),
        };
        (job, receiver)
    }

    /// Waiting jobs whose client went away (their chunk receiver dropped with the response)
    /// leave the queue; the others stay, in their order.
    #[test]
    fn waiting_jobs_whose_client_left_are_dropped_in_order() {
        let seeds: Vec<u64> = (0..6).map(|i| 1000 + 7 * i).collect();
        let (jobs, mut receivers): (VecDeque<Queued>, Vec<_>) = seeds.iter().map(|&s| queued(s)).unzip();
        let mut waiting = jobs;
        assert_eq!(drop_abandoned(&mut waiting), 0);
        let left = [1usize, 4, 5];
        for &i in left.iter().rev() {
            drop(receivers.remove(i));
        }
        assert_eq!(drop_abandoned(&mut waiting), 3);
        let kept: Vec<u64> = waiting.iter().map(|j| j.request.sampling.seed).collect();
        assert_eq!(kept, [seeds[0], seeds[2], seeds[3]]);
        assert_eq!(drop_abandoned(&mut waiting), 0);
    }
}
