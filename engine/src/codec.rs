//! The codec decoder on the GPU (contract section 8): codes to PCM, streamed in chunks with
//! carried state. Each causal convolution keeps the input frames its next chunk needs in a
//! history buffer, so decoding in chunks gives the same samples as decoding the whole
//! utterance, bit for bit. The codebook lookup is a host gather of BF16 rows.
//!
//! A residual unit is `x + conv2(snake2(conv1(snake1(x))))`.

use std::collections::HashMap;
use std::sync::Arc;

use drama_kernels::{
    CODEC_CONV_FRAMES, CodecLaunch, CodecParams, ConvOutput, Kernel, conv_transpose_launch, conv1d_launch,
};

use crate::error::EngineError;
use crate::gpu::{Dispatch, Gpu, GpuError, Readback};
use drama_checkpoint::{Checkpoint, names};

/// A stream history: the frames the next chunk needs, in one of two buffers that take turns
/// (see [`Builder::with_history`]).
struct History {
    frames: usize,
    channels: usize,
    buffers: [wgpu::Buffer; 2],
}

/// The launches of one chunk length: one list for each of the two turns of the histories
/// (list `p` reads every history from its buffer `p` and writes the next into the other),
/// over the same activations.
struct ChunkProgram {
    input: wgpu::Buffer,
    output: wgpu::Buffer,
    readback: Readback,
    dispatches: [Vec<Dispatch>; 2],
}

impl ChunkProgram {
    /// Launches per chunk (either turn's).
    fn launches(&self) -> usize {
        self.dispatches[0].len()
    }
}

/// The codec's weights on the GPU, shared by every stream.
pub struct CodecWeights {
    gpu: Arc<Gpu>,
    tensors: HashMap<String, wgpu::Buffer>,
    codebook: Vec<f32>,
    codebook_dim: usize,
    codes: usize,
    config: drama_checkpoint::config::CodecConfig,
}

/// A chunk whose launches are submitted in parts (see [`CodecDecoder::submit_in_parts`]):
/// part i holds launches [i L / parts, (i + 1) L / parts) of the program's L.
#[derive(Clone, Copy)]
struct Spread {
    /// Its program, by code count.
    length: usize,
    /// Parts encoded so far.
    encoded: usize,
    /// Parts in all (at most L).
    parts: usize,
}

/// Where the last launches of the chunk in flight are.
enum Sent {
    /// Encoded and not yet submitted: in [`CodecDecoder::encoded`], or taken by a caller that
    /// has not reported their submission yet.
    Encoded,
    /// In this submission.
    Submitted(wgpu::SubmissionIndex),
}

/// One stream of codes to PCM: its own histories over shared weights.
pub struct CodecDecoder {
    weights: Arc<CodecWeights>,
    histories: Vec<History>,
    /// Which buffer of each history holds it now (the next chunk's launches of this turn).
    turn: usize,
    programs: HashMap<usize, ChunkProgram>,
    /// The chunk whose launches are partly encoded, if any.
    spread: Option<Spread>,
    /// The chunk whose last launches were encoded last and not yet read: its program (by
    /// code count) and where those launches are.
    in_flight: Option<(usize, Sent)>,
    /// Command buffers encoded and not yet submitted, in order (see
    /// [`CodecDecoder::take_encoded`]).
    encoded: Vec<wgpu::CommandBuffer>,
    /// Samples read back and not yet handed out by [`CodecDecoder::finish`].
    ready: Vec<f32>,
}

/// A causal convolution's shape: channels in and out, kernel size and dilation.
#[derive(Clone, Copy)]
struct Conv {
    cin: usize,
    cout: usize,
    kernel: usize,
    dilation: usize,
}

/// What a conv1d launch writes besides the convolution (`drama_kernels::ConvOutput`).
enum Written<'a> {
    /// snake(convolution) with the named alpha, rounded to BF16.
    Snake(&'a str),
    /// The residual plus the convolution, and into `snaked` its snake with the named alpha,
    /// rounded to BF16.
    ResidualAndSnake {
        residual: &'a wgpu::Buffer,
        alpha: &'a str,
        snaked: &'a wgpu::Buffer,
    },
    /// tanh(convolution): PCM.
    Tanh,
}

