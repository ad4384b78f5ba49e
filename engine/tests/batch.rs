//! Continuous batching: jobs that share steps (joining while others run, guided and not,
//! paired and separate) each get exactly the samples they get alone.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use drama_checkpoint::names;
use drama_engine::batch::synthesize;
use drama_engine::batch::{Batcher, CODEC_CHUNK_PARTS, parts_for};
use drama_engine::codec::{CodecDecoder, CodecWeights};
use drama_engine::gpu::{Gpu, GpuOptions};
use drama_engine::sampling::{Logits, Sampler, SamplingParams};
use drama_engine::session::{Engine, Row, RowSource, Session};
use drama_engine::synth::{CODEC_CHUNK, GuidanceMode, Stop, SynthesisRequest};
use rand_core::Rng;
use std::time::Duration;

fn request(text: Vec<u32>, gamma: f32, guidance: GuidanceMode, seed: u64) -> SynthesisRequest {
    SynthesisRequest {
        segments: vec![text],
        prefix: None,
        gamma,
        guidance,
        sampling: SamplingParams::unfiltered(seed),
        max_audio_tokens: 20,
    }
}

/// The tiny preset with its codec played at 1 sample per second: every code lasts seconds, so
/// a job's audio is always far ahead of playback and the batcher submits every codec chunk
/// after the first in parts (see `parts_for`). Nothing else reads the rate.
fn slow_playback_fixture(seed: u64) -> Fixture {
    let mut preset = drama_fixtures::Preset::by_name("tiny").expect("tiny preset");
    preset.config.codec.sample_rate = 1;
    Fixture::generated(&preset, seed)
}

/// Tokens enough for a job to have a codec chunk in parts: its first chunk runs whole and is
/// handed out before its third is submitted.
const TOKENS_FOR_PARTS: usize = 2 * CODEC_CHUNK + 1;

/// The guided request `make` builds from the first seed drawn from `rng` whose tokens (by a
/// plain loop) number at least [`TOKENS_FOR_PARTS`], with those tokens: a random seed may
/// sample audio_eos early, and a short job has no chunk to give in parts.
fn long_enough(
    engine: &Engine,
    rng: &mut impl Rng,
    make: impl Fn(u64) -> SynthesisRequest,
) -> (SynthesisRequest, Vec<u32>) {
    for _ in 0..50 {
        let request = make(rng.next_u64());
        let tokens = tokens_by_plain_loop(engine, &request);
        if tokens.len() >= TOKENS_FOR_PARTS {
            return (request, tokens);
        }
    }
    panic!("50 seeds in a row sampled audio_eos within {TOKENS_FOR_PARTS} tokens");
}

/// A chunk goes in parts only with audio ahead of playback for twice the steps its parts
/// take at the last step's pace; with nothing ahead (a job's first chunk) it runs whole.
#[test]
fn codec_chunks_go_in_parts_only_with_audio_far_enough_ahead() {
    let step = Duration::from_millis(3);
    let needed = step * (2 * (CODEC_CHUNK_PARTS as u32 + 1));
    assert_eq!(parts_for(Duration::ZERO, Duration::ZERO), 1);
    assert_eq!(parts_for(Duration::ZERO, step), 1);
    assert_eq!(parts_for(needed - Duration::from_nanos(1), step), 1);
    assert_eq!(parts_for(needed, step), CODEC_CHUNK_PARTS);
    assert_eq!(parts_for(Duration::from_nanos(1), Duration::ZERO), CODEC_CHUNK_PARTS);
    const { assert!(CODEC_CHUNK_PARTS > 1) };
}

