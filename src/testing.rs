//! Helpers shared by the tests, the demo and the bench: a seeded generator for synthetic
//! data, and the comparator that checks a GPU output against the CPU reference.

use crate::tensor::{DType, Tensor};

/// SplitMix64: small, seedable, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// Approximately normal (sum of uniforms).
    pub fn normal(&mut self) -> f32 {
        (0..4).map(|_| self.unit()).sum::<f32>() * 0.866
    }
    /// `n` normal values.
    pub fn normals(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.normal()).collect()
    }
    /// A random float tensor of `dtype`.
    pub fn tensor(&mut self, dtype: DType, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor::from_f32(dtype, shape, &self.normals(n))
    }
    /// A shuffled `0..n`.
    pub fn permutation(&mut self, n: usize) -> Vec<u32> {
        let mut v: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            v.swap(i, self.below(i + 1));
        }
        v
    }
}

/// Allowed difference: `|got - want| <= abs + rel · |want|`.
#[derive(Clone, Copy, Debug)]
pub struct Tol {
    pub abs: f32,
    pub rel: f32,
}

/// What a failed comparison found.
#[derive(Debug)]
pub struct Mismatch {
    pub failing: usize,
    pub total: usize,
    pub worst_index: usize,
    pub worst_got: f32,
    pub worst_want: f32,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} elements out of tolerance; worst at flat index {}: got {}, want {}",
            self.failing, self.total, self.worst_index, self.worst_got, self.worst_want
        )
    }
}

/// Compares two tensors of one shape and type. NaN matches only NaN; infinities must match
/// exactly; integer tensors must be equal.
pub fn compare(got: &Tensor, want: &Tensor, tol: Tol) -> Result<(), String> {
    if got.shape != want.shape || got.dtype != want.dtype {
        return Err(format!(
            "shape/type differ: got {:?} {}, want {:?} {}",
            got.shape, got.dtype, want.shape, want.dtype
        ));
    }
    let (g, w) = (got.to_f32(), want.to_f32());
    let tol = if got.dtype.is_float() {
        tol
    } else {
        Tol { abs: 0.0, rel: 0.0 }
    };
    let mut failing = 0;
    let mut worst = (0usize, -1.0f32);
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let ok = if a.is_nan() || b.is_nan() {
            a.is_nan() && b.is_nan()
        } else if a.is_infinite() || b.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= tol.abs + tol.rel * b.abs()
        };
        if !ok {
            failing += 1;
            let err = if (a - b).is_nan() {
                f32::INFINITY
            } else {
                (a - b).abs()
            };
            if err > worst.1 {
                worst = (i, err);
            }
        }
    }
    if failing == 0 {
        return Ok(());
    }
    Err(Mismatch {
        failing,
        total: g.len(),
        worst_index: worst.0,
        worst_got: g[worst.0],
        worst_want: w[worst.0],
    }
    .to_string())
}

/// Tolerance for outputs of a norm + rope transform stored as `dtype`: one unit in the last
/// place of the type, plus f32 noise.
pub fn transform_tol(dtype: DType) -> Tol {
    match dtype {
        DType::F32 => Tol {
            abs: 2e-5,
            rel: 2e-5,
        },
        DType::F16 => Tol {
            abs: 2e-3,
            rel: 1.5e-3,
        },
        DType::BF16 => Tol {
            abs: 1.6e-2,
            rel: 1.2e-2,
        },
        _ => Tol { abs: 0.0, rel: 0.0 },
    }
}

/// Tolerance for attention outputs stored as `dtype`: weighted means of V rows whose f32 sums
/// run over up to a few thousand tokens in an order that differs between CPU and GPU, then
/// rounded once (so half types may differ by one unit in the last place).
pub fn attention_tol(dtype: DType) -> Tol {
    match dtype {
        DType::F32 => Tol {
            abs: 5e-5,
            rel: 5e-5,
        },
        _ => transform_tol(dtype),
    }
}