/// Builds the launches of one chunk, walking the decoder in a fixed order.
struct Builder<'a> {
    gpu: &'a Gpu,
    tensors: &'a HashMap<String, wgpu::Buffer>,
    histories: &'a [History],
    /// Which buffer of each history the launches read (they write the other).
    turn: usize,
    next_history: usize,
    /// A 4-byte buffer bound where a launch reads no history.
    no_history: wgpu::Buffer,
    /// The chunk's activations in the order the walk asked for them: made by the first walk,
    /// handed out again by the second (the other turn's), which asks in the same order.
    activations: Vec<wgpu::Buffer>,
    activations_used: usize,
    dispatches: Vec<Dispatch>,
}

impl Builder<'_> {
    fn launch(
        &mut self,
        kernel: Kernel,
        params: &impl bytemuck::Pod,
        resources: &[&wgpu::Buffer],
        count: usize,
    ) -> Result<(), EngineError> {
        let grid = self.gpu.elements_grid(count);
        self.launch_over(kernel, params, resources, grid)
    }

    /// A launch over a given grid (the convolutions': see [`conv1d_launch`]).
    fn launch_over(
        &mut self,
        kernel: Kernel,
        params: &impl bytemuck::Pod,
        resources: &[&wgpu::Buffer],
        grid: [u32; 3],
    ) -> Result<(), EngineError> {
        self.dispatches
            .push(self.gpu.dispatch(kernel, params, resources, grid)?);
        Ok(())
    }

    /// A chunk's activations of `channels` channels (f32), labelled `label`: a new buffer
    /// in the first walk, the same one again in the second.
    fn activation(&mut self, label: &str, frames: usize, channels: usize) -> wgpu::Buffer {
        let buffer = match self.activations.get(self.activations_used) {
            Some(made) => made.clone(),
            None => {
                let made = self.gpu.buffer(label, (frames * channels * 4) as u64);
                self.activations.push(made.clone());
                made
            }
        };
        self.activations_used += 1;
        buffer
    }

    fn tensor(&self, name: &str) -> &wgpu::Buffer {
        &self.tensors[name]
    }

    /// A convolution module's `weight` and `bias` buffers.
    fn weight_and_bias(&self, module: &str) -> (wgpu::Buffer, wgpu::Buffer) {
        (
            self.tensor(&format!("{module}.weight")).clone(),
            self.tensor(&format!("{module}.bias")).clone(),
        )
    }

    /// Reads and advances the next history: the convolution runs against its buffer of this
    /// turn, then a launch writes the last frames of [history | x] into the other buffer,
    /// which the next chunk reads. The two launches only read x and the history, and no other
    /// launch of the chunk touches the buffer written, so where the backend runs launches
    /// beside each other (Vulkan, DX12) no barrier comes before the shift and it runs beside
    /// the convolution.
    fn with_history(
        &mut self,
        x: &wgpu::Buffer,
        frames: usize,
        run: impl FnOnce(&mut Self, &wgpu::Buffer) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        let index = self.next_history;
        self.next_history += 1;
        let history = &self.histories[index];
        let current = history.buffers[self.turn].clone();
        let next = history.buffers[1 - self.turn].clone();
        run(self, &current)?;
        let count = history.frames * history.channels;
        let params = CodecParams {
            frames: frames as u32,
            in_ch: history.channels as u32,
            out_ch: history.channels as u32,
            kernel: 0,
            dilation: 0,
            history: history.frames as u32,
            flags: 0,
            count: count as u32,
            ..Default::default()
        };
        self.launch(Kernel::ShiftHistory, &params, &[x, &current, &next], count)
    }

    /// A conv1d of `x` and what it writes (see [`Written`]); returns its output buffer.
    fn conv1d(
        &mut self,
        x: &wgpu::Buffer,
        frames: usize,
        module: &str,
        conv: Conv,
        written: Written<'_>,
    ) -> Result<wgpu::Buffer, EngineError> {
        let Conv {
            cin,
            cout,
            kernel: k,
            dilation: d,
        } = conv;
        let y = self.activation(module, frames, cout);
        let (w, b) = self.weight_and_bias(module);
        let CodecLaunch { params, grid } = conv1d_launch(cin, cout, frames, k, d);
        // The epilogue's bindings after y: alpha (6), residual (7), the snake's output (8).
        let (kernel, extra) = match written {
            Written::Snake(alpha) => (ConvOutput::Snake, vec![self.tensor(alpha).clone()]),
            Written::ResidualAndSnake {
                residual,
                alpha,
                snaked,
            } => (
                ConvOutput::ResidualAndSnake,
                vec![self.tensor(alpha).clone(), residual.clone(), snaked.clone()],
            ),
            Written::Tanh => (ConvOutput::Tanh, Vec::new()),
        };
        let launch = |me: &mut Self, hist: &wgpu::Buffer| {
            let mut resources = vec![x, hist, &w, &b, &y];
            resources.extend(&extra);
            me.launch_over(Kernel::Conv1d(kernel), &params, &resources, grid)
        };
        // No history for kernel size 1 (`history_shapes` lists none either).
        if params.history == 0 {
            let none = self.no_history.clone();
            launch(self, &none)?;
        } else {
            self.with_history(x, frames, launch)?;
        }
        Ok(y)
    }

    /// The transposed convolution of `channels` (in, out) channels at `rate`, and the snake
    /// with the named alpha that reads it next (rounded to BF16), in one launch: (its
    /// output, the snake's).
    fn conv_transpose_snake(
        &mut self,
        x: &wgpu::Buffer,
        frames: usize,
        module: &str,
        (cin, cout): (usize, usize),
        rate: usize,
        alpha: &str,
    ) -> Result<(wgpu::Buffer, wgpu::Buffer), EngineError> {
        let y = self.activation(module, frames * rate, cout);
        let snaked = self.activation(alpha, frames * rate, cout);
        let (w, b) = self.weight_and_bias(module);
        let a = self.tensor(alpha).clone();
        let CodecLaunch { params, grid } = conv_transpose_launch(cin, cout, frames, rate);
        self.with_history(x, frames, |me, hist| {
            me.launch_over(
                Kernel::ConvTransposeSnake,
                &params,
                &[x, hist, &w, &b, &y, &a, &snaked],
                grid,
            )
        })?;
        Ok((y, snaked))
    }

    /// Ends the first turn's walk and starts the second's, over the same activations; returns
    /// the first turn's launches.
    fn start_second_turn(&mut self) -> Vec<Dispatch> {
        self.turn = 1;
        self.next_history = 0;
        self.activations_used = 0;
        std::mem::take(&mut self.dispatches)
    }

    /// The launches of the whole decoder over a chunk of `frames` codes whose codebook rows
    /// are in `input`, in decoding order; returns the output (PCM) and its samples.
    fn decoder(
        &mut self,
        c: &drama_checkpoint::config::CodecConfig,
        input: &wgpu::Buffer,
        frames: usize,
    ) -> Result<(wgpu::Buffer, usize), EngineError> {
        let k = c.kernel_size;
        // `s`: the snake the next convolution reads, each written by the launch of the
        // convolution before it.
        let mut s = self.conv1d(
            input,
            frames,
            names::CODEC_IN,
            Conv {
                cin: c.codebook_dim,
                cout: c.channels[0],
                kernel: k,
                dilation: 1,
            },
            Written::Snake(&names::fill(names::STAGE_SNAKE, &[("u", 0)])),
        )?;
        let mut t = frames;
        let stages = c.upsample_rates.len();
        let units = c.residual_dilations.len();
        for (u, &rate) in c.upsample_rates.iter().enumerate() {
            let (cin, cout) = (c.channels[u], c.channels[u + 1]);
            // The snake that reads the stage's output: the next stage's, or the output's.
            let after_stage = if u + 1 < stages {
                names::fill(names::STAGE_SNAKE, &[("u", u + 1)])
            } else {
                names::OUT_SNAKE.to_string()
            };
            // The snake before residual unit `r` of this stage, or after the stage.
            let before_unit = |r: usize| {
                if r < units {
                    names::fill(names::RES_SNAKE1, &[("u", u), ("r", r)])
                } else {
                    after_stage.clone()
                }
            };
            let stage_up = names::fill(names::STAGE_UP, &[("u", u)]);
            let (mut x, snaked) = self.conv_transpose_snake(&s, t, &stage_up, (cin, cout), rate, &before_unit(0))?;
            s = snaked;
            t *= rate;
            for (r, &d) in c.residual_dilations.iter().enumerate() {
                let at = |tpl: &str| names::fill(tpl, &[("u", u), ("r", r)]);
                let y = self.conv1d(
                    &s,
                    t,
                    &at(names::RES_CONV1),
                    Conv {
                        cin: cout,
                        cout,
                        kernel: k,
                        dilation: d,
                    },
                    Written::Snake(&at(names::RES_SNAKE2)),
                )?;
                let next = before_unit(r + 1);
                let snaked = self.activation(&next, t, cout);
                x = self.conv1d(
                    &y,
                    t,
                    &at(names::RES_CONV2),
                    Conv {
                        cin: cout,
                        cout,
                        kernel: 1,
                        dilation: 1,
                    },
                    Written::ResidualAndSnake {
                        residual: &x,
                        alpha: &next,
                        snaked: &snaked,
                    },
                )?;
                s = snaked;
            }
        }
        let last = *c.channels.last().expect("validated");
        let output = self.conv1d(
            &s,
            t,
            names::CODEC_OUT,
            Conv {
                cin: last,
                cout: 1,
                kernel: k,
                dilation: 1,
            },
            Written::Tanh,
        )?;
        Ok((output, t))
    }
}

