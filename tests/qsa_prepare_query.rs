//! qsa_prepare_query: GPU against the CPU reference, both rope sources, norm on and off, even
//! and odd widths.

mod util;

use qsa_wgpu::ops::qsa_prepare_query::{
    cpu, gpu, gpu_with, shader, QsaPrepareQueryAttrs, QsaPrepareQueryInputs, QsaPrepareQueryParams,
    OP, SHADER_VEC,
};
use qsa_wgpu::testing::{compare, transform_tol, Rng, Tol};
use qsa_wgpu::{DType, Tensor};

/// One random case: owned inputs of the shape given (rope 0: none, 1: cos/sin tables,
/// 2: freqs_cis over `rows` positions).
struct Case {
    q: Tensor,
    w: Option<Tensor>,
    cos: Option<Tensor>,
    sin: Option<Tensor>,
    freqs: Option<Tensor>,
    pos: Option<Tensor>,
}

impl Case {
    fn new(rng: &mut Rng, dt: DType, [t, hi, di, dr]: [usize; 4], rope: u32, norm: bool) -> Case {
        let rows = 200;
        Case {
            q: rng.tensor(dt, &[t, hi, di]),
            w: norm.then(|| rng.tensor(dt, &[di])),
            cos: (rope == 1).then(|| rng.tensor(dt, &[t, dr])),
            sin: (rope == 1).then(|| rng.tensor(dt, &[t, dr])),
            freqs: (rope == 2).then(|| rng.tensor(dt, &[rows, dr])),
            pos: (rope == 2).then(|| {
                let p: Vec<i32> = (0..t).map(|_| rng.below(rows) as i32).collect();
                Tensor::from_i32(&[t], &p)
            }),
        }
    }

    fn inputs(&self) -> QsaPrepareQueryInputs<'_> {
        QsaPrepareQueryInputs {
            index_query_raw: &self.q,
            q_norm_weight: self.w.as_ref(),
            rope_cos: self.cos.as_ref(),
            rope_sin: self.sin.as_ref(),
            freqs_cis: self.freqs.as_ref(),
            positions: self.pos.as_ref(),
        }
    }
}

