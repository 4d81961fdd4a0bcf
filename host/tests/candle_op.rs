//! `dmattn::candle::attention` (feature `candle`) against dmattn's own API on the same inputs:
//! O and every gradient (q, k, v, bias) bit for bit, deterministic mode, over masks, bias
//! broadcasts with and without a gradient, GQA, causal, f16 and bf16. Needs a GPU; the binary
//! itself needs the CUDA libraries (candle links them), so CI builds it and the GPU suite runs it.
use candle_core::{Device as CDevice, Tensor as CTensor, Var};
use dmattn::candle::{Options, attention as candle_attention};
use dmattn::{Device, Tensor, attention};
use half::{bf16, f16};

struct Case {
    b: usize,
    sq: usize,
    sk: usize,
    h: usize,
    hk: usize,
    d: usize,
    mask: Option<[usize; 4]>,
    bias: Option<[usize; 4]>,
    bias_grad: bool,
    causal: bool,
    f16: bool,
}

/// Deterministic pseudo-random values in [-1.5, 1.5) for element `i` of stream `seed`.
fn value(seed: u64, i: usize) -> f32 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 29;
    (x >> 40) as f32 / (1u64 << 24) as f32 * 3.0 - 1.5
}

fn values(seed: u64, shape: &[usize]) -> Vec<f32> {
    (0..shape.iter().product()).map(|i| value(seed, i)).collect()
}

/// The same values as a candle tensor and a dmattn tensor on the GPU, in the case's dtype.
fn operand(case: &Case, seed: u64, shape: &[usize], cdev: &CDevice, dev: &Device) -> (CTensor, Tensor) {
    let v = values(seed, shape);
    if case.f16 {
        let x: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
        (CTensor::from_vec(x.clone(), shape, cdev).unwrap(), Tensor::from_vec(x, shape, dev).unwrap())
    } else {
        let x: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
        (CTensor::from_vec(x.clone(), shape, cdev).unwrap(), Tensor::from_vec(x, shape, dev).unwrap())
    }
}

fn candle_values(t: &CTensor) -> Vec<f64> {
    t.flatten_all().unwrap().to_dtype(candle_core::DType::F64).unwrap().to_vec1::<f64>().unwrap()
}

fn check(case: &Case, cdev: &CDevice, dev: &Device) {
    let (q_shape, kv_shape) = ([case.b, case.sq, case.h, case.d], [case.b, case.sk, case.hk, case.d]);
    let (cq, q) = operand(case, 1, &q_shape, cdev, dev);
    let (ck, k) = operand(case, 2, &kv_shape, cdev, dev);
    let (cv, v) = operand(case, 3, &kv_shape, cdev, dev);
    let (cdout, dout) = operand(case, 4, &q_shape, cdev, dev);
    let bias = case.bias.map(|s| operand(case, 5, &s, cdev, dev));
    let mask = case.mask.map(|s| {
        let keep: Vec<u8> = values(6, &s).iter().map(|&x| (x > -0.9) as u8).collect();
        let dm: Vec<bool> = keep.iter().map(|&x| x != 0).collect();
        (CTensor::from_vec(keep, &s, cdev).unwrap(), Tensor::from_vec(dm, &s, dev).unwrap())
    });

    // dmattn's own call.
    let mut call = attention(&q, &k, &v).causal(case.causal).deterministic(true);
    if let Some((_, m)) = &mask {
        call = call.mask(m);
    }
    if let Some((_, b)) = &bias {
        call = call.bias(b);
    }
    let fwd = call.forward().unwrap();
    let g = fwd.backward(&dout).unwrap();

    // The candle op, gradients through candle's autograd: d(sum(O * dout))/dO = dout.
    let (vq, vk, vv) = (Var::from_tensor(&cq).unwrap(), Var::from_tensor(&ck).unwrap(), Var::from_tensor(&cv).unwrap());
    let vbias = bias.as_ref().map(|(cb, _)| if case.bias_grad { Var::from_tensor(cb).unwrap().as_tensor().clone() } else { cb.clone() });
    let options = Options { mask: mask.as_ref().map(|(m, _)| m.clone()), bias: vbias.clone(), causal: case.causal, deterministic: true, ..Options::default() };
    let o = candle_attention(vq.as_tensor(), vk.as_tensor(), vv.as_tensor(), &options).unwrap();
    let grads = (o.clone() * &cdout).unwrap().sum_all().unwrap().backward().unwrap();

    let name = format!("b{} sq{} sk{} h{} hk{} d{} mask {:?} bias {:?} (grad {}) causal {} f16 {}", case.b, case.sq, case.sk, case.h, case.hk, case.d, case.mask, case.bias, case.bias_grad, case.causal, case.f16);
    let same = |what: &str, got: &CTensor, want: &Tensor| {
        assert_eq!(got.dims(), want.shape(), "{what} shape, {name}");
        let (got, want) = (candle_values(got), want.to_f64_vec().unwrap());
        let diff = got.iter().zip(&want).position(|(a, b)| a != b);
        assert!(diff.is_none(), "{what}[{}] = {} where dmattn's own API gives {}, {name}", diff.unwrap(), got[diff.unwrap()], want[diff.unwrap()]);
    };
    same("out", &o, &fwd.out);
    same("dq", grads.get(vq.as_tensor()).expect("dq"), &g.dq);
    same("dk", grads.get(vk.as_tensor()).expect("dk"), &g.dk);
    same("dv", grads.get(vv.as_tensor()).expect("dv"), &g.dv);
    match (&vbias, case.bias_grad) {
        (Some(b), true) => same("dbias", grads.get(b).expect("dbias"), g.dbias.as_ref().unwrap()),
        (Some(b), false) => assert!(grads.get(b).is_none(), "a bias without a gradient got one, {name}"),
        (None, _) => {}
    }
}

#[test]
fn candle_op_equals_dmattn_bit_for_bit() {
    let dev = match Device::cuda(0) {
        Ok(d) => d,
        Err(why) => {
            eprintln!("SKIPPED (no GPU test ran): {why}");
            return;
        }
    };
    let cdev = CDevice::new_cuda(0).unwrap();
    let base = Case { b: 2, sq: 200, sk: 300, h: 4, hk: 2, d: 64, mask: None, bias: None, bias_grad: false, causal: false, f16: false };
    let cases = [
        Case { ..base },
        Case { causal: true, f16: true, d: 128, ..base },
        Case { mask: Some([2, 2, 1, 300]), bias: Some([2, 2, 1, 300]), bias_grad: true, causal: true, ..base },
        Case { mask: Some([1, 4, 200, 300]), bias: Some([1, 4, 200, 300]), bias_grad: true, ..base },
        Case { mask: Some([2, 1, 200, 300]), bias: Some([1, 1, 1, 300]), bias_grad: false, f16: true, ..base },
        Case { sq: 1, sk: 5000, h: 8, hk: 1, bias: Some([1, 1, 1, 5000]), bias_grad: true, ..base },
    ];
    for case in &cases {
        check(case, &cdev, &dev);
    }
}