/// The convolutions that carry history, in decoding order: (frames kept, channels). A
/// conv1d of kernel size 1 carries none (see [`Builder::conv1d`]); a transposed convolution
/// always keeps one frame.
fn history_shapes(c: &drama_checkpoint::config::CodecConfig) -> Vec<(usize, usize)> {
    let k = c.kernel_size;
    let mut shapes = Vec::new();
    let mut conv = |frames: usize, channels: usize| {
        if frames > 0 {
            shapes.push((frames, channels));
        }
    };
    conv(k - 1, c.codebook_dim);
    for u in 0..c.upsample_rates.len() {
        conv(1, c.channels[u]);
        for &d in &c.residual_dilations {
            conv((k - 1) * d, c.channels[u + 1]);
        }
    }
    conv(k - 1, *c.channels.last().expect("validated"));
    shapes
}

impl CodecWeights {
    /// Uploads the codec's weights (BF16, as stored).
    pub fn upload(gpu: Arc<Gpu>, checkpoint: &Checkpoint) -> Result<Arc<CodecWeights>, EngineError> {
        let mut tensors = HashMap::new();
        for (name, entry) in checkpoint.weights.entries() {
            if name.starts_with("codec.") && name != names::CODEBOOK {
                if entry.byte_len() as u64 > gpu.caps.max_storage_binding {
                    return Err(EngineError::Unsupported(format!(
                        "{name}: {} bytes exceed the device's storage-binding limit",
                        entry.byte_len()
                    )));
                }
                tensors.insert(name.clone(), gpu.buffer_with(name, checkpoint.weights.bytes(entry)));
            }
        }
        let config = checkpoint.config.codec.clone();
        Ok(Arc::new(CodecWeights {
            codebook: checkpoint.float_tensor(names::CODEBOOK),
            codebook_dim: config.codebook_dim,
            codes: checkpoint.config.speech.audio_codes,
            gpu,
            tensors,
            config,
        }))
    }
}

