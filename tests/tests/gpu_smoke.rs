//! A first look at a GPU: one small call through each kernel variant, each step timed and
//! printed, with a watchdog that names the step where a hang happened. `DMATTN_SMOKE_ONLY=<step>`
//! runs one step (to bisect in separate processes). Skips without a CUDA device.
use dmattn::{DType, Device};
use dmattn_tests::*;
use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The step running and when it started.
static STEP: Mutex<Option<(&str, Instant)>> = Mutex::new(None);

/// A step's time limit: device init loads the PTX modules, which the driver compiles on a first
/// load (over a minute for the whole sm_80 module where its cache is cold); a kernel call, 60 s.
fn limit(step: &str) -> Duration {
    Duration::from_secs(if step == "device init" { 300 } else { 60 })
}

fn start(step: &'static str) {
    *STEP.lock().unwrap() = Some((step, Instant::now()));
}

fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "gpu_smoke: {msg}");
}

#[test]
fn each_kernel_once() {
    start("device init");
    std::thread::spawn(|| {
        loop {
            std::thread::sleep(Duration::from_secs(1));
            if let Some((step, at)) = *STEP.lock().unwrap()
                && step != "done"
                && at.elapsed() > limit(step)
            {
                say(&format!("WATCHDOG: still in step '{step}' after {} s", limit(step).as_secs()));
                std::process::exit(3);
            }
        }
    });
    let t = Instant::now();
    let Some(gpu) = gpu() else { return };
    say(&format!("{} ready after {:.2} s", gpu, t.elapsed().as_secs_f64()));
    let mut rng = fresh_rng("gpu_smoke");
    let base = Case { dtype: DType::BF16, ..Case::new(1, 70, 90, 2, 1, 64) };
    let steps = [
        ("plain", base.clone()),
        ("plain-causal", Case { causal: true, ..base.clone() }),
        ("mods-nothing", Case { head_dim: 96, ..base.clone() }),
        ("all-false-mask", Case { mask: Some([1, 1, 70, 90]), mask_pattern: MaskPattern::Random(0.0), ..base.clone() }),
        ("all-true-mask", Case { mask: Some([1, 1, 70, 90]), mask_pattern: MaskPattern::Random(1.0), ..base.clone() }),
        ("mask", Case { mask: Some([1, 1, 70, 90]), ..base.clone() }),
        ("bias", Case { bias: Some([1, 2, 70, 90]), ..base.clone() }),
        ("softcap", Case { softcap: 10.0, ..base.clone() }),
    ];
    let only = std::env::var("DMATTN_SMOKE_ONLY").ok();
    for (name, case) in steps.iter().filter(|(n, _)| only.as_deref().is_none_or(|o| o == *n)) {
        start(name);
        let t = Instant::now();
        let inputs = case.inputs(&mut rng);
        let got = case.forward(&inputs.to(&gpu)).unwrap();
        let out = got.out.to_f64_vec().unwrap();
        let want = case.forward(&inputs.to(&Device::Cpu)).unwrap().out.to_f64_vec().unwrap();
        let err = rel_err(&out, &want);
        say(&format!("{name}: {:.3} s, rel err {err:.2e}", t.elapsed().as_secs_f64()));
        assert!(err < 1e-2, "{name}: mismatch");
    }
    start("done");
}

/// Every shipped kernel, as this GPU's driver compiled it, keeps everything in registers: no
/// local memory (spills or stack). The offline `cargo xtask ptxas` check uses another ptxas than
/// the driver's, and allocations near 255 registers differ between versions.
#[test]
fn no_kernel_spills_on_this_gpu() {
    let Some(Device::Cuda(gpu)) = gpu() else { return };
    let kernels = gpu.kernel_resources().unwrap();
    assert!(kernels.len() > 50, "only {} kernels found in the module", kernels.len());
    let mut spilled = Vec::new();
    for k in &kernels {
        say(&format!("{:<34} {:>3} registers, {:>3} local bytes", k.name, k.registers, k.local_bytes));
        if k.local_bytes > 0 {
            spilled.push(format!("{} ({} B)", k.name, k.local_bytes));
        }
    }
    assert!(spilled.is_empty(), "kernels using local memory on {}: {}", gpu.name(), spilled.join(", "));
}

/// Freed buffers stay cached in the device's pool between calls; handing them back to the
/// driver leaves the device working (the same call gives the same bits after it).
#[test]
fn cached_memory_can_be_released() {
    let Some(gpu) = gpu() else { return };
    let Device::Cuda(cuda) = &gpu else { unreachable!("gpu() returns a CUDA device") };
    let case = Case { dtype: DType::BF16, mask: Some([1, 1, 300, 200]), ..Case::new(2, 300, 200, 4, 2, 64) };
    let inputs = case.inputs(&mut fresh_rng("cached_memory")).to(&gpu);
    let first = case.forward(&inputs).unwrap().out.to_f64_vec().unwrap();
    cuda.release_cached_memory().unwrap();
    let again = case.forward(&inputs).unwrap().out.to_f64_vec().unwrap();
    assert!(first.iter().all(|x| x.is_finite()));
    assert_eq!(first, again);
}