/// Jobs sharing steps get their solo runs' samples, bit for bit, also when a step's rows
/// run as several forwards. Their codec chunks after the first go in parts (a slow-playback
/// codec), so the parts of several jobs, and with separate guidance an uncond forward, run
/// between each other's.
#[test]
fn batched_jobs_equal_solo_runs() {
    let mut rng = rng("batch");
    let fixture = slow_playback_fixture(rng.next_u64());
    let checkpoint = fixture.open();
    let engine = Engine::load(shared_gpu(), checkpoint).unwrap();
    let requests = [
        // Long enough for its chunks after the first to go in parts.
        long_enough(&engine, &mut rng, |seed| {
            request(vec![5, 17, 42, 99], 1.5, GuidanceMode::Paired, seed)
        })
        .0,
        request(vec![7, 8], 1.0, GuidanceMode::Paired, rng.next_u64()),
        // Long enough too, so that separate guidance's uncond forwards run between the
        // others' codec parts whatever the seeds sample.
        long_enough(&engine, &mut rng, |seed| {
            request(vec![200, 3, 3, 3, 1, 250], 2.0, GuidanceMode::Separate, seed)
        })
        .0,
    ];
    let solo: Vec<Vec<f32>> = requests
        .iter()
        .map(|r| {
            let mut pcm = Vec::new();
            synthesize(&engine, r, &mut |chunk| {
                pcm.extend_from_slice(chunk);
                true
            })
            .unwrap();
            pcm
        })
        .collect();
    // The short job may sample audio_eos first and say nothing; the long ones speak.
    assert!(!solo[0].is_empty() && !solo[2].is_empty(), "the comparison needs audio");

    // As one forward a step, and with at most three rows a forward: prompts split across
    // forwards (some mid-lane), and the uncond rows of separate guidance in several.
    for cap in [None, Some(3)] {
        let mut batcher = Batcher::new(&engine, 5, 64).unwrap();
        assert!(batcher.max_forward_rows() >= 64, "the device takes a whole prompt");
        if let Some(rows) = cap {
            batcher.set_max_forward_rows(rows);
        }
        let outputs: Vec<Arc<Mutex<Vec<f32>>>> = (0..3).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
        let sink = |i: usize| collecting_sink(&outputs[i]);
        batcher.admit(requests[0].clone(), sink(0)).unwrap();
        batcher.admit(requests[1].clone(), sink(1)).unwrap();
        // The third joins after a few steps, while the others are mid-generation.
        let mut finished = Vec::new();
        for _ in 0..3 {
            finished.extend(batcher.step().unwrap());
        }
        batcher.admit(requests[2].clone(), sink(2)).unwrap();
        while batcher.active() > 0 {
            finished.extend(batcher.step().unwrap());
        }
        assert_eq!(finished.len(), 3);
        let finished: Vec<_> = finished.into_iter().map(|(_, ended)| ended.unwrap()).collect();
        assert!(finished.iter().all(|stats| stats.stop == Stop::Finished));
        assert!(
            finished.iter().any(|stats| stats.chunks_in_parts > 0),
            "no chunk went in parts"
        );
        assert_eq!(batcher.free_lanes(), 5, "every lane comes back");
        for (i, out) in outputs.iter().enumerate() {
            let got = out.lock().unwrap();
            assert_eq!(got.len(), solo[i].len(), "job {i}: length");
            assert!(
                got.iter().zip(&solo[i]).all(|(a, b)| a.to_bits() == b.to_bits()),
                "job {i}: batched differs from solo (forwards of at most {cap:?} rows)"
            );
        }
    }
}