impl CodecDecoder {
    /// A stream over shared weights, its histories at zero.
    pub fn new(weights: Arc<CodecWeights>) -> CodecDecoder {
        let gpu = &weights.gpu;
        let histories = history_shapes(&weights.config)
            .into_iter()
            .map(|(frames, channels)| {
                let bytes = (frames * channels * 4) as u64;
                History {
                    frames,
                    channels,
                    buffers: [gpu.buffer("codec history", bytes), gpu.buffer("codec history", bytes)],
                }
            })
            .collect();
        CodecDecoder {
            weights,
            histories,
            turn: 0,
            programs: HashMap::new(),
            spread: None,
            in_flight: None,
            encoded: Vec::new(),
            ready: Vec::new(),
        }
    }

    /// Starts a new utterance: every history back to zeros, a chunk in flight (or partly
    /// submitted, or encoded) dropped.
    pub fn reset(&mut self) {
        self.spread = None;
        self.in_flight = None;
        self.encoded.clear();
        self.ready.clear();
        for h in &self.histories {
            let current = &h.buffers[self.turn];
            self.weights
                .gpu
                .queue
                .write_buffer(current, 0, &vec![0u8; current.size() as usize]);
        }
    }

    fn compile(&self, frames: usize) -> Result<ChunkProgram, EngineError> {
        let w = &self.weights;
        let input = w.gpu.buffer("codec input", (frames * w.config.codebook_dim * 4) as u64);
        let mut b = Builder {
            gpu: &w.gpu,
            tensors: &w.tensors,
            histories: &self.histories,
            turn: 0,
            next_history: 0,
            no_history: w.gpu.buffer("no history", 4),
            activations: Vec::new(),
            activations_used: 0,
            dispatches: Vec::new(),
        };
        let (output, samples) = b.decoder(&w.config, &input, frames)?;
        let first_turn = b.start_second_turn();
        b.decoder(&w.config, &input, frames)?;
        Ok(ChunkProgram {
            input,
            readback: Readback::new(&w.gpu, "pcm readback", (samples * 4) as u64),
            output,
            dispatches: [first_turn, b.dispatches],
        })
    }

