//! The comparator itself: it accepts equal outputs, and rejects a perturbed one, a sentinel
//! left by a missed write, and a shape mismatch — with a report of count, worst error, index.

use qsa_wgpu::testing::{compare, transform_tol, Rng};
use qsa_wgpu::{DType, Tensor};

#[test]
fn rejects_a_perturbed_output() {
    let mut rng = Rng::new(1);
    for dt in [DType::F32, DType::F16, DType::BF16] {
        let want = rng.tensor(dt, &[17, 40]);
        compare(&want, &want, transform_tol(dt)).unwrap();
        let mut v = want.to_f32();
        v[123] = v[123] * 1.05 + 0.05;
        let got = Tensor::from_f32(dt, &want.shape, &v);
        let e = compare(&got, &want, transform_tol(dt)).unwrap_err();
        assert!(
            e.contains("1 of 680") && e.contains("index 123"),
            "{dt}: {e}"
        );
    }
}

#[test]
fn rejects_sentinel_and_shape_and_integer_differences() {
    let want = Tensor::from_f32(DType::F32, &[4], &[1.0, 2.0, 3.0, 4.0]);
    let got = Tensor::from_f32(DType::F32, &[4], &[1.0, 2.0, f32::NAN, 4.0]);
    assert!(compare(&got, &want, transform_tol(DType::F32))
        .unwrap_err()
        .contains("index 2"));
    let short = Tensor::from_f32(DType::F32, &[3], &[1.0, 2.0, 3.0]);
    assert!(compare(&short, &want, transform_tol(DType::F32)).is_err());
    let a = Tensor::from_i32(&[3], &[1, 2, 3]);
    let b = Tensor::from_i32(&[3], &[1, 2, 4]);
    assert!(compare(&a, &b, transform_tol(DType::F32)).is_err());
    let inf = Tensor::from_f32(DType::F32, &[1], &[f32::NEG_INFINITY]);
    let big = Tensor::from_f32(DType::F32, &[1], &[-1e30]);
    assert!(compare(&big, &inf, transform_tol(DType::F32)).is_err());
}
