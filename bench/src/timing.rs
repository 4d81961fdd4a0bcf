//! GPU timing: CUDA events around each call, warm-up first, the median of many runs.
use cudarc::driver::{CudaStream, sys};
use std::sync::Arc;

pub struct Timer {
    pub warmup: usize,
    pub reps: usize,
}

impl Timer {
    /// Median milliseconds of `f(rep)` over `reps` runs after `warmup` untimed ones; `rep`
    /// lets the caller rotate input buffers. With `DMATTN_BENCH_HOST` set, prints the host's
    /// time in each timed `f` (enqueueing, no wait): where it reaches the event time, the call
    /// is bound by the host, not the GPU.
    pub fn median_ms(&self, stream: &Arc<CudaStream>, mut f: impl FnMut(usize) -> dmattn::Result<()>) -> dmattn::Result<f64> {
        let ctx = stream.context();
        for i in 0..self.warmup {
            f(i)?;
        }
        stream.synchronize()?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let print_host = std::env::var_os("DMATTN_BENCH_HOST").is_some();
        let mut times = Vec::with_capacity(self.reps);
        for i in 0..self.reps {
            let (start, end) = (ctx.new_event(flags)?, ctx.new_event(flags)?);
            start.record(stream)?;
            let t0 = std::time::Instant::now();
            f(self.warmup + i)?;
            let host = t0.elapsed();
            end.record(stream)?;
            if print_host {
                eprintln!("host {:.1} us", host.as_secs_f64() * 1e6);
            }
            end.synchronize()?;
            times.push(start.elapsed_ms(&end)? as f64);
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }
}