    /// Decodes the next chunk of codes of the current utterance; returns its PCM samples
    /// (and those of a chunk submitted before and not yet finished).
    pub fn decode(&mut self, codes: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.submit(codes)?;
        self.finish()
    }

    /// Submits the decode of the next chunk of codes and returns without waiting; its
    /// samples come from the next [`CodecDecoder::finish`] (or `decode`). The GPU runs it in
    /// queue order, so work submitted later (the next model step) finds it done.
    pub fn submit(&mut self, codes: &[u32]) -> Result<(), EngineError> {
        self.check_codes(codes)?;
        for piece in codes.chunks(self.codes_per_program()) {
            self.encode_piece(piece)?;
            self.flush();
        }
        Ok(())
    }

    /// The most codes one program decodes: longer inputs run as several chunks (the same
    /// samples, bit for bit), since a program's convolutions put their frame tiles in one
    /// grid dimension (at most 65535).
    fn codes_per_program(&self) -> usize {
        (65535 * CODEC_CONV_FRAMES / self.weights.config.samples_per_code()).clamp(1, 64)
    }

    /// Like [`CodecDecoder::submit`] for one chunk, but only the first of `parts` parts of its
    /// launches is submitted now; [`CodecDecoder::submit_next_part`] submits the others,
    /// one call each (and [`CodecDecoder::finish`], or the next chunk, whatever is left).
    /// The samples are the same bit for bit. A caller that submits one part behind each model
    /// step lets the GPU decode while the host samples the step's token, instead of queueing
    /// the whole chunk in front of the next step. No codes, more than one program takes, or
    /// one part: as `submit`.
    pub fn submit_in_parts(&mut self, codes: &[u32], parts: usize) -> Result<(), EngineError> {
        if codes.len() > self.codes_per_program() {
            return self.submit(codes);
        }
        self.encode_in_parts(codes, parts)?;
        self.flush();
        Ok(())
    }

    /// Like [`CodecDecoder::submit_in_parts`], but the launches are only encoded: the caller
    /// submits them with its own work ([`CodecDecoder::take_encoded`]). Codes past one
    /// program are refused (a caller that batches parts gives a chunk at a time).
    pub fn encode_in_parts(&mut self, codes: &[u32], parts: usize) -> Result<(), EngineError> {
        self.check_codes(codes)?;
        if codes.len() > self.codes_per_program() {
            return Err(EngineError::Input(format!(
                "a chunk of {} codes is more than the {} one codec program decodes",
                codes.len(),
                self.codes_per_program()
            )));
        }
        if codes.is_empty() {
            return Ok(());
        }
        let launches = self.load_piece(codes)?.launches();
        self.spread = Some(Spread {
            length: codes.len(),
            encoded: 0,
            parts: parts.clamp(1, launches),
        });
        self.encode_next_part();
        Ok(())
    }

