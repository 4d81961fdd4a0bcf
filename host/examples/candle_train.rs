//! A candle model that trains with dmattn's attention (feature `candle`, a GPU): one attention
//! layer with learned q/k/v projections and a learned key-side bias under a key-side mask, fitted
//! by gradient descent to the output of a fixed random layer of the same form.
use candle_core::{DType, Device, Result, Tensor, Var};
use dmattn::candle::{Options, attention};

fn main() -> Result<()> {
    let dev = match Device::new_cuda(0) {
        Ok(d) => d,
        Err(e) => {
            println!("needs a CUDA GPU: {e}");
            return Ok(());
        }
    };
    let (b, s, h, hk, d, model) = (2, 256, 4, 2, 64, 128);
    let x = Tensor::randn(0f32, 1.0, (b, s, model), &dev)?;
    // Keys hidden from every query (a dynamic mask's shape: one row per kv head).
    let mask = Tensor::rand(0f32, 1.0, (b, hk, 1, s), &dev)?.ge(0.2)?.to_dtype(DType::U8)?;
    let layer = |wq: &Tensor, wk: &Tensor, wv: &Tensor, bias: &Tensor| -> Result<Tensor> {
        let q = x.broadcast_matmul(wq)?.reshape((b, s, h, d))?.to_dtype(DType::BF16)?;
        let k = x.broadcast_matmul(wk)?.reshape((b, s, hk, d))?.to_dtype(DType::BF16)?;
        let v = x.broadcast_matmul(wv)?.reshape((b, s, hk, d))?.to_dtype(DType::BF16)?;
        let options = Options { mask: Some(mask.clone()), bias: Some(bias.to_dtype(DType::BF16)?), causal: true, ..Options::default() };
        attention(&q, &k, &v, &options)?.to_dtype(DType::F32)
    };
    let init = |rows, cols| Tensor::randn(0f32, (1.0 / model as f64).sqrt() as f32, (rows, cols), &dev);
    let target = layer(&init(model, h * d)?, &init(model, hk * d)?, &init(model, hk * d)?, &Tensor::randn(0f32, 1.0, (b, hk, 1, s), &dev)?)?;

    let (wq, wk, wv) = (Var::from_tensor(&init(model, h * d)?)?, Var::from_tensor(&init(model, hk * d)?)?, Var::from_tensor(&init(model, hk * d)?)?);
    let bias = Var::zeros((b, hk, 1, s), DType::F32, &dev)?;
    let mut first = None;
    for step in 0..=200 {
        let out = layer(wq.as_tensor(), wk.as_tensor(), wv.as_tensor(), bias.as_tensor())?;
        let loss = (out - &target)?.sqr()?.mean_all()?;
        let grads = loss.backward()?;
        for var in [&wq, &wk, &wv, &bias] {
            let g = grads.get(var.as_tensor()).expect("every parameter has a gradient");
            var.set(&(var.as_tensor() - (g * 20.0)?)?)?;
        }
        let loss = loss.to_scalar::<f32>()?;
        first.get_or_insert(loss);
        if step % 50 == 0 {
            println!("step {step:3}: loss {loss:.5}");
        }
        if step == 200 {
            println!("loss {:.5} -> {loss:.5}", first.unwrap());
            assert!(loss < 0.8 * first.unwrap(), "the model did not learn");
        }
    }
    Ok(())
}
