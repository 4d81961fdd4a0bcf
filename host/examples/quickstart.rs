//! Masked, biased, causal GQA attention and its gradients, on the first GPU or else the CPU.
use dmattn::{DType, Device, Tensor, attention};

fn main() -> dmattn::Result<()> {
    let (dev, no_gpu) = Device::cuda_or_cpu();
    if let Some(why) = no_gpu {
        println!("running on the CPU: {why}");
    }
    // The GPU kernels take f16 or bf16; the CPU backend any float type.
    let dtype = if dev.is_cuda() { DType::BF16 } else { DType::F32 };
    let (b, sq, sk, h, hk, d) = (2, 128, 256, 8, 2, 64);
    let wave = |f: f64| move |i: usize| (i as f64 * f).sin();
    let q = Tensor::from_fn(&[b, sq, h, d], dtype, &dev, wave(0.73))?;
    let k = Tensor::from_fn(&[b, sk, hk, d], dtype, &dev, wave(1.31))?;
    let v = Tensor::from_fn(&[b, sk, hk, d], dtype, &dev, wave(0.37))?;
    // A key-side dynamic mask and bias, one row per kv head, broadcast over the queries.
    let keep = Tensor::from_fn(&[b, hk, 1, sk], DType::Bool, &dev, |i| (i % 3 != 1) as u8 as f64)?;
    let bias = Tensor::from_fn(&[b, hk, 1, sk], dtype, &dev, wave(0.05))?;

    let fwd = attention(&q, &k, &v).mask(&keep).bias(&bias).causal(true).forward()?;
    let dout = Tensor::from_fn(fwd.out.shape(), dtype, &dev, wave(0.11))?;
    let grads = fwd.backward(&dout)?;

    let dbias = grads.dbias.expect("a bias has a gradient");
    println!("on {dev}: out {:?}, lse {:?}, dq {:?}, dk {:?}, dbias {:?}", fwd.out.shape(), fwd.lse.shape(), grads.dq.shape(), grads.dk.shape(), dbias.shape());
    let out = fwd.out.to_f64_vec()?;
    assert!(out.iter().all(|x| x.is_finite()));
    println!("out[0, 0, 0, ..4] = {:.4?}", &out[..4]);
    Ok(())
}
