//! Continuous batching: jobs that share steps (joining while others run, guided and not,
//! paired and separate) each get exactly the samples they get alone.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use drama_engine::batch::Batcher;
use drama_engine::sampling::SamplingParams;
use drama_engine::session::Engine;
use drama_engine::synth::{GuidanceMode, Stop, SynthesisRequest, synthesize};
use rand_core::Rng;

fn request(text: Vec<u32>, gamma: f32, guidance: GuidanceMode, seed: u64) -> SynthesisRequest {
    SynthesisRequest {
        segments: vec![text],
        prefix: None,
        gamma,
        guidance,
        sampling: SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed,
        },
        max_audio_tokens: 20,
    }
}

#[test]
fn batched_jobs_equal_solo_runs() {
    let mut rng = rng("batch");
    let fixture = Fixture::preset("tiny", rng.next_u64());
    let checkpoint = fixture.open();
    let engine = Engine::load(shared_gpu(), checkpoint).unwrap();
    let requests = [
        request(vec![5, 17, 42, 99], 1.5, GuidanceMode::Paired, rng.next_u64()),
        request(vec![7, 8], 1.0, GuidanceMode::Paired, rng.next_u64()),
        request(vec![200, 3, 3, 3, 1, 250], 2.0, GuidanceMode::Separate, rng.next_u64()),
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
    // A job may sample audio_eos first and say nothing; most must say something.
    assert!(
        solo.iter().filter(|p| !p.is_empty()).count() >= 2,
        "the comparison needs audio"
    );

    let mut batcher = Batcher::new(&engine, 5, 64).unwrap();
    let outputs: Vec<Arc<Mutex<Vec<f32>>>> = (0..3).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
    let sink = |i: usize| {
        let out = outputs[i].clone();
        Box::new(move |pcm: &[f32]| {
            out.lock().unwrap().extend_from_slice(pcm);
            true
        }) as drama_engine::batch::Sink
    };
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
    assert!(finished.iter().all(|(_, stats)| stats.stop == Stop::Finished));
    assert_eq!(batcher.free_lanes(), 5, "every lane comes back");
    for (i, out) in outputs.iter().enumerate() {
        let got = out.lock().unwrap();
        assert_eq!(got.len(), solo[i].len(), "job {i}: length");
        assert!(
            got.iter().zip(&solo[i]).all(|(a, b)| a.to_bits() == b.to_bits()),
            "job {i}: batched differs from solo"
        );
    }
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
    assert_eq!(ended[0].1.stop, Stop::Cancelled);
    assert_eq!(batcher.free_lanes(), 2);
    let out = Arc::new(Mutex::new(Vec::new()));
    let o = out.clone();
    batcher
        .admit(
            r,
            Box::new(move |c| {
                o.lock().unwrap().extend_from_slice(c);
                true
            }),
        )
        .unwrap();
    while batcher.active() > 0 {
        batcher.step().unwrap();
    }
    assert_eq!(*out.lock().unwrap(), fresh);
    let too_long = request(vec![1; 60], 1.0, GuidanceMode::Paired, 1);
    let err = batcher.admit(too_long, Box::new(|_| true)).unwrap_err().to_string();
    assert!(err.contains("positions"), "{err}");
}
