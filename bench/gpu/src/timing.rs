//! Timing with CUDA events. `compare.py` times the PyTorch baselines with the same procedure
//! (same warm-up, repetition and L2 rules), so the columns of its table are comparable.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cleave::runtime::cudarc::driver::sys::CUevent_flags;
use cleave::runtime::cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use serde_json::{json, Value};

use crate::error::BenchError;

/// What state the L2 cache is in when a timed launch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum L2 {
    /// Before every timed launch a buffer of twice the L2 size (at least 256 MiB) is zeroed, so
    /// inputs come from device memory, as a decode step's KV cache would. The zeroing runs
    /// before the start event, so it is not timed; it also keeps the GPU busy while the host
    /// queues the launch, so host launch overhead is hidden as it is in a real model step.
    Cold,
    /// Launches run back to back, in batches long enough (about 0.5 ms) to hide the host's
    /// launch overhead; inputs that fit in L2 stay there between launches.
    Warm,
}

impl L2 {
    pub(crate) fn name(self) -> &'static str {
        match self {
            L2::Cold => "cold",
            L2::Warm => "warm",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Options {
    pub(crate) l2: L2,
    /// Most timed repetitions per case.
    pub(crate) max_reps: usize,
    /// Fewest timed repetitions per case.
    pub(crate) min_reps: usize,
    /// Timed work per case: repetitions = target / estimated time, within the bounds above.
    pub(crate) target: Duration,
    /// Untimed warm-up: at least three calls and at least this long.
    pub(crate) warmup: Duration,
}

impl Options {
    pub(crate) fn json(&self, flush_bytes: usize) -> Value {
        json!({
            "l2": self.l2.name(),
            "flush_bytes": flush_bytes,
            "max_reps": self.max_reps,
            "min_reps": self.min_reps,
            "target_ms": self.target.as_secs_f64() * 1e3,
            "warmup_ms": self.warmup.as_secs_f64() * 1e3,
            "warm_batch_ms": WARM_BATCH_MS,
        })
    }
}

/// In warm mode, the GPU time one event pair should enclose.
const WARM_BATCH_MS: f64 = 0.5;

/// The statistics of one timed case, per call of `f`.
#[derive(Clone, Debug)]
pub(crate) struct Timing {
    pub(crate) median_us: f64,
    pub(crate) min_us: f64,
    pub(crate) mean_us: f64,
    pub(crate) max_us: f64,
    pub(crate) reps: usize,
    pub(crate) batch: usize,
}

impl Timing {
    pub(crate) fn json(&self) -> Value {
        json!({
            "median_us": self.median_us,
            "min_us": self.min_us,
            "mean_us": self.mean_us,
            "max_us": self.max_us,
            "reps": self.reps,
            "batch": self.batch,
        })
    }
}

fn event(stream: &Arc<CudaStream>) -> Result<CudaEvent, BenchError> {
    stream
        .context()
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| BenchError::driver("creating a CUDA event", e))
}

fn sync(stream: &Arc<CudaStream>) -> Result<(), BenchError> {
    stream.synchronize().map_err(|e| BenchError::driver("waiting for the GPU", e))
}

fn flush_l2(stream: &Arc<CudaStream>, flush: &mut Option<CudaSlice<u8>>) -> Result<(), BenchError> {
    match flush {
        Some(buf) => stream.memset_zeros(buf).map_err(|e| BenchError::driver("flushing the L2 cache", e)),
        None => Ok(()),
    }
}

/// The L2-flush buffer for cold timing: twice the L2 size, at least 256 MiB (what
/// `triton.testing.do_bench` uses).
pub(crate) fn flush_buffer(stream: &Arc<CudaStream>, l2_bytes: usize) -> Result<CudaSlice<u8>, BenchError> {
    let bytes = (2 * l2_bytes).max(256 << 20);
    stream.alloc_zeros::<u8>(bytes).map_err(|e| BenchError::driver("allocating the L2-flush buffer", e))
}

/// Times `f` (which queues work on `stream`): warm-up, an estimate, then `reps` event-timed
/// repetitions; returns the statistics per call.
pub(crate) fn time(
    stream: &Arc<CudaStream>,
    flush: &mut Option<CudaSlice<u8>>,
    opts: &Options,
    mut f: impl FnMut() -> Result<(), BenchError>,
) -> Result<Timing, BenchError> {
    let started = Instant::now();
    let mut calls = 0;
    while calls < 3 || started.elapsed() < opts.warmup {
        f()?;
        sync(stream)?;
        calls += 1;
    }

    // One event-timed call, the way the timed ones run, to size the repetitions.
    let (start, end) = (event(stream)?, event(stream)?);
    flush_l2(stream, flush)?;
    record(&start, stream)?;
    f()?;
    record(&end, stream)?;
    let estimate_ms = elapsed_ms(&start, &end)?.max(1e-4);

    // `max` first: a caller's min above its max must not make `clamp` panic.
    let max_reps = opts.max_reps.max(1);
    let reps =
        ((opts.target.as_secs_f64() * 1e3 / estimate_ms) as usize).clamp(opts.min_reps.clamp(1, max_reps), max_reps);
    let batch = match opts.l2 {
        L2::Cold => 1,
        L2::Warm => ((WARM_BATCH_MS / estimate_ms).ceil() as usize).clamp(1, 100),
    };
    let events: Vec<(CudaEvent, CudaEvent)> =
        (0..reps).map(|_| Ok((event(stream)?, event(stream)?))).collect::<Result<_, BenchError>>()?;
    for (start, end) in &events {
        if opts.l2 == L2::Cold {
            flush_l2(stream, flush)?;
        }
        record(start, stream)?;
        for _ in 0..batch {
            f()?;
        }
        record(end, stream)?;
    }
    sync(stream)?;
    let mut per_call: Vec<f64> = Vec::with_capacity(reps);
    for (start, end) in &events {
        per_call.push(elapsed_ms(start, end)? * 1e3 / batch as f64);
    }
    per_call.sort_by(f64::total_cmp);
    let median_us =
        if reps % 2 == 1 { per_call[reps / 2] } else { 0.5 * (per_call[reps / 2 - 1] + per_call[reps / 2]) };
    Ok(Timing {
        median_us,
        min_us: per_call[0],
        mean_us: per_call.iter().sum::<f64>() / reps as f64,
        max_us: per_call[reps - 1],
        reps,
        batch,
    })
}

fn record(e: &CudaEvent, stream: &Arc<CudaStream>) -> Result<(), BenchError> {
    e.record(stream).map_err(|err| BenchError::driver("recording a CUDA event", err))
}

fn elapsed_ms(start: &CudaEvent, end: &CudaEvent) -> Result<f64, BenchError> {
    start.elapsed_ms(end).map(f64::from).map_err(|e| BenchError::driver("reading a CUDA event", e))
}
