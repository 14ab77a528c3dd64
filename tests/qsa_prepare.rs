//! qsa_prepare: GPU against the CPU reference over awkward sizes, and the split invariance
//! of SPEC §1 (one prefill, chunks, token by token give the same block keys).

mod util;

use qsa_wgpu::ops::qsa_prepare::{cpu, gpu, QsaPrepareAttrs, QsaPrepareInputs, QsaPrepareOutputs};
use qsa_wgpu::testing::{compare, transform_tol, Rng};
use qsa_wgpu::{DType, Tensor};

struct Problem {
    raw: Tensor,
    past_blocks: Tensor,
    key_length: Tensor,
    cos: Option<Tensor>,
    sin: Option<Tensor>,
    w: Option<Tensor>,
    past_inc: Tensor,
    past_rope: Option<Tensor>,
}

impl Problem {
    fn inputs(&self) -> QsaPrepareInputs<'_> {
        QsaPrepareInputs {
            raw_index_keys: &self.raw,
            past_block_index_keys: &self.past_blocks,
            key_length: &self.key_length,
            rope_cos: self.cos.as_ref(),
            rope_sin: self.sin.as_ref(),
            k_norm_weight: self.w.as_ref(),
            past_incomplete_raw_keys: &self.past_inc,
            past_incomplete_rope: self.past_rope.as_ref(),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn problem(
    rng: &mut Rng,
    dt: DType,
    pasts: &[usize],
    l: usize,
    di: usize,
    dr: usize,
    norm: bool,
    r: usize,
) -> Problem {
    let n = pasts.len();
    let bp = pasts.iter().map(|p| p / r).max().unwrap() + 1;
    let s: Vec<i32> = pasts.iter().map(|p| (p + l) as i32).collect();
    Problem {
        raw: rng.tensor(dt, &[n, l, di]),
        past_blocks: rng.tensor(dt, &[n, bp, di]),
        key_length: Tensor::from_i32(&[n], &s),
        cos: (dr > 0).then(|| rng.tensor(dt, &[n, l, dr])),
        sin: (dr > 0).then(|| rng.tensor(dt, &[n, l, dr])),
        w: norm.then(|| rng.tensor(dt, &[di])),
        past_inc: rng.tensor(dt, &[n, r - 1, di]),
        past_rope: (dr > 0).then(|| rng.tensor(dt, &[n, 2 * dr])),
    }
}

fn check(got: &QsaPrepareOutputs, want: &QsaPrepareOutputs, dt: DType, what: &str) {
    let tol = transform_tol(dt);
    compare(&got.block_index_keys, &want.block_index_keys, tol)
        .unwrap_or_else(|e| panic!("{what}: block_index_keys: {e}"));
    compare(&got.incomplete_raw_keys, &want.incomplete_raw_keys, tol)
        .unwrap_or_else(|e| panic!("{what}: incomplete_raw_keys: {e}"));
    assert_eq!(
        got.incomplete_rope.is_some(),
        want.incomplete_rope.is_some(),
        "{what}"
    );
    if let (Some(g), Some(w)) = (&got.incomplete_rope, &want.incomplete_rope) {
        compare(g, w, tol).unwrap_or_else(|e| panic!("{what}: incomplete_rope: {e}"));
    }
}

#[test]
fn gpu_matches_cpu() {
    let ctx = util::ctx();
    let mut rng = Rng::new(11);
    let mut cases = 0;
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for (di, dr) in [(40, 0), (72, 24), (128, 64), (129, 2)] {
            for l in [1, 3, 17, 130] {
                let norm = rng.below(3) != 0;
                let offset = if rng.below(2) == 0 { 0.0 } else { 1.0 };
                let r = [2, 3, 4, 4, 7][rng.below(5)];
                let pasts: Vec<usize> = (0..1 + rng.below(3)).map(|_| rng.below(40)).collect();
                let p = problem(&mut rng, dt, &pasts, l, di, dr, norm, r);
                let a = QsaPrepareAttrs {
                    key_block_size: r,
                    epsilon: 1e-6,
                    norm_weight_offset: offset,
                };
                let want = cpu(&p.inputs(), &a).unwrap();
                let got = pollster::block_on(gpu(&ctx, &p.inputs(), &a)).unwrap();
                check(
                    &got,
                    &want,
                    dt,
                    &format!("{dt} di={di} dr={dr} l={l} r={r} pasts={pasts:?} norm={norm}"),
                );
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 48);
}

#[test]
fn broadcast_key_length_and_empty_outputs() {
    let ctx = util::ctx();
    let mut rng = Rng::new(5);
    // key_length [1] broadcasts; S < r gives zero block rows.
    let mut p = problem(&mut rng, DType::F32, &[0, 0], 2, 40, 8, true, 4);
    p.key_length = Tensor::from_i32(&[1], &[2]);
    let a = QsaPrepareAttrs {
        key_block_size: 4,
        epsilon: 1e-6,
        norm_weight_offset: 0.0,
    };
    let want = cpu(&p.inputs(), &a).unwrap();
    assert_eq!(want.block_index_keys.shape, vec![2, 0, 40]);
    let got = pollster::block_on(gpu(&ctx, &p.inputs(), &a)).unwrap();
    check(&got, &want, DType::F32, "broadcast");
}

#[allow(clippy::too_many_arguments)]
/// Feeds one sequence of `total` tokens in calls of the given sizes; returns the final outputs.
fn feed(
    exec_gpu: bool,
    dt: DType,
    keys: &[f32],
    cos: &[f32],
    sin: &[f32],
    w: &Tensor,
    di: usize,
    dr: usize,
    r: usize,
    splits: &[usize],
) -> QsaPrepareOutputs {
    let ctx = util::ctx();
    let a = QsaPrepareAttrs {
        key_block_size: r,
        epsilon: 1e-6,
        norm_weight_offset: 1.0,
    };
    let mut past_blocks = Tensor::zeros(dt, &[1, 0, di]);
    let mut past_inc = Tensor::zeros(dt, &[1, r - 1, di]);
    let mut past_rope = Tensor::zeros(dt, &[1, 2 * dr]);
    let mut done = 0;
    let mut last = None;
    for &l in splits {
        let raw = Tensor::from_f32(dt, &[1, l, di], &keys[done * di..(done + l) * di]);
        let c = Tensor::from_f32(dt, &[1, l, dr], &cos[done * dr..(done + l) * dr]);
        let s = Tensor::from_f32(dt, &[1, l, dr], &sin[done * dr..(done + l) * dr]);
        done += l;
        let kl = Tensor::from_i32(&[1], &[done as i32]);
        let x = QsaPrepareInputs {
            raw_index_keys: &raw,
            past_block_index_keys: &past_blocks,
            key_length: &kl,
            rope_cos: Some(&c),
            rope_sin: Some(&s),
            k_norm_weight: Some(w),
            past_incomplete_raw_keys: &past_inc,
            past_incomplete_rope: Some(&past_rope),
        };
        let out = if exec_gpu {
            pollster::block_on(gpu(&ctx, &x, &a)).unwrap()
        } else {
            cpu(&x, &a).unwrap()
        };
        past_blocks = out.block_index_keys.clone();
        past_inc = out.incomplete_raw_keys.clone();
        past_rope = out.incomplete_rope.clone().unwrap();
        last = Some(out);
    }
    last.unwrap()
}

#[test]
fn any_split_gives_the_same_block_keys() {
    let (di, dr, r, total) = (72, 16, 4, 43);
    for dt in [DType::F32, DType::BF16] {
        let mut rng = Rng::new(99);
        // Round the inputs to the type first so every split reads the same values.
        let keys = rng.tensor(dt, &[total * di]).to_f32();
        let cos = rng.tensor(dt, &[total * dr]).to_f32();
        let sin = rng.tensor(dt, &[total * dr]).to_f32();
        let w = rng.tensor(dt, &[di]);
        let one = vec![total];
        let chunks = vec![5, 1, 16, 3, 18];
        let tokens = vec![1; total];
        for exec_gpu in [false, true] {
            let base = feed(exec_gpu, dt, &keys, &cos, &sin, &w, di, dr, r, &one);
            for splits in [&chunks, &tokens] {
                let other = feed(exec_gpu, dt, &keys, &cos, &sin, &w, di, dr, r, splits);
                assert_eq!(other, base, "{dt} gpu={exec_gpu} splits={splits:?}");
            }
            assert_eq!(base.block_index_keys.shape, vec![1, total / r, di]);
        }
    }
}
