//! Random key selections (`dmattn::select_keys`) and an independent definition of what they keep.
use dmattn::{DType, Device, SelectKeys, Tensor, select_keys};
use rand::Rng;
use rand::rngs::StdRng;

/// One selection: a bias (shape with broadcasts, values with ties and special values), an
/// optional eligibility mask, the rule and the smoothing block.
#[derive(Clone, Debug)]
pub struct SelectCase {
    pub dtype: DType,
    pub bias_shape: [usize; 4],
    pub bias: Vec<f64>,
    /// Read through a view whose key stride is 2 (the kernels' scalar path).
    pub strided: bool,
    pub mask: Option<([usize; 4], Vec<bool>)>,
    /// `None`: relu.
    pub k: Option<usize>,
    pub block: Option<usize>,
}

/// A bias value: mostly normal, often from a few levels (ties), sometimes special.
fn value(rng: &mut StdRng, levels: Option<u32>) -> f64 {
    if rng.random_bool(0.02) {
        return [f64::NAN, -f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, -3.0e38, 1e-30][rng.random_range(0..8)];
    }
    match levels {
        Some(n) => rng.random_range(0..n) as f64 - (n / 2) as f64,
        None => {
            let (u, v): (f64, f64) = (rng.random_range(1e-12..1.0), rng.random());
            (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
        }
    }
}

impl SelectCase {
    /// A random case with rows of up to `max_keys` keys.
    pub fn random(rng: &mut StdRng, max_keys: usize) -> Self {
        let dtype = [DType::BF16, DType::F16, DType::F32][rng.random_range(0..3)];
        let sk = match rng.random_range(0..10) {
            0 => rng.random_range(1..=8),
            1..=6 => rng.random_range(1..=max_keys.min(300)),
            _ => rng.random_range(1..=max_keys),
        };
        let out = [rng.random_range(1..=2), [1, 3][rng.random_range(0..2)], rng.random_range(1..=4)];
        let dim = |rng: &mut StdRng, n: usize| if n > 1 && rng.random_bool(0.5) { 1 } else { n };
        let bias_shape = [dim(rng, out[0]), dim(rng, out[1]), dim(rng, out[2]), sk];
        let levels = if rng.random_bool(0.4) { Some(rng.random_range(1..=6)) } else { None };
        let bias = (0..bias_shape.iter().product::<usize>()).map(|_| value(rng, levels)).collect();
        let mask = rng.random_bool(0.5).then(|| {
            let shape = [dim(rng, out[0]), dim(rng, out[1]), dim(rng, out[2]), if rng.random_bool(0.1) { 1 } else { sk }];
            let p = [0.0, 0.05, 0.5, 0.9, 1.0][rng.random_range(0..5)];
            (shape, (0..shape.iter().product()).map(|_| rng.random_bool(p)).collect())
        });
        let k = match rng.random_range(0..8) {
            0 => None,
            1 => Some(1),
            2 => Some(sk),
            3 => Some(sk + rng.random_range(1..5)),
            4 => Some((sk / 2).max(1)),
            _ => Some(rng.random_range(1..=sk)),
        };
        let block = rng.random_bool(0.3).then(|| [1, 2, 3, 7, 32, 64, 100][rng.random_range(0..7)]);
        SelectCase { dtype, bias_shape, bias, strided: rng.random_bool(0.15), mask, k, block }
    }

    /// The bias and mask on `device`.
    pub fn tensors(&self, device: &Device) -> (Tensor, Option<Tensor>) {
        let s = self.bias_shape;
        let bias = if self.strided {
            // Every other element of a tensor twice as long along the keys.
            let wide = [s[0], s[1], s[2], 2 * s[3]];
            let full = Tensor::from_fn(&wide, self.dtype, device, |i| if i % 2 == 0 { self.bias[i / 2] } else { f64::NAN }).unwrap();
            let st = [s[1] * s[2] * 2 * s[3], s[2] * 2 * s[3], 2 * s[3], 2];
            full.as_strided(&s, &st, 0).unwrap()
        } else {
            Tensor::from_fn(&s, self.dtype, device, |i| self.bias[i]).unwrap()
        };
        let mask = self.mask.as_ref().map(|(shape, m)| Tensor::from_fn(shape, DType::Bool, device, |i| m[i] as u8 as f64).unwrap());
        (bias, mask)
    }

    pub fn select(&self, bias: &Tensor, mask: Option<&Tensor>) -> SelectKeys {
        let mut s = select_keys(bias);
        s = match self.k {
            Some(k) => s.top_k(k),
            None => s.relu(),
        };
        if let Some(m) = mask {
            s = s.within(m);
        }
        if let Some(b) = self.block {
            s = s.block_size(b);
        }
        s
    }

    /// The output's rows `[b, h, q]` and keys.
    pub fn out_shape(&self) -> [usize; 4] {
        let m = self.mask.as_ref().map_or([1; 4], |(s, _)| *s);
        std::array::from_fn(|d| self.bias_shape[d].max(m[d]))
    }

    /// What the selection keeps, `[rows, sk]`, straight from its definition: key `j` is among
    /// the top k iff fewer than `k` eligible keys beat it (a larger value, NaN above all and -0
    /// equal to +0, or an equal value at a lower key); the bias rounded to its dtype first.
    pub fn expected(&self) -> Vec<bool> {
        let out = self.out_shape();
        let sk = out[3];
        let at = |s: &[usize; 4], r: usize, j: usize| {
            let (b, h, q) = (r / (out[1] * out[2]), (r / out[2]) % out[1], r % out[2]);
            let p = |n: usize, x: usize| if n == 1 { 0 } else { x };
            ((p(s[0], b) * s[1] + p(s[1], h)) * s[2] + p(s[2], q)) * s[3] + p(s[3], j)
        };
        let rounded = Tensor::from_fn(&[self.bias.len()], self.dtype, &Device::Cpu, |i| self.bias[i]).unwrap().to_f64_vec().unwrap();
        let mut kept = Vec::with_capacity(out[0] * out[1] * out[2] * sk);
        for r in 0..out[0] * out[1] * out[2] {
            let v = |j: usize| rounded[at(&self.bias_shape, r, j)];
            let e = |j: usize| self.mask.as_ref().is_none_or(|(s, m)| m[at(s, r, j)]);
            let key = |x: f64| {
                if x.is_nan() { (1, 0.0) } else { (0, if x == 0.0 { 0.0 } else { x }) }
            };
            let beats = |i: usize, j: usize| {
                let (a, b) = (key(v(i)), key(v(j)));
                a.0 > b.0 || (a.0 == b.0 && (a.1 > b.1 || (a.1 == b.1 && i < j)))
            };
            let mut row: Vec<bool> = (0..sk)
                .map(|j| {
                    e(j) && match self.k {
                        None => v(j) > 0.0,
                        Some(k) => (0..sk).filter(|&i| e(i) && beats(i, j)).count() < k,
                    }
                })
                .collect();
            if let Some(bs) = self.block {
                for start in (0..sk).step_by(bs) {
                    let end = (start + bs).min(sk);
                    let vote = 2 * row[start..end].iter().filter(|&&x| x).count() > end - start;
                    for j in start..end {
                        row[j] = vote && e(j);
                    }
                }
            }
            kept.extend(row);
        }
        kept
    }
}