/// Under a small storage-binding limit a step of more rows than fit is refused (naming the
/// limit) while the largest that fits compiles, and a synthesis whose prompt does not fit
/// in one step runs it as several forwards: the same samples as on a device without the
/// limit, bit for bit.
#[test]
fn a_step_larger_than_the_device_allows_runs_as_several_forwards() {
    let mut rng = rng("batch forward limit");
    let fixture = Fixture::preset("tiny", rng.next_u64());
    let limited = Gpu::new(&GpuOptions {
        max_storage_binding: Some(16384),
        ..options()
    })
    .unwrap();
    let limited = Engine::load(Arc::new(limited), fixture.open()).unwrap();
    let plain = Engine::load(shared_gpu(), fixture.open()).unwrap();
    for (lanes, names) in [
        (usize::MAX, "more than the 4096 a session takes"),
        (drama_engine::session::MAX_LANES, "storage-binding limit of 16384 bytes"),
    ] {
        let err = Session::new(&limited, lanes, 32).err().unwrap().to_string();
        assert!(err.contains(names), "{err}");
    }
    let mut session = Session::new(&limited, 2, 32).unwrap();
    let most = session.max_step_rows().unwrap();
    let p = limited.checkpoint.config.speech.voice_prefix_len;
    let text: Vec<u32> = (0..12).map(|_| rng.next_u32() % 264).collect();
    // A guided request's first forward: both lanes' prefix, text and audio_bos.
    let prompt_rows = 2 * (p + text.len() + 1);
    assert!(
        (1..prompt_rows).contains(&most),
        "{most} rows fit, the prompt has {prompt_rows}"
    );
    session.dispatch_count(most).unwrap();
    let err = session.dispatch_count(most + 1).unwrap_err().to_string();
    assert!(err.contains("storage-binding limit"), "{err}");

    let request = request(text, 1.5, GuidanceMode::Paired, rng.next_u64());
    let pcm = |engine: &Engine| {
        let mut pcm = Vec::new();
        let stats = synthesize(engine, &request, &mut |chunk| {
            pcm.extend_from_slice(chunk);
            true
        })
        .unwrap();
        (pcm, stats.tokens)
    };
    let (want, want_tokens) = pcm(&plain);
    let (got, got_tokens) = pcm(&limited);
    assert_eq!(got_tokens, want_tokens);
    assert_eq!(got.len(), want.len());
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn a_cancelled_job_frees_its_lanes_and_the_next_matches_a_fresh_run() {
    let fixture = Fixture::preset("tiny", 5);
    let checkpoint = fixture.open();
    let engine = Engine::load(shared_gpu(), checkpoint).unwrap();
    let mut r = request(vec![1, 2, 3], 1.5, GuidanceMode::Paired, 9);
    r.sampling.temperature = 0.7;
    let mut fresh = Vec::new();
    synthesize(&engine, &r, &mut |c| {
        fresh.extend_from_slice(c);
        true
    })
    .unwrap();
    let mut batcher = Batcher::new(&engine, 2, 64).unwrap();
    let id = batcher.admit(r.clone(), Box::new(|_| false)).unwrap();
    let mut ended = Vec::new();
    while batcher.active() > 0 {
        ended.extend(batcher.step().unwrap());
    }
    assert_eq!(ended[0].0, id);
    assert_eq!(ended[0].1.as_ref().unwrap().stop, Stop::Cancelled);
    assert_eq!(batcher.free_lanes(), 2);
    assert_eq!(run_alone(&mut batcher, r), fresh);
    let too_long = request(vec![1; 60], 1.0, GuidanceMode::Paired, 1);
    let err = batcher.admit(too_long, Box::new(|_| true)).unwrap_err().to_string();
    assert!(err.contains("positions"), "{err}");
    // A guided job needs two lanes: a one-lane batcher refuses it instead of queueing it
    // for lanes it will never have.
    let one_lane = Batcher::new(&engine, 1, 64).unwrap();
    let guided = request(vec![1, 2], 1.5, GuidanceMode::Paired, 2);
    let err = one_lane.check(&guided).unwrap_err().to_string();
    assert!(err.contains("gamma 1.5 guides with 2 lanes"), "{err}");
    one_lane
        .check(&request(vec![1, 2], 1.0, GuidanceMode::Paired, 2))
        .unwrap();
}

/// A sink that appends every chunk to `out`.
fn collecting_sink(out: &Arc<Mutex<Vec<f32>>>) -> drama_engine::batch::Sink {
    let out = out.clone();
    Box::new(move |pcm: &[f32]| {
        out.lock().unwrap().extend_from_slice(pcm);
        true
    })
}

/// Runs `request` as the batcher's only job until it ends; returns its PCM.
fn run_alone(batcher: &mut Batcher<'_>, request: SynthesisRequest) -> Vec<f32> {
    let out = Arc::new(Mutex::new(Vec::new()));
    batcher.admit(request, collecting_sink(&out)).unwrap();
    while batcher.active() > 0 {
        batcher.step().unwrap();
    }
    out.lock().unwrap().clone()
}

/// The server's warm-up job leaves nothing behind: every lane is free after it, and the
/// next job's PCM equals a fresh run's bit for bit. It is refused while a job runs, and
/// skipped (not failed) where the lanes are too short for it.
#[test]
fn a_warmed_up_batcher_gives_a_fresh_runs_bits() {
    let mut rng = rng("warm-up");
    let fixture = Fixture::preset("tiny", rng.next_u64());
    let engine = Engine::load(shared_gpu(), fixture.open()).unwrap();
    // A request that says something (a seed may sample audio_eos first).
    let (r, fresh) = (0..10)
        .map(|_| {
            let r = request(vec![9, 4, 77], 1.5, GuidanceMode::Paired, rng.next_u64());
            let mut pcm = Vec::new();
            synthesize(&engine, &r, &mut |c| {
                pcm.extend_from_slice(c);
                true
            })
            .unwrap();
            (r, pcm)
        })
        .find(|(_, pcm)| !pcm.is_empty())
        .expect("one of ten seeds says something");
    let mut batcher = Batcher::new(&engine, 2, 64).unwrap();
    let warm = batcher.warm_up(GuidanceMode::Paired, 1.5).unwrap();
    assert!(
        warm.is_some_and(|stats| stats.stop == Stop::Finished),
        "the warm-up job ran"
    );
    assert_eq!((batcher.free_lanes(), batcher.active()), (2, 0));
    let got = run_alone(&mut batcher, r);
    assert_eq!(got.len(), fresh.len());
    assert!(
        got.iter().zip(&fresh).all(|(a, b)| a.to_bits() == b.to_bits()),
        "warmed-up run differs"
    );
    let p = engine.checkpoint.config.speech.voice_prefix_len;
    let mut short = Batcher::new(&engine, 2, p + 2).unwrap();
    assert!(short.warm_up(GuidanceMode::Paired, 1.5).unwrap().is_none());
    let mut busy = Batcher::new(&engine, 4, 64).unwrap();
    busy.admit(request(vec![1], 1.0, GuidanceMode::Paired, 3), Box::new(|_| true))
        .unwrap();
    let err = busy.warm_up(GuidanceMode::Paired, 1.5).unwrap_err().to_string();
    assert!(err.contains("without jobs"), "{err}");
}

/// What a plain loop generates for a request: its codes, and how many of its segments
/// before the last ended at audio_eos.
struct PlainRun {
    tokens: Vec<u32>,
    eos_ends_before_last: usize,
}

/// The tokens a request generates, by a plain loop over a session (no batcher): each
/// segment's prompt as one step, then one token per step, sampled on the host as the
/// contract says (guidance mixed when the request is guided), until audio_eos or the
/// segment's cap.
fn tokens_by_plain_loop(engine: &Engine, request: &SynthesisRequest) -> Vec<u32> {
    plain_loop(engine, request).tokens
}

fn plain_loop(engine: &Engine, request: &SynthesisRequest) -> PlainRun {
    let c = &engine.checkpoint.config;
    let p = c.speech.voice_prefix_len;
    let vocab = c.speech.audio_vocab_size;
    let lanes: &[usize] = if request.gamma == 1.0 { &[0] } else { &[0, 1] };
    let mut session = Session::new(engine, 2, 64).unwrap();
    session
        .set_prefix(0, &engine.checkpoint.float_tensor(names::DEFAULT_PREFIX))
        .unwrap();
    session
        .set_prefix(1, &engine.checkpoint.float_tensor(names::NULL_PREFIX))
        .unwrap();
    let mut sampler = Sampler::new(request.sampling).unwrap();
    let mut run = PlainRun {
        tokens: Vec::new(),
        eos_ends_before_last: 0,
    };
    for (s, segment) in request.segments.iter().enumerate() {
        let prompt: Vec<RowSource> = (0..p)
            .map(RowSource::Prefix)
            .chain(segment.iter().map(|&t| RowSource::Text(t)))
            .chain(std::iter::once(RowSource::Audio(c.speech.audio_bos() as u32)))
            .collect();
        let mut rows: Vec<Row> = lanes
            .iter()
            .flat_map(|&lane| {
                prompt
                    .iter()
                    .enumerate()
                    .map(move |(pos, &source)| Row { source, lane, pos })
            })
            .collect();
        for position in prompt.len()..prompt.len() + request.max_audio_tokens {
            let logits = session.step(&rows, false).unwrap().logits;
            let per_lane = rows.len() / lanes.len();
            let last = |lane: usize| &logits[((lane + 1) * per_lane - 1) * vocab..(lane + 1) * per_lane * vocab];
            let logits = match lanes.len() {
                1 => Logits::Plain(last(0)),
                _ => Logits::Guided {
                    cond: last(0),
                    uncond: last(1),
                    gamma: request.gamma,
                },
            };
            let token = sampler.sample(logits, c.speech.audio_bos()).unwrap();
            if token as usize == c.speech.audio_eos() {
                run.eos_ends_before_last += usize::from(s + 1 < request.segments.len());
                break;
            }
            run.tokens.push(token);
            rows = lanes
                .iter()
                .map(|&lane| Row {
                    source: RowSource::Audio(token),
                    lane,
                    pos: position,
                })
                .collect();
        }
    }
    run
}

/// Jobs whose segments end at audio_eos, read a step after the batcher fed them the next
/// row: the token of that row is dropped, and the next segment starts from its prompt with
/// the draw after the EOS. Three jobs (guided and not) in one batcher, each with a segment
/// before its last that ends at audio_eos, give the codec's decode of a plain loop's
/// tokens, bit for bit.
#[test]
fn segments_ending_at_audio_eos_drop_the_row_fed_after() {
    let mut rng = rng("batch eos");
    let fixture = Fixture::preset("tiny", rng.next_u64());
    let engine = Engine::load(shared_gpu(), fixture.open()).unwrap();
    let mut jobs = Vec::new();
    for attempt in 0..400 {
        let gamma = [1.5, 1.0][jobs.len() % 2];
        let mut r = request(vec![5, 17, 42], gamma, GuidanceMode::Paired, rng.next_u64());
        r.segments.extend([vec![99, 3, 250, 7], vec![8, 8]]);
        r.max_audio_tokens = 13;
        let run = plain_loop(&engine, &r);
        if run.eos_ends_before_last > 0 {
            jobs.push((r, run.tokens));
            if jobs.len() == 3 {
                break;
            }
        }
        assert!(attempt < 399, "no seed ended a segment at audio_eos");
    }
    let mut batcher = Batcher::new(&engine, 5, 64).unwrap();
    let outputs: Vec<_> = jobs
        .iter()
        .map(|(r, _)| {
            let out = Arc::new(Mutex::new(Vec::new()));
            let id = batcher.admit(r.clone(), collecting_sink(&out)).unwrap();
            (id, out)
        })
        .collect();
    let mut ended = Vec::new();
    while batcher.active() > 0 {
        ended.extend(batcher.step().unwrap());
    }
    for ((id, out), (_, tokens)) in outputs.iter().zip(&jobs) {
        let stats = ended.iter().find(|(e, _)| e == id).unwrap().1.as_ref().unwrap();
        assert_eq!(stats.tokens, tokens.len(), "job {id}: tokens");
        let mut decoder = CodecDecoder::new(CodecWeights::upload(shared_gpu(), &engine.checkpoint).unwrap());
        let want = decoder.decode(tokens).unwrap();
        let got = out.lock().unwrap();
        assert_eq!(got.len(), want.len(), "job {id}: samples");
        assert!(
            got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
            "job {id}: the batcher's audio differs from the plain loop's"
        );
    }
}

/// A guided request of two segments, each capped at a token count that is not a multiple
/// of the codec chunk: the batcher's PCM (chunks queued behind the forwards, whole and in
/// parts with a slow-playback codec, flushed at the end, the codec stream running on across
/// segments) equals the codec's decode of the
/// tokens a plain loop generates, bit for bit, and their number matches the stats (as does
/// the division of the forwards' host time).
#[test]
fn batcher_audio_equals_the_codec_of_a_plain_loops_tokens() {
    let mut rng = rng("batch plain loop");
    let fixture = slow_playback_fixture(rng.next_u64());
    let engine = Engine::load(shared_gpu(), fixture.open()).unwrap();
    let (request, tokens) = long_enough(&engine, &mut rng, |seed| {
        let mut request = request(vec![5, 17, 42], 1.5, GuidanceMode::Paired, seed);
        request.segments.push(vec![99, 3, 250, 7]);
        request.max_audio_tokens = 13;
        request
    });
    assert!(
        tokens.len() > 8,
        "the comparison needs more than one codec chunk of audio"
    );
    let mut decoder = CodecDecoder::new(CodecWeights::upload(shared_gpu(), &engine.checkpoint).unwrap());
    let want = decoder.decode(&tokens).unwrap();
    let mut got = Vec::new();
    let stats = synthesize(&engine, &request, &mut |chunk| {
        got.extend_from_slice(chunk);
        true
    })
    .unwrap();
    assert_eq!(stats.tokens, tokens.len(), "tokens");
    // The first chunk runs whole; at least one later chunk (the first segment's last codes)
    // goes in parts.
    assert!(stats.chunks_in_parts >= 1, "no chunk went in parts");
    assert_eq!(stats.samples, got.len(), "samples counted");
    // The forwards' host time, divided: each part measured, together within the forwards.
    let (forward, split) = (stats.time_split.forward, stats.time_split.forward_split);
    assert!(
        [split.submit, split.record, split.wait].iter().all(|d| !d.is_zero()),
        "{split:?}"
    );
    assert!(
        split.submit + split.record + split.wait <= forward,
        "{split:?} of {forward:?}"
    );
    assert_eq!(got.len(), want.len(), "samples");
    assert!(
        got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
        "the batcher's audio differs from the codec of the plain loop's tokens"
    );
}

/// Steps of one shape share a readback buffer: reading a step's logits after a later step
/// of the same shape was submitted is refused by name, and the later one reads fine.
#[test]
fn stale_logits_are_refused() {
    let mut rng = rng("batch stale logits");
    let fixture = Fixture::preset("tiny", rng.next_u64());
    let engine = Engine::load(shared_gpu(), fixture.open()).unwrap();
    let mut session = Session::new(&engine, 1, 8).unwrap();
    let row = |pos| Row {
        source: RowSource::Text(3),
        lane: 0,
        pos,
    };
    let first = session.submit(&[row(0)]).unwrap();
    let second = session.submit(&[row(1)]).unwrap();
    let err = session.logits(first).unwrap_err().to_string();
    assert!(err.contains("later step of 1 rows"), "{err}");
    let logits = session.logits(second).unwrap();
    assert!(logits.iter().all(|v| v.is_finite()));
}

/// A session keeps its compiled steps within its byte budget, least recently used dropped
/// first: with no budget only the step in use stays, except a submitted step whose logits
/// are unread; a shape compiled again gives the bits it gave before (each r-row step's
/// logits are the first r rows of the 10-row step's, every step writing the same keys and
/// values); with room for all but one, the one dropped is the least recently used.
#[test]
fn compiled_steps_stay_within_their_budget() {
    let mut rng = rng("batch step cache");
    let fixture = Fixture::preset("tiny", rng.next_u64());
    let engine = Engine::load(shared_gpu(), fixture.open()).unwrap();
    let v = engine.checkpoint.config.speech.audio_vocab_size;
    let mut session = Session::new(&engine, 1, 16).unwrap();
    let rows: Vec<Row> = (0..10)
        .map(|pos| Row {
            source: RowSource::Text(rng.next_u32() % 264),
            lane: 0,
            pos,
        })
        .collect();
    let whole = session.step(&rows, false).unwrap().logits;
    let prefix_of_whole = |r: usize| bits(&whole[..r * v]);

    session.set_step_cache_budget(0);
    assert_eq!(session.step_cache_usage().steps, 1);
    for r in (1..=10).rev().chain(1..=3) {
        let logits = session.step(&rows[..r], false).unwrap().logits;
        assert_eq!(bits(&logits), prefix_of_whole(r), "{r} rows");
        assert_eq!(session.step_cache_usage().steps, 1, "after {r} rows");
    }

    let one = session.submit(&rows[..1]).unwrap();
    let two = session.submit(&rows[..2]).unwrap();
    assert_eq!(session.step_cache_usage().steps, 2, "an unread step stays compiled");
    assert_eq!(bits(&session.logits(one).unwrap()), prefix_of_whole(1));
    assert_eq!(bits(&session.logits(two).unwrap()), prefix_of_whole(2));
    session.step(&rows[..3], false).unwrap();
    assert_eq!(session.step_cache_usage().steps, 1, "read, they go");

    session.set_step_cache_budget(u64::MAX);
    // Only the 3-row step is compiled.
    let mut sizes = vec![0; 11];
    sizes[3] = session.step_cache_usage().bytes;
    for r in (1..=10).filter(|&r| r != 3) {
        let before = session.step_cache_usage().bytes;
        session.step(&rows[..r], false).unwrap();
        sizes[r] = session.step_cache_usage().bytes - before;
    }
    session.step(&rows[..3], false).unwrap();
    let total = session.step_cache_usage().bytes;
    assert_eq!(session.step_cache_usage().steps, 10);
    assert_eq!(total, sizes.iter().sum::<u64>());
    assert!(sizes.windows(2).skip(1).all(|w| w[0] < w[1]), "{sizes:?}");
    // Used in the order 1, 2, 4-10, 3, then 1 again: 2 is the least recently used.
    session.step(&rows[..1], false).unwrap();
    session.set_step_cache_budget(total - 1);
    let usage = session.step_cache_usage();
    assert_eq!((usage.steps, usage.bytes), (9, total - sizes[2]));
    for r in [2, 3] {
        let logits = session.step(&rows[..r], false).unwrap().logits;
        assert_eq!(bits(&logits), prefix_of_whole(r), "{r} rows compiled again");
    }
}

/// Waits that end by polling (as on GPUs; lavapipe blocks by default) give every job the
/// bits blocking waits give it: the logits and codec samples are read only once their work
/// has finished, whether the wait returned from blocking, from its timeout or from polling.
#[test]
fn polled_waits_give_blocking_waits_bits() {
    let mut rng = rng("polled waits");
    let fixture = slow_playback_fixture(rng.next_u64());
    let polling = Gpu::new(&GpuOptions {
        poll_waits: Some(true),
        ..options()
    })
    .unwrap();
    let engines = [
        Engine::load(shared_gpu(), fixture.open()).unwrap(),
        Engine::load(Arc::new(polling), fixture.open()).unwrap(),
    ];
    // The first says something whatever the seeds sample.
    let requests = [
        long_enough(&engines[0], &mut rng, |seed| {
            request(vec![5, 17, 42, 99], 1.5, GuidanceMode::Paired, seed)
        })
        .0,
        request(vec![200, 3, 1, 250], 2.0, GuidanceMode::Separate, rng.next_u64()),
    ];
    let mut samples = 0;
    for r in &requests {
        let [blocking, polled] = engines.each_ref().map(|engine| {
            let mut pcm = Vec::new();
            let stats = synthesize(engine, r, &mut |chunk| {
                pcm.extend_from_slice(chunk);
                true
            })
            .unwrap();
            (pcm, stats.tokens)
        });
        assert_eq!(polled.1, blocking.1, "tokens");
        assert_eq!(polled.0.len(), blocking.0.len(), "samples");
        assert!(
            polled
                .0
                .iter()
                .zip(&blocking.0)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "polled waits changed the audio"
        );
        samples += blocking.0.len();
    }
    assert!(samples > 0, "the comparison needs audio");
}

/// One job's failure ends that job alone: with three jobs in a batch, the middle one fails
/// at its third step (the test hook stands in for a sampler or codec error); the two others
/// finish with the bits they have alone, the failed one ends with its error, every lane comes
/// back, and a job admitted afterwards gets a fresh run's bits. A text id past the
/// vocabulary is refused at admission, naming its segment and token, and takes no lane.
#[test]
fn a_failing_job_ends_alone_and_the_others_keep_their_bits() {
    let mut rng = rng("job failure isolation");
    let fixture = Fixture::preset("tiny", rng.next_u64());
    let engine = Engine::load(shared_gpu(), fixture.open()).unwrap();
    let make = |seed| request(vec![5, 17, 42, 99], 1.5, GuidanceMode::Paired, seed);
    let (first, _) = long_enough(&engine, &mut rng, make);
    let (middle, _) = long_enough(&engine, &mut rng, make);
    let (last, _) = long_enough(&engine, &mut rng, |seed| {
        request(vec![7, 8], 1.0, GuidanceMode::Paired, seed)
    });
    let mut batcher = Batcher::new(&engine, 5, 64).unwrap();
    let solo = [
        run_alone(&mut batcher, first.clone()),
        run_alone(&mut batcher, last.clone()),
    ];
    assert!(solo.iter().all(|pcm| !pcm.is_empty()), "the comparison needs audio");

    let outputs: Vec<Arc<Mutex<Vec<f32>>>> = (0..3).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
    let sink = |i: usize| collecting_sink(&outputs[i]);
    let ids = [
        batcher.admit(first.clone(), sink(0)).unwrap(),
        batcher.admit(middle, sink(1)).unwrap(),
        batcher.admit(last.clone(), sink(2)).unwrap(),
    ];
    let mut ended = Vec::new();
    for _ in 0..2 {
        ended.extend(batcher.step().unwrap());
    }
    assert!(batcher.fail_at_next_step(ids[1]));
    while batcher.active() > 0 {
        ended.extend(batcher.step().unwrap());
    }
    assert_eq!(ended.len(), 3);
    for (id, outcome) in &ended {
        match outcome {
            Ok(stats) => assert!(*id != ids[1] && stats.stop == Stop::Finished, "job {id}: {stats:?}"),
            Err(e) => {
                assert_eq!(*id, ids[1], "job {id} failed: {e}");
                assert!(e.to_string().contains("a failure injected by a test"), "{e}");
            }
        }
    }
    assert_eq!(*outputs[0].lock().unwrap(), solo[0], "the first job's bits changed");
    assert_eq!(*outputs[2].lock().unwrap(), solo[1], "the last job's bits changed");
    assert_eq!(batcher.free_lanes(), 5, "every lane comes back");
    assert_eq!(
        run_alone(&mut batcher, first.clone()),
        solo[0],
        "a job after the failure differs"
    );
    // A text id past the vocabulary: refused before any lane is taken.
    let vocab = engine.checkpoint.config.text_vocab_size as u32;
    let mut bad = first;
    bad.segments = vec![vec![1, 2], vec![3, vocab, 4]];
    let refusal = batcher.admit(bad, Box::new(|_| true)).unwrap_err().to_string();
    assert!(
        refusal.contains(&format!(
            "segment 1, token 1: text id {vocab} is not below text_vocab_size {vocab}"
        )),
        "{refusal}"
    );
    assert_eq!(batcher.free_lanes(), 5);
}

/// Steps marked with timestamps (as `drama bench`'s token loop marks them) give the bits of
/// unmarked ones, and one span per step that fed the job, in order on the GPU's clock: each
/// opens no earlier than the one before closed, and its marks (opening, splitting, closing)
/// come in order. Draws with no step before them are refused unmarked; more steps than the
/// timeline holds go unmarked.
#[test]
fn marked_steps_keep_their_bits_and_give_one_ordered_span_each() {
    let mut rng = rng("marked steps");
    let fixture = Fixture::preset("tiny", rng.next_u64());
    let engine = Engine::load(shared_gpu(), fixture.open()).unwrap();
    assert!(engine.gpu.caps.timestamps, "the marks need timestamp queries");
    let same_bits =
        |a: &[f32], b: &[f32]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    let r = request(vec![5, 61, 200], 1.5, GuidanceMode::Paired, rng.next_u64());
    let fresh = run_alone(&mut Batcher::new(&engine, 2, 64).unwrap(), r.clone());

    let mut marked = Batcher::new(&engine, 2, 64).unwrap();
    marked.mark_steps(1000).unwrap();
    let out = Arc::new(Mutex::new(Vec::new()));
    marked.admit(r.clone(), collecting_sink(&out)).unwrap();
    let mut steps = 0;
    while marked.active() > 0 {
        marked.step().unwrap();
        steps += 1;
    }
    let got = out.lock().unwrap().clone();
    assert!(same_bits(&got, &fresh), "marked steps changed the samples");
    let spans = marked.marked_steps().unwrap();
    // Every step fed the job, but the last where the job reached its token cap (that step
    // only reads the last token).
    assert!(
        (steps - 1..=steps).contains(&spans.len()),
        "{} spans for {steps} steps",
        spans.len()
    );
    for (k, span) in spans.iter().enumerate() {
        assert!(
            span.start_ns <= span.split_ns && span.split_ns <= span.end_ns,
            "span {k}'s marks out of order: {span:?}"
        );
        if k > 0 {
            assert!(
                span.start_ns >= spans[k - 1].end_ns,
                "span {k} opens before span {} closed: {span:?}, {:?}",
                k - 1,
                spans[k - 1]
            );
        }
    }

    // Draws with no step staged for them are refused, and leave the timeline unmarked.
    let mut session = Session::new(&engine, 2, 64).unwrap();
    session.mark_draws(3).unwrap();
    let err = session.draw(&[], Vec::new()).unwrap_err().to_string();
    assert!(err.contains("draws need a step submitted for them first"), "{err}");
    assert!(session.marked_spans().unwrap().is_empty(), "a refused draw was marked");

    // A timeline one step short (the job feeds at least two steps: its prompt, then the row
    // of its first token, submitted before that token is read).
    let room = spans.len() - 1;
    let mut short = Batcher::new(&engine, 2, 64).unwrap();
    short.mark_steps(room as u32).unwrap();
    let again = run_alone(&mut short, r);
    assert!(same_bits(&again, &fresh), "a full timeline changed the samples");
    assert_eq!(
        short.marked_steps().unwrap().len(),
        room,
        "the timeline holds {room} steps"
    );
}

/// A job admitted with its first segment, whose later segments come while it runs (after
/// it has waited for them, or at once), gets the bits of its whole request admitted at
/// once, beside a job that shares its steps; and a job whose later segments fail to come,
/// fail the check or are refused ends alone with that error, its lanes free again.
#[test]
fn a_job_whose_later_segments_come_while_it_runs_gets_the_whole_requests_bits() {
    use drama_engine::error::EngineError;
    use std::sync::mpsc::channel;
    let mut rng = rng("later segments");
    let fixture = Fixture::preset("tiny", rng.next_u64());
    let engine = Engine::load(shared_gpu(), fixture.open()).unwrap();
    let whole = |seed| {
        let mut r = request(vec![5, 17, 42], 1.5, GuidanceMode::Paired, seed);
        r.segments.extend([vec![99, 3, 250, 7], vec![8, 8]]);
        r.max_audio_tokens = 13;
        r
    };
    let (waiting, _) = long_enough(&engine, &mut rng, whole);
    let (at_once, _) = long_enough(&engine, &mut rng, whole);
    let (beside, _) = long_enough(&engine, &mut rng, |seed| {
        request(vec![7, 8], 1.0, GuidanceMode::Paired, seed)
    });
    let mut batcher = Batcher::new(&engine, 5, 64).unwrap();
    let solo: Vec<Vec<f32>> = [&waiting, &at_once, &beside]
        .into_iter()
        .map(|r| run_alone(&mut batcher, r.clone()))
        .collect();
    let first_only = |r: &SynthesisRequest| SynthesisRequest {
        segments: r.segments[..1].to_vec(),
        ..r.clone()
    };
    let outputs: Vec<Arc<Mutex<Vec<f32>>>> = (0..3).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
    let (send_waiting, later_waiting) = channel();
    let (send_at_once, later_at_once) = channel();
    send_at_once.send(Ok(at_once.segments[1..].to_vec())).unwrap();
    batcher
        .admit_open(first_only(&waiting), later_waiting, collecting_sink(&outputs[0]))
        .unwrap();
    batcher
        .admit_open(first_only(&at_once), later_at_once, collecting_sink(&outputs[1]))
        .unwrap();
    batcher.admit(beside.clone(), collecting_sink(&outputs[2])).unwrap();
    let mut ended = Vec::new();
    // Past the first segment's prompt and its 13 tokens at most: the job waits.
    for _ in 0..30 {
        ended.extend(batcher.step().unwrap());
    }
    assert!(
        batcher.active() >= 1,
        "the waiting job ended without its later segments"
    );
    send_waiting.send(Ok(waiting.segments[1..].to_vec())).unwrap();
    while batcher.active() > 0 {
        ended.extend(batcher.step().unwrap());
    }
    assert!(
        ended
            .iter()
            .all(|(_, e)| e.as_ref().is_ok_and(|s| s.stop == Stop::Finished))
    );
    for (i, want) in solo.iter().enumerate() {
        let got = outputs[i].lock().unwrap();
        assert!(!want.is_empty(), "job {i}: the comparison needs audio");
        assert_eq!(got.len(), want.len(), "job {i}: samples");
        assert!(
            got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
            "job {i}: its bits differ from the whole request's"
        );
    }
    // Later segments that fail: an error, a closed channel, a text id past the vocabulary.
    let vocab = engine.checkpoint.config.text_vocab_size as u32;
    // What comes through the channel (nothing: it closes), and the error the job ends with.
    type Later = Option<Result<Vec<Vec<u32>>, EngineError>>;
    let failures: [(Later, String); 3] = [
        (
            Some(Err(EngineError::Input("the word \"x\" is too long".into()))),
            "the word \"x\" is too long".into(),
        ),
        (None, "never cut into segments".into()),
        (
            Some(Ok(vec![vec![1], vec![2, vocab]])),
            format!("segment 2, token 1: text id {vocab} is not below text_vocab_size {vocab}"),
        ),
    ];
    for (later, want) in failures {
        let (send, receive) = channel();
        if let Some(later) = later {
            send.send(later).unwrap();
        }
        drop(send);
        let id = batcher
            .admit_open(first_only(&waiting), receive, Box::new(|_| true))
            .unwrap();
        let mut ended = Vec::new();
        while batcher.active() > 0 {
            ended.extend(batcher.step().unwrap());
        }
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].0, id);
        let error = ended[0].1.as_ref().unwrap_err().to_string();
        assert!(error.contains(&want), "{error}");
        assert_eq!(batcher.free_lanes(), 5);
    }
}
