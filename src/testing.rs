//! Helpers shared by the tests, the demo and the bench: a seeded generator for synthetic
//! data, the comparator that checks a GPU output against the CPU reference, and scratch
//! directories for the tests that write files.

use crate::tensor::{DType, Tensor};

/// A scratch directory for one test, removed with its files when dropped (also when the test
/// panics), so that test runs leave nothing behind in the system's temporary directory.
#[cfg(not(target_arch = "wasm32"))]
pub struct ScratchDir(std::path::PathBuf);

#[cfg(not(target_arch = "wasm32"))]
impl ScratchDir {
    /// A new empty directory `qsa-{name}-{process}-{n}` in the temporary directory; `n` keeps
    /// the directories of tests running at once in one process apart.
    pub fn new(name: &str) -> ScratchDir {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("qsa-{name}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        ScratchDir(dir)
    }

    /// The path of `file` inside the directory.
    pub fn file(&self, file: &str) -> std::path::PathBuf {
        self.0.join(file)
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

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

/// Tolerance on block scores computed from keys and queries stored as `dtype` (used to accept
/// a near tie that the rounding of one block key flipped).
pub fn score_tol(dtype: DType) -> Tol {
    match dtype {
        DType::F32 => Tol {
            abs: 1e-5,
            rel: 1e-5,
        },
        DType::F16 => Tol {
            abs: 4e-3,
            rel: 4e-3,
        },
        _ => Tol {
            abs: 3e-2,
            rel: 3e-2,
        },
    }
}

/// How a selection compared with the reference's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SelectionCheck {
    /// Rows `(t, g)` compared.
    pub rows: usize,
    /// Rows equal to the reference.
    pub exact: usize,
    /// Rows that differ only by near ties.
    pub near_ties: usize,
}

/// Checks a selection (`block_indices`, `block_count`, `token_indices`, `token_count`) against
/// the reference's, which also holds the `scores [T, Hs, W]` it selected from. A row passes if
/// it equals the reference, or if it differs only by near ties: the same count; distinct
/// blocks, each visible, whose reference scores *in the order chosen* match the reference's
/// selected scores position by position within `tol`; −1 after them; and its token row is the
/// expansion of those blocks followed by the reference's tail.
pub fn check_selection(
    got: &crate::ops::TensorMap,
    want: &crate::ops::TensorMap,
    tol: Tol,
) -> Result<SelectionCheck, String> {
    let get = |m: &crate::ops::TensorMap, name: &str| {
        m.get(name)
            .map(|t| (t.shape.clone(), t.to_i32()))
            .ok_or_else(|| format!("missing output {name}"))
    };
    let (shape, bi_g) = get(got, "block_indices")?;
    let (_, bi_w) = get(want, "block_indices")?;
    for name in [
        "block_indices",
        "block_count",
        "token_indices",
        "token_count",
    ] {
        let (a, b) = (get(got, name)?, get(want, name)?);
        if a.0 != b.0 {
            return Err(format!("{name}: shape {:?}, reference {:?}", a.0, b.0));
        }
    }
    let (_, bc) = get(got, "block_count")?;
    let (_, bc_w) = get(want, "block_count")?;
    let (tshape, ti_g) = get(got, "token_indices")?;
    let (_, ti_w) = get(want, "token_indices")?;
    let (_, tc) = get(got, "token_count")?;
    let (_, tc_w) = get(want, "token_count")?;
    let scores = want.get("scores").ok_or("the reference has no scores")?;
    let (k, width) = (shape[2], tshape[2]);
    let w = scores.shape[2];
    let r = (width + 1) / (k + 1);
    let sc = scores.to_f32();
    let mut out = SelectionCheck {
        rows: bc.len(),
        ..Default::default()
    };
    for row in 0..bc.len() {
        let (bs, ts) = (row * k..row * k + k, row * width..row * width + width);
        if bc[row] != bc_w[row] || tc[row] != tc_w[row] {
            return Err(format!(
                "row {row}: block_count {} / token_count {}, reference {} / {}",
                bc[row], tc[row], bc_w[row], tc_w[row]
            ));
        }
        if bi_g[bs.clone()] == bi_w[bs.clone()] && ti_g[ts.clone()] == ti_w[ts.clone()] {
            out.exact += 1;
            continue;
        }
        // The blocks: equal slot by slot, or near ties (compare_selection's rule); then the
        // token row must expand them.
        let n = bc[row].max(0) as usize;
        let one = |v: &[i32]| Tensor::from_i32(&[1, k], v);
        compare_selection(
            &one(&bi_g[bs.clone()]),
            &one(&bi_w[bs.clone()]),
            &sc[row * w..(row + 1) * w],
            w,
            tol,
        )
        .map_err(|e| format!("row {row}: {e}"))?;
        for (s, &b) in bi_g[bs].iter().enumerate().take(n) {
            for j in 0..r {
                if ti_g[row * width + s * r + j] != b * r as i32 + j as i32 {
                    return Err(format!(
                        "row {row}: token_indices do not expand block {b} at slot {s}"
                    ));
                }
            }
        }
        if ti_g[row * width + n * r..row * width + width]
            != ti_w[row * width + n * r..row * width + width]
        {
            return Err(format!("row {row}: token_indices tail differs"));
        }
        out.near_ties += 1;
    }
    Ok(out)
}

/// Compares two selections `[rows, k]` i32 (−1 = unused slot) that were ranked from scores
/// near `scores` (`[rows, w]` f32, the reference's). Slot by slot the indices must be equal,
/// except where the reference scores of the two picks are both finite and within `tol` of each
/// other: a near tie that f32 rounding may order either way. Unused slots must coincide, picks
/// must lie in `0 … w − 1` and be distinct within a row. Returns the number of accepted
/// near-tie differences.
pub fn compare_selection(
    got: &Tensor,
    want: &Tensor,
    scores: &[f32],
    w: usize,
    tol: Tol,
) -> Result<usize, String> {
    if got.shape != want.shape || got.dtype != DType::I32 || want.dtype != DType::I32 {
        return Err(format!(
            "shape/type differ: got {:?} {}, want {:?} {}",
            got.shape, got.dtype, want.shape, want.dtype
        ));
    }
    let k = *got.shape.last().unwrap_or(&1);
    let (g, v) = (got.to_i32(), want.to_i32());
    if scores.len() != g.len() / k.max(1) * w {
        return Err(format!(
            "{} scores for {} rows of width {w}",
            scores.len(),
            g.len() / k.max(1)
        ));
    }
    let mut accepted = 0;
    for (row, (gr, wr)) in g.chunks(k.max(1)).zip(v.chunks(k.max(1))).enumerate() {
        let srow = &scores[row * w..][..w];
        for (slot, (&a, &b)) in gr.iter().zip(wr).enumerate() {
            let at = format!("row {row}, slot {slot}: got {a}, want {b}");
            if a < -1 || a >= w as i32 || (a >= 0 && gr[..slot].contains(&a)) {
                return Err(format!("{at}: out of range or repeated; row {gr:?}"));
            }
            if a == b {
                continue;
            }
            if a < 0 || b < 0 {
                return Err(format!("{at}: used and unused slots differ"));
            }
            let (sa, sb) = (srow[a as usize], srow[b as usize]);
            if !sa.is_finite() || !sb.is_finite() || (sa - sb).abs() > tol.abs + tol.rel * sb.abs()
            {
                return Err(format!(
                    "{at}: reference scores {sa} and {sb} are not a near tie"
                ));
            }
            accepted += 1;
        }
    }
    Ok(accepted)
}

/// Tolerance for outputs that are f32 weighted sums of inputs stored as `dtype`, rounded to it
/// once (NSA's compressed windows and its compressed-branch output): f32 noise, or about one
/// unit in the last place of the half types.
pub fn weighted_sum_tol(dtype: DType) -> Tol {
    match dtype {
        DType::F32 => Tol {
            abs: 2e-5,
            rel: 1e-4,
        },
        DType::F16 => Tol {
            abs: 4e-3,
            rel: 2e-3,
        },
        _ => Tol {
            abs: 3e-2,
            rel: 1.6e-2,
        },
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

/// Rows of a top-k selection judged against reference scores by [`check_topk`].
#[derive(Clone, Debug, Default)]
pub struct TopkReport {
    pub rows: usize,
    /// Equal to the reference selection, slot for slot.
    pub exact: usize,
    /// Different, but only among near-ties: accepted.
    pub tolerated: usize,
    pub failed: usize,
    /// What was wrong with the first failed row.
    pub first_failure: Option<String>,
}

/// Judges a selection (`got_indices [.., k]`, `got_count [..]`, as `block_topk` writes them)
/// against the reference `scores [.., w]` and the reference selection `want_indices`. A row
/// that differs from the reference is accepted when the difference can only come from
/// near-ties: it selects `min(k, visible)` distinct visible blocks, pads with −1, keeps
/// descending score order, and every selected block scores at least the reference k-th best
/// minus `tol` (so a 1-ulp difference in a block key may swap two tied blocks, but a clearly
/// worse block is rejected).
pub fn check_topk(
    scores: &Tensor,
    got_indices: &Tensor,
    got_count: &Tensor,
    want_indices: &Tensor,
    tol: Tol,
) -> TopkReport {
    let w = *scores.shape.last().unwrap_or(&0);
    let k = *got_indices.shape.last().unwrap_or(&0);
    let (s, got, cnt, want) = (
        scores.to_f32(),
        got_indices.to_i64(),
        got_count.to_i64(),
        want_indices.to_i64(),
    );
    let rows = cnt.len();
    let mut rep = TopkReport {
        rows,
        ..Default::default()
    };
    if w == 0 || s.len() != rows * w || got.len() != rows * k || want.len() != rows * k {
        rep.failed = rows.max(1);
        rep.first_failure = Some(format!(
            "shapes disagree: scores {:?}, indices {:?}, count {:?}, reference {:?}",
            scores.shape, got_indices.shape, got_count.shape, want_indices.shape
        ));
        return rep;
    }
    for r in 0..rows {
        let row = &s[r * w..][..w];
        let (g, want) = (&got[r * k..][..k], &want[r * k..][..k]);
        let mut visible: Vec<f32> = row
            .iter()
            .copied()
            .filter(|v| *v != f32::NEG_INFINITY)
            .collect();
        visible.sort_by(|a, b| b.total_cmp(a));
        let kk = k.min(visible.len());
        if g == want && cnt[r] == kk as i64 {
            rep.exact += 1;
            continue;
        }
        match near_tie_only(row, g, cnt[r], kk, &visible, tol) {
            Ok(()) => rep.tolerated += 1,
            Err(e) => {
                rep.failed += 1;
                if rep.first_failure.is_none() {
                    rep.first_failure = Some(format!("row {r}: {e}"));
                }
            }
        }
    }
    rep
}

fn near_tie_only(
    row: &[f32],
    g: &[i64],
    count: i64,
    kk: usize,
    visible: &[f32],
    tol: Tol,
) -> Result<(), String> {
    if count != kk as i64 {
        return Err(format!("count {count}, want {kk}"));
    }
    if let Some(slot) = g[kk..].iter().position(|&c| c != -1) {
        return Err(format!(
            "slot {} is {} past the count, want -1",
            kk + slot,
            g[kk + slot]
        ));
    }
    let slack = |v: f32| tol.abs + tol.rel * v.abs();
    let kth = if kk > 0 { visible[kk - 1] } else { 0.0 };
    let mut prev = f32::INFINITY;
    for (slot, &c) in g[..kk].iter().enumerate() {
        let v = usize::try_from(c)
            .ok()
            .and_then(|c| row.get(c))
            .copied()
            .filter(|v| *v != f32::NEG_INFINITY)
            .ok_or_else(|| format!("slot {slot} holds {c}, not a visible block"))?;
        if g[..slot].contains(&c) {
            return Err(format!("block {c} selected twice"));
        }
        if v < kth - slack(kth) {
            return Err(format!("block {c} scores {v}, below the k-th best {kth}"));
        }
        if v > prev + slack(prev) {
            return Err(format!(
                "slot {slot} (block {c}, {v}) outranks slot {}",
                slot - 1
            ));
        }
        prev = v;
    }
    Ok(())
}
