//! expand_route: GPU against the CPU reference (exact), a hand-checked case, invisible blocks,
//! more rows than one grid dimension.

mod util;

use qsa_wgpu::ops::expand_route::{cpu, gpu, ExpandRouteInputs};
use qsa_wgpu::testing::Rng;
use qsa_wgpu::Tensor;

#[test]
fn by_hand() {
    // r = 4, k = 2, position 9: vis = 2, tail = 8, 9. Selection [1, 0] counted 2; a second
    // group selected only block 0.
    let idx = Tensor::from_i32(&[1, 2, 2], &[1, 0, 0, -1]);
    let cnt = Tensor::from_i32(&[1, 2], &[2, 1]);
    let pos = Tensor::from_i32(&[1], &[9]);
    let x = ExpandRouteInputs {
        block_indices: &idx,
        block_count: &cnt,
        positions: &pos,
    };
    let want_tok = vec![
        4, 5, 6, 7, 0, 1, 2, 3, 8, 9, -1, 0, 1, 2, 3, 8, 9, -1, -1, -1, -1, -1,
    ];
    let out = cpu(&x, 4).unwrap();
    assert_eq!(out.token_indices.to_i32(), want_tok);
    assert_eq!(out.token_count.to_i32(), vec![10, 6]);
    assert_eq!(pollster::block_on(gpu(&util::ctx(), &x, 4)).unwrap(), out);
}

#[test]
fn gpu_matches_cpu() {
    let ctx = util::ctx();
    let mut rng = Rng::new(17);
    for r in [1, 2, 4, 7] {
        for (t, hs, k) in [(1, 1, 1), (13, 2, 5), (40, 1, 64), (3, 4, 2048)] {
            let mut idx = vec![-1i32; t * hs * k];
            let mut cnt = vec![0i32; t * hs];
            let mut pos = vec![0i32; t];
            for ti in 0..t {
                let p = rng.below(9000);
                pos[ti] = p as i32;
                let vis = (p + 1) / r;
                for g in 0..hs {
                    let c = k.min(vis).min(rng.below(k + 1));
                    let perm = rng.permutation(vis.max(1));
                    for j in 0..c {
                        idx[(ti * hs + g) * k + j] = perm[j] as i32;
                    }
                    cnt[ti * hs + g] = c as i32;
                }
            }
            same_on_gpu(&ctx, [t, hs, k], &idx, &cnt, &pos, r);
        }
    }
}

#[test]
fn invisible_block_is_an_error() {
    let idx = Tensor::from_i32(&[1, 1, 1], &[2]);
    let cnt = Tensor::from_i32(&[1, 1], &[1]);
    let pos = Tensor::from_i32(&[1], &[9]);
    let x = ExpandRouteInputs {
        block_indices: &idx,
        block_count: &cnt,
        positions: &pos,
    };
    let e = cpu(&x, 4).unwrap_err().to_string();
    assert!(
        e.contains("expand_route") && e.contains("block_indices") && e.contains("block 2"),
        "{e}"
    );
    let cnt = Tensor::from_i32(&[1, 1], &[2]);
    let x = ExpandRouteInputs {
        block_indices: &idx,
        block_count: &cnt,
        positions: &pos,
    };
    let e = pollster::block_on(gpu(&util::ctx(), &x, 4))
        .unwrap_err()
        .to_string();
    assert!(e.contains("block_count") && e.contains("2"), "{e}");
}

#[test]
fn more_rows_than_one_grid_dimension() {
    // 66,000 rows > 65,535 workgroups per dimension (one workgroup per row): the dispatch is
    // split over x and y and every row is still written.
    let mut rng = Rng::new(29);
    let (t, hs, k, r) = (33_000, 2, 2, 2);
    let mut idx = vec![-1i32; t * hs * k];
    let mut cnt = vec![0i32; t * hs];
    let pos: Vec<i32> = (0..t).map(|_| rng.below(40) as i32).collect();
    for ti in 0..t {
        let vis = (pos[ti] as usize + 1) / r;
        for g in 0..hs {
            let c = k.min(vis).min(rng.below(k + 1));
            for j in 0..c {
                idx[(ti * hs + g) * k + j] = (vis - 1 - j) as i32;
            }
            cnt[ti * hs + g] = c as i32;
        }
    }
    same_on_gpu(&util::ctx(), [t, hs, k], &idx, &cnt, &pos, r);
}

/// Expands the selection on the GPU and on the CPU and asserts they are equal.
fn same_on_gpu(
    ctx: &qsa_wgpu::gpu::Context,
    [t, hs, k]: [usize; 3],
    idx: &[i32],
    cnt: &[i32],
    pos: &[i32],
    r: usize,
) {
    let (bi, bc, bp) = (
        Tensor::from_i32(&[t, hs, k], idx),
        Tensor::from_i32(&[t, hs], cnt),
        Tensor::from_i32(&[t], pos),
    );
    let x = ExpandRouteInputs {
        block_indices: &bi,
        block_count: &bc,
        positions: &bp,
    };
    let want = cpu(&x, r).unwrap();
    assert_eq!(
        pollster::block_on(gpu(ctx, &x, r)).unwrap(),
        want,
        "r={r} t={t} hs={hs} k={k}"
    );
}