#[test]
fn gpu_matches_cpu() {
    let ctx = util::ctx();
    let mut rng = Rng::new(7);
    let mut cases = 0;
    for dt in [DType::F32, DType::F16, DType::BF16] {
        // Odd widths: with 16-bit types two rows share a word at every row boundary.
        for (di, dr) in [(40, 0), (72, 24), (128, 64), (37, 0), (45, 18)] {
            for t in [1, 3, 17, 130] {
                for rope in 0..3 {
                    if dr == 0 && rope > 0 {
                        continue;
                    }
                    let hi = 1 + rng.below(4);
                    let norm = rng.below(3) != 0;
                    let case = Case::new(&mut rng, dt, [t, hi, di, dr], rope, norm);
                    let x = case.inputs();
                    let a = QsaPrepareQueryAttrs {
                        epsilon: 1e-6,
                        norm_weight_offset: rng.below(2) as f32,
                        rotary_dim: None,
                    };
                    let want = cpu(&x, &a).unwrap();
                    let got = pollster::block_on(gpu(&ctx, &x, &a)).unwrap();
                    compare(&got, &want, transform_tol(dt))
                        .unwrap_or_else(|e| panic!("{dt} di={di} dr={dr} t={t} rope={rope}: {e}"));
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 132);
}

#[test]
fn norm_and_rope_by_hand() {
    // Di = 4, Dr = 2: y = x / rms · w, then (y0, y1) rotated by (cos, sin) of channel 0 / 1.
    let q = Tensor::from_f32(DType::F32, &[1, 1, 4], &[1.0, 2.0, 3.0, 4.0]);
    let w = Tensor::from_f32(DType::F32, &[4], &[1.0, 1.0, 2.0, 0.5]);
    let c = Tensor::from_f32(DType::F32, &[1, 2], &[0.0, 0.5]);
    let s = Tensor::from_f32(DType::F32, &[1, 2], &[1.0, 0.25]);
    let x = QsaPrepareQueryInputs {
        index_query_raw: &q,
        q_norm_weight: Some(&w),
        rope_cos: Some(&c),
        rope_sin: Some(&s),
        freqs_cis: None,
        positions: None,
    };
    let a = QsaPrepareQueryAttrs {
        epsilon: 0.0,
        norm_weight_offset: 0.0,
        rotary_dim: None,
    };
    let got = cpu(&x, &a).unwrap().to_f32();
    let rms = (30.0f32 / 4.0).sqrt();
    let y = [1.0 / rms, 2.0 / rms, 6.0 / rms, 2.0 / rms];
    let want = [
        y[0] * 0.0 - y[1] * 1.0,
        y[1] * 0.5 + y[0] * 0.25,
        y[2],
        y[3],
    ];
    for i in 0..4 {
        assert!(
            (got[i] - want[i]).abs() < 1e-6,
            "channel {i}: {} vs {}",
            got[i],
            want[i]
        );
    }
    let gpu_out = pollster::block_on(gpu(&util::ctx(), &x, &a))
        .unwrap()
        .to_f32();
    for i in 0..4 {
        assert!(
            (gpu_out[i] - want[i]).abs() < 1e-5,
            "gpu channel {i}: {} vs {}",
            gpu_out[i],
            want[i]
        );
    }
}

/// One rounding step of `dt` relative to the value (a few for f32), and a floor for values
/// that a rotation cancels to near zero: a fused `a·c − b·s` differs from the unfused one by up
/// to an f32 rounding step of each product, and the products here reach about 25.
fn rounding_step(dt: DType) -> Tol {
    let rel = match dt {
        DType::F32 => 4.0 * f32::EPSILON,
        DType::F16 => 1.0 / 1024.0,
        _ => 1.0 / 128.0,
    };
    Tol { abs: 1e-5, rel }
}

/// The word kernel gives the element kernel's values, every type, rope source and norm setting,
/// on shapes it takes; and it takes exactly the shapes of whole words. Both kernels do the same
/// arithmetic in the same order, so on lavapipe and llvmpipe the bytes are equal; a driver may
/// still contract a multiply and an add into one fused operation in one kernel and not in the
/// other (NVIDIA's Vulkan driver does: docs/perf.md), so the check allows one rounding step of
/// the storage type, far inside the operator's tolerance against the CPU.
#[test]
fn word_kernel_matches_element_kernel() {
    let ctx = util::ctx();
    let mut rng = Rng::new(11);
    let mut cases = 0;
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for (di, dr) in [(128, 64), (48, 16), (32, 0)] {
            for rope in 0..3 {
                for norm in [false, true] {
                    let dr = if rope == 0 { 0 } else { dr.max(16) };
                    let case = Case::new(&mut rng, dt, [37, 3, di, dr], rope, norm);
                    let x = case.inputs();
                    let a = QsaPrepareQueryAttrs {
                        epsilon: 1e-6,
                        norm_weight_offset: rng.below(2) as f32,
                        rotary_dim: None,
                    };
                    let prm = QsaPrepareQueryParams {
                        di: di as u32,
                        dr: dr as u32,
                        rope_mode: rope,
                        ..Default::default()
                    };
                    assert_eq!(shader(dt, &prm), SHADER_VEC, "{dt} di={di} dr={dr}");
                    let word = pollster::block_on(gpu_with(&ctx, &x, &a, false)).unwrap();
                    let elem = pollster::block_on(gpu_with(&ctx, &x, &a, true)).unwrap();
                    compare(&word, &elem, rounding_step(dt)).unwrap_or_else(|e| {
                        panic!("{dt} di={di} dr={dr} rope={rope} norm={norm}: {e}")
                    });
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 54);
    // Shapes that are not whole words take the element kernel.
    let p = |di, dr, rope_mode| QsaPrepareQueryParams {
        di,
        dr,
        rope_mode,
        ..Default::default()
    };
    assert_eq!(shader(DType::F32, &p(36, 0, 0)), SHADER_VEC);
    assert_eq!(shader(DType::BF16, &p(36, 0, 0)), OP);
    assert_eq!(shader(DType::F32, &p(128, 20, 2)), OP);
    assert_eq!(shader(DType::F32, &p(128, 24, 2)), SHADER_VEC);
    assert_eq!(shader(DType::BF16, &p(128, 24, 0)), SHADER_VEC);
    assert_eq!(shader(DType::F16, &p(128, 8, 1)), OP);
}
