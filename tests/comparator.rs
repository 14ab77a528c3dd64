//! The comparator itself: it accepts equal outputs, and rejects a perturbed one, a sentinel
//! left by a missed write, and a shape mismatch — with a report of count, worst error, index.

use qsa_wgpu::ops::TensorMap;
use qsa_wgpu::testing::{check_selection, compare, transform_tol, Rng, Tol};
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

/// One row: scores `[1, 1, 5]`, k = 2, r = 2, position 10 (tail 10 at the end).
fn selection(blocks: [i32; 2], tokens: [i32; 5]) -> TensorMap {
    let mut m = TensorMap::new();
    m.insert(
        "block_indices".into(),
        Tensor::from_i32(&[1, 1, 2], &blocks),
    );
    m.insert("block_count".into(), Tensor::from_i32(&[1, 1], &[2]));
    m.insert(
        "token_indices".into(),
        Tensor::from_i32(&[1, 1, 5], &tokens),
    );
    m.insert("token_count".into(), Tensor::from_i32(&[1, 1], &[5]));
    m
}

#[test]
fn selection_check_accepts_near_ties_only() {
    let mut want = selection([0, 1], [0, 1, 2, 3, 10]);
    want.insert(
        "scores".into(),
        Tensor::from_f32(
            DType::F32,
            &[1, 1, 5],
            &[5.0, 4.0, 3.9999, 1.0, f32::NEG_INFINITY],
        ),
    );
    let tol = Tol {
        abs: 1e-3,
        rel: 1e-3,
    };
    let same = check_selection(&selection([0, 1], [0, 1, 2, 3, 10]), &want, tol).unwrap();
    assert_eq!((same.exact, same.near_ties), (1, 0));
    let tie = check_selection(&selection([0, 2], [0, 1, 4, 5, 10]), &want, tol).unwrap();
    assert_eq!((tie.exact, tie.near_ties), (0, 1));
    for (blocks, tokens, why) in [
        ([0, 3], [0, 1, 6, 7, 10], "a clearly worse block"),
        ([1, 0], [2, 3, 0, 1, 10], "the wrong order"),
        ([0, 4], [0, 1, 8, 9, 10], "an invisible block"),
        ([0, 0], [0, 1, 0, 1, 10], "a repeated block"),
        (
            [0, 2],
            [0, 1, 2, 3, 10],
            "tokens that do not expand the blocks",
        ),
        ([0, 2], [0, 1, 4, 5, 9], "a wrong tail"),
    ] {
        assert!(
            check_selection(&selection(blocks, tokens), &want, tol).is_err(),
            "accepted {why}"
        );
    }
}

#[test]
fn topk_check_accepts_near_ties_only() {
    use qsa_wgpu::testing::{check_topk, Tol};
    let ninf = f32::NEG_INFINITY;
    // Two rows of 6 blocks, k = 3; row 1 sees 2 blocks only. Blocks 1 and 4 of row 0 tie
    // within the tolerance.
    let scores = Tensor::from_f32(
        DType::F32,
        &[2, 6],
        &[
            0.5, 3.0, 1.0, 0.2, 2.9999, 2.0, 1.0, 2.0, ninf, ninf, ninf, ninf,
        ],
    );
    let want = Tensor::from_i32(&[2, 3], &[1, 4, 5, 1, 0, -1]);
    let count = Tensor::from_i32(&[2], &[3, 2]);
    let tol = Tol {
        abs: 1e-3,
        rel: 1e-3,
    };
    let check = |idx: &[i32], cnt: &[i32]| {
        check_topk(
            &scores,
            &Tensor::from_i32(&[2, 3], idx),
            &Tensor::from_i32(&[2], cnt),
            &want,
            tol,
        )
    };
    let r = check_topk(&scores, &want, &count, &want, tol);
    assert_eq!((r.rows, r.exact, r.tolerated, r.failed), (2, 2, 0, 0));
    let r = check(&[4, 1, 5, 1, 0, -1], &[3, 2]);
    assert_eq!((r.exact, r.tolerated, r.failed), (1, 1, 0), "{r:?}");
    for (idx, cnt, why) in [
        (&[1, 4, 2, 1, 0, -1], &[3, 2], "below the k-th best"),
        (&[1, 1, 5, 1, 0, -1], &[3, 2], "selected twice"),
        (&[1, 5, 4, 1, 0, -1], &[3, 2], "outranks"),
        (&[1, 4, 5, 1, 2, -1], &[3, 2], "not a visible block"),
        (&[1, 4, 5, 1, 0, 3], &[3, 2], "past the count"),
        (&[1, 4, 5, 1, 0, -1], &[3, 1], "count 1, want 2"),
    ] {
        let r = check(idx, cnt);
        assert_eq!(r.failed, 1, "{idx:?} {cnt:?} passed");
        let e = r.first_failure.unwrap();
        assert!(e.contains(why), "{idx:?}: {e}");
    }
}
