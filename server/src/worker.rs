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
use drama_engine::synth::{LaterSegments, Stop, SynthesisRequest, SynthesisStats};
use tokio::sync::{mpsc, oneshot};

use crate::ServerConfig;
use crate::api::ApiError;
use crate::metrics::Metrics;
use crate::unread::Chunk;

/// A speech job handed to the worker.
pub struct SpeakJob {
    /// What to synthesize, its voice prefix resolved.
    pub request: SynthesisRequest,
    /// The segments after the request's first, when they are still being cut.
    pub later: Option<LaterSegments>,
    /// Answered once the job is queued (Ok) or refused (unknown voice...).
    pub accepted: oneshot::Sender<Result<(), ApiError>>,
    /// PCM chunks as they are produced.
    pub chunks: mpsc::UnboundedSender<Chunk>,
    /// How the job ended.
    pub done: oneshot::Sender<Outcome>,
    /// When to give up.
    pub deadline: Instant,
}

/// How a job ended.
#[derive(Debug)]
pub enum Outcome {
    /// It ran: to its end, or stopped early because its time ran out or its client left.
    Ran(SynthesisStats),
    /// Its time ran out while it waited for lanes.
    ExpiredWaiting,
    /// It failed: alone (its sampler or codec), or with every job of a step that failed.
    Failed(String),
}

/// A job waiting for lanes.
struct Queued {
    request: SynthesisRequest,
    later: Option<LaterSegments>,
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
                later,
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
                    later,
                    chunks,
                    done,
                    deadline,
                });
            }
        }
        let dropped = drop_unservable(&mut waiting, Instant::now());
        metrics.cancellations.fetch_add(dropped as u64, Ordering::SeqCst);
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
            let admitted = match job.later {
                Some(later) => batcher.admit_open(job.request, later, sink),
                None => batcher.admit(job.request, sink),
            };
            match admitted {
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
                let _ = job.done.send(Outcome::Ran(stats));
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
                    let _ = job.done.send(Outcome::Failed(format!("a step failed: {e}")));
                }
                continue;
            }
        };
        let compiled = batcher.compiled_steps();
        metrics.compiled_steps.store(compiled.steps as u64, Ordering::SeqCst);
        metrics.compiled_step_bytes.store(compiled.bytes, Ordering::SeqCst);
        for (id, ended) in finished {
            if let Some(job) = running.remove(&id) {
                let stats = match ended {
                    Ok(stats) => stats,
                    Err(e) => {
                        // This job alone failed; the others of the step go on.
                        eprintln!("drama serve: a job failed: {e}");
                        let _ = job.done.send(Outcome::Failed(e.to_string()));
                        continue;
                    }
                };
                if stats.stop == Stop::Cancelled {
                    metrics.cancellations.fetch_add(1, Ordering::SeqCst);
                } else {
                    let audio = stats.audio_seconds();
                    let first = stats.first_audio.map_or(f64::NAN, |d| d.as_secs_f64());
                    // A job that made no audio has no real-time factor (NaN: left out).
                    let factor = if audio > 0.0 {
                        stats.wall.as_secs_f64() / audio
                    } else {
                        f64::NAN
                    };
                    metrics.synthesis(first, factor);
                }
                let _ = job.done.send(Outcome::Ran(stats));
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

/// Drops the waiting jobs whose client has left (they would hold memory and queue places)
/// or whose time limit passed before `now` (answered [`Outcome::ExpiredWaiting`] at once,
/// not when lanes free up), keeping the others in order; returns how many went.
fn drop_unservable(waiting: &mut VecDeque<Queued>, now: Instant) -> usize {
    // Runs before every step: nothing is moved or allocated unless a job goes.
    let mut dropped = 0;
    let mut i = 0;
    while i < waiting.len() {
        let job = &waiting[i];
        let (left, expired) = (job.chunks.is_closed(), now > job.deadline);
        if !left && !expired {
            i += 1;
            continue;
        }
        let job = waiting.remove(i).expect("index within the queue");
        if !left {
            let _ = job.done.send(Outcome::ExpiredWaiting);
        }
        dropped += 1;
    }
    dropped
}

#[cfg(test)]
mod tests {
    use drama_engine::sampling::SamplingParams;
    use drama_engine::synth::GuidanceMode;

    use super::*;

    /// A waiting job with its chunk and outcome receivers.
    struct Waiting {
        job: Queued,
        chunks: mpsc::UnboundedReceiver<Chunk>,
        done: oneshot::Receiver<Outcome>,
    }

    fn queued(seed: u64, deadline: Instant) -> Waiting {
        let (chunks, chunk_receiver) = mpsc::unbounded_channel();
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
        let (done, done_receiver) = oneshot::channel();
        let job = Queued {
            request,
            later: None,
            chunks,
            done,
            deadline,
        };
        Waiting {
            job,
            chunks: chunk_receiver,
            done: done_receiver,
        }
    }

    fn seeds(waiting: &VecDeque<Queued>) -> Vec<u64> {
        waiting.iter().map(|j| j.request.sampling.seed).collect()
    }

    /// Waiting jobs whose client went away (their chunk receiver dropped with the response)
    /// or whose time limit passed leave the queue, the expired ones answered as such; the
    /// others stay, in their order.
    #[test]
    fn waiting_jobs_whose_client_left_or_time_ran_out_are_dropped_in_order() {
        let start = Instant::now();
        let second = std::time::Duration::from_secs(1);
        // Deadlines 1..=8 s after start, in a shuffled order.
        let deadlines = [3u64, 7, 1, 8, 5, 2, 6, 4];
        let all: Vec<u64> = (0..8).map(|i| 1000 + 7 * i).collect();
        let mut receivers = Vec::new();
        let mut waiting = VecDeque::new();
        for (&seed, &at) in all.iter().zip(&deadlines) {
            let Waiting { job, chunks, done } = queued(seed, start + second * at as u32);
            waiting.push_back(job);
            receivers.push((chunks, done));
        }
        assert_eq!(drop_unservable(&mut waiting, start), 0);
        assert_eq!(seeds(&waiting), all);
        // Clients 1 and 4 leave; at start + 3.5 s the jobs due at 1, 2 and 3 s have expired.
        for i in [1, 4] {
            receivers[i].0.close();
        }
        let now = start + second * 7 / 2;
        assert_eq!(drop_unservable(&mut waiting, now), 5);
        let expected: Vec<u64> = [3usize, 6, 7].iter().map(|&i| all[i]).collect();
        assert_eq!(seeds(&waiting), expected);
        for (i, (_, done)) in receivers.iter_mut().enumerate() {
            let answer = done.try_recv();
            match (deadlines[i] <= 3, [1, 4].contains(&i)) {
                (true, _) => assert!(matches!(answer, Ok(Outcome::ExpiredWaiting)), "job {i}: {answer:?}"),
                (false, true) => assert!(answer.is_err(), "job {i} left: {answer:?}"),
                (false, false) => assert!(
                    matches!(answer, Err(oneshot::error::TryRecvError::Empty)),
                    "job {i} waits: {answer:?}"
                ),
            }
        }
        assert_eq!(drop_unservable(&mut waiting, now), 0);
    }
}