    /// Whether a chunk given to [`CodecDecoder::submit_in_parts`] has launches not yet
    /// submitted.
    pub fn parts_left(&self) -> bool {
        self.spread.is_some()
    }

    /// Submits the next part of the chunk given to [`CodecDecoder::submit_in_parts`] (none:
    /// nothing); its last part also copies the samples out for [`CodecDecoder::finish`].
    pub fn submit_next_part(&mut self) {
        self.encode_next_part();
        self.flush();
    }

    /// Like [`CodecDecoder::submit_next_part`], but the part is only encoded (see
    /// [`CodecDecoder::take_encoded`]).
    pub fn encode_next_part(&mut self) {
        if let Some(spread) = self.spread {
            self.encode_parts(spread, spread.encoded + 1);
        }
    }

    /// The command buffers encoded since the last submission, in order, for the caller to
    /// submit (behind its own work, in one submission); it then reports the submission with
    /// [`CodecDecoder::submitted`] before the decoder is used again.
    pub fn take_encoded(&mut self) -> Vec<wgpu::CommandBuffer> {
        std::mem::take(&mut self.encoded)
    }

    /// Reports the submission that carried the buffers of [`CodecDecoder::take_encoded`].
    pub fn submitted(&mut self, submission: &wgpu::SubmissionIndex) {
        if let Some((_, sent @ Sent::Encoded)) = &mut self.in_flight {
            *sent = Sent::Submitted(submission.clone());
        }
    }

    /// Submits what is encoded, alone.
    fn flush(&mut self) {
        if !self.encoded.is_empty() {
            let encoded = self.take_encoded();
            let submission = self.weights.gpu.submit_commands(encoded);
            self.submitted(&submission);
        }
    }

    /// Encodes the parts of `spread` up to part `end` (exclusive) in one command buffer;
    /// with its last part the copy of the samples too, and the chunk is in flight.
    fn encode_parts(&mut self, spread: Spread, end: usize) {
        let launches = self.programs[&spread.length].launches();
        let bound = |part: usize| part * launches / spread.parts;
        let last = end == spread.parts;
        self.spread = (!last).then_some(Spread { encoded: end, ..spread });
        self.encode_launches(spread.length, bound(spread.encoded)..bound(end));
    }

    /// Encodes `launches` of the program for `length` codes, whose input is loaded; when they
    /// end the program, the copy of the samples too, and the chunk is in flight (the
    /// histories it wrote are the next chunk's).
    fn encode_launches(&mut self, length: usize, launches: std::ops::Range<usize>) {
        let gpu = &self.weights.gpu;
        let program = &self.programs[&length];
        let dispatches = &program.dispatches[self.turn];
        let last = launches.end == dispatches.len();
        let copy = last.then_some((&program.output, &program.readback));
        self.encoded.push(gpu.encode_then_copy(&dispatches[launches], copy));
        if last {
            self.in_flight = Some((length, Sent::Encoded));
            self.next_turn();
        }
    }

    /// After a chunk's last launch is submitted: the histories it wrote are the next chunk's.
    fn next_turn(&mut self) {
        self.turn = 1 - self.turn;
    }

    /// The samples of every chunk submitted so far and not yet handed out, in order; submits
    /// what is left of a chunk given in parts and waits for the last one to finish on the GPU.
    pub fn finish(&mut self) -> Result<Vec<f32>, EngineError> {
        self.read_in_flight()?;
        Ok(std::mem::take(&mut self.ready))
    }

