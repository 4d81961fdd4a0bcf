//! `cargo xtask demo`: one masked, biased, causal GQA attention on the GPU when there is one,
//! on the CPU otherwise, checked against the f64 reference.
use dmattn::{DType, Device, Tensor, attention};
use std::time::Instant;

pub fn run() -> Result<(), String> {
    demo().map_err(|e| e.to_string())
}

fn demo() -> dmattn::Result<()> {
    let (dev, why) = Device::cuda_or_cpu();
    if let Some(why) = why {
        println!("no GPU ({why}); running on the CPU");
    }
    let dtype = if dev.is_cuda() { DType::BF16 } else { DType::F32 };
    let (b, sq, sk, h, hk, d) = (2, 300, 500, 8, 2, 64);
    let wave = |i: usize, f: f64| (i as f64 * f).sin() * 1.5;
    let cpu = Device::Cpu;
    let q = Tensor::from_fn(&[b, sq, h, d], dtype, &cpu, |i| wave(i, 0.731))?;
    let k = Tensor::from_fn(&[b, sk, hk, d], dtype, &cpu, |i| wave(i, 1.303))?;
    let v = Tensor::from_fn(&[b, sk, hk, d], dtype, &cpu, |i| wave(i, 0.377))?;
    // A dynamic mask shared by the heads of a kv group: keep keys in a sliding window and every
    // seventh key beyond it.
    let mask = Tensor::from_fn(&[b, hk, sq, sk], DType::Bool, &cpu, |i| {
        let (j, r) = (i % sk, (i / sk) % sq);
        let diag = r + sk - sq;
        ((j + 128 > diag && j <= diag) || j % 7 == 0) as u8 as f64
    })?;
    let bias = Tensor::from_fn(&[1, h, sq, sk], dtype, &cpu, |i| wave(i, 0.011) * 0.5)?;
    let run = |dev: &Device| -> dmattn::Result<(Vec<f64>, f64)> {
        let (q, k, v, mask, bias) = (q.to_device(dev)?, k.to_device(dev)?, v.to_device(dev)?, mask.to_device(dev)?, bias.to_device(dev)?);
        let t = Instant::now();
        let fwd = attention(&q, &k, &v).mask(&mask).bias(&bias).causal(true).forward()?;
        let out = fwd.out.to_f64_vec()?;
        Ok((out, t.elapsed().as_secs_f64() * 1e3))
    };
    let (got, ms) = run(&dev)?;
    println!("attention q[{b},{sq},{h},{d}] k/v[{b},{sk},{hk},{d}] + mask[{b},{hk},{sq},{sk}] + bias[1,{h},{sq},{sk}], causal, on {dev}");
    println!("{dtype:?}: {ms:.2} ms wall (first call, module load included)");
    if dev.is_cuda() {
        let (want, _) = run(&Device::Cpu)?;
        let err = got.iter().zip(&want).map(|(a, b)| (a - b).powi(2)).sum::<f64>().sqrt()
            / want.iter().map(|b| b * b).sum::<f64>().sqrt();
        println!("relative error vs the f64 CPU reference: {err:.2e}");
    } else {
        let rows = got.chunks(d).filter(|r| r.iter().all(|&x| x == 0.0)).count();
        println!("(the CPU backend is the f64 reference itself; {rows} rows had no visible key and are 0)");
    }
    Ok(())
}