    /// Submits the rest of a chunk given in parts (and whatever else is encoded), then reads
    /// the chunk in flight (if any) into `ready`.
    fn read_in_flight(&mut self) -> Result<(), EngineError> {
        if let Some(spread) = self.spread {
            self.encode_parts(spread, spread.parts);
        }
        self.flush();
        match self.in_flight.take() {
            None => {}
            Some((_, Sent::Encoded)) => {
                return Err(GpuError::Readback(
                    "a codec chunk was read before the submission that carries it was reported".into(),
                )
                .into());
            }
            Some((length, Sent::Submitted(submission))) => {
                let samples: Vec<f32> = self.programs[&length].readback.read(&self.weights.gpu, submission)?;
                self.ready.extend(samples);
            }
        }
        Ok(())
    }

    /// Compiles the program for chunks of `codes` codes ahead of the first such chunk.
    pub fn prepare(&mut self, codes: usize) -> Result<(), EngineError> {
        if codes > 0 && !self.programs.contains_key(&codes) {
            let program = self.compile(codes)?;
            self.programs.insert(codes, program);
        }
        Ok(())
    }

    /// Writes checked codes' codebook rows into the input of the program of their length
    /// (compiled if needed; the chunk before read first, its readback free); returns the
    /// program.
    fn load_piece(&mut self, codes: &[u32]) -> Result<&ChunkProgram, EngineError> {
        self.read_in_flight()?;
        self.prepare(codes.len())?;
        let program = &self.programs[&codes.len()];
        let dim = self.weights.codebook_dim;
        let rows: Vec<f32> = codes
            .iter()
            .flat_map(|&code| {
                self.weights.codebook[code as usize * dim..(code as usize + 1) * dim]
                    .iter()
                    .copied()
            })
            .collect();
        self.weights
            .gpu
            .queue
            .write_buffer(&program.input, 0, bytemuck::cast_slice(&rows));
        Ok(program)
    }

    /// Loads `codes` as [`CodecDecoder::load_piece`] does and returns the launches of this
    /// turn (after the chunk before, if any, has been submitted whole and flipped it).
    fn load_turn(&mut self, codes: &[u32]) -> Result<&[Dispatch], EngineError> {
        self.load_piece(codes)?;
        Ok(&self.programs[&codes.len()].dispatches[self.turn])
    }

    /// Decodes one chunk of `codes` (at most one program's worth) as one timed pass, for
    /// `drama bench`: its GPU time (timestamps at the pass boundaries where the adapter has
    /// them, wall time otherwise) and its launch count. Advances the stream; the samples are
    /// not kept.
    pub fn timed_chunk(&mut self, codes: &[u32]) -> Result<(std::time::Duration, usize), EngineError> {
        self.check_codes(codes)?;
        let gpu = self.weights.gpu.clone();
        let dispatches = self.load_turn(codes)?;
        let timed = (gpu.timed_submit(dispatches)?, dispatches.len());
        self.next_turn();
        Ok(timed)
    }

    /// Like [`CodecDecoder::timed_chunk`], one launch per pass: each launch's kernel and GPU
    /// time (needs timestamp queries).
    pub fn profiled_chunk(&mut self, codes: &[u32]) -> Result<Vec<(Kernel, std::time::Duration)>, EngineError> {
        self.check_codes(codes)?;
        let gpu = self.weights.gpu.clone();
        let dispatches = self.load_turn(codes)?;
        let times = gpu.profile_submit(dispatches)?;
        let profile = dispatches.iter().map(|d| d.kernel).zip(times).collect();
        self.next_turn();
        Ok(profile)
    }

    /// Refuses codes outside the codebook.
    fn check_codes(&self, codes: &[u32]) -> Result<(), EngineError> {
        match codes.iter().find(|&&code| code as usize >= self.weights.codes) {
            Some(&bad) => Err(EngineError::Input(format!(
                "code {bad} is not below audio_codes {}",
                self.weights.codes
            ))),
            None => Ok(()),
        }
    }

    /// Encodes checked codes with the program of their length.
    fn encode_piece(&mut self, codes: &[u32]) -> Result<(), EngineError> {
        let launches = self.load_piece(codes)?.launches();
        self.encode_launches(codes.len(), 0..launches);
        Ok(())
    }
}
