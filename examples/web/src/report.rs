//! What the demo reports: the checks of one step against the CPU reference and their tally,
//! the self-test that proves the selection check can fail, and the heat maps. Checks are a
//! list of `{name, pass, detail}`, so a later stage adds one without changing the page.

use qsa_wgpu::ops::{self, TensorMap};
use qsa_wgpu::testing::{check_topk, compare, Tol};
use qsa_wgpu::{DType, Result, Tensor};
use serde_json::{json, Value};

/// Allowed difference between GPU and CPU block scores, and the near-tie slack of a
/// selection: f32 sums of 128-term dot products in another order, or one bf16/f16 ulp in a
/// block key or query.
pub fn score_tol(dtype: DType) -> Tol {
    let (abs, rel) = match dtype {
        DType::F32 => (1e-4, 1e-4),
        DType::F16 => (4e-3, 4e-3),
        _ => (3e-2, 3e-2),
    };
    Tol { abs, rel }
}

/// The checks of every step so far.
pub struct Tally {
    tol: Tol,
    /// Block size r, for the routes.
    r: usize,
    pub rows: usize,
    pub exact: usize,
    pub near_tie: usize,
    pub failed: usize,
    pub steps: usize,
    pub routes_bad: usize,
    pub scores_bad: usize,
    pub worst_score_err: f32,
    /// Attention rows checked, steps whose output was out of tolerance, worst error.
    pub attn_rows: usize,
    pub attn_bad: usize,
    pub attn_worst: f32,
    attn_tol: Option<Tol>,
    pub failures: Vec<String>,
}

impl Tally {
    pub fn new(tol: Tol, r: usize) -> Tally {
        Tally {
            tol,
            r,
            rows: 0,
            exact: 0,
            near_tie: 0,
            failed: 0,
            steps: 0,
            routes_bad: 0,
            scores_bad: 0,
            worst_score_err: 0.0,
            attn_rows: 0,
            attn_bad: 0,
            attn_worst: 0.0,
            attn_tol: None,
            failures: Vec::new(),
        }
    }

    /// Checks one step's GPU outputs (`got`, `got_scores`) against the CPU's (`want`, with
    /// its `scores`); `positions` are the rows' query positions. Returns the step's summary.
    pub fn step(
        &mut self,
        label: &str,
        got: &TensorMap,
        got_scores: &Tensor,
        want: &TensorMap,
        positions: &[i32],
    ) -> Result<Value> {
        let tol = self.tol;
        let sel = check_topk(
            &want["scores"],
            &got["block_indices"],
            &got["block_count"],
            &want["block_indices"],
            tol,
        );
        // The routes must be what the reference makes of the GPU's own selection (equal to
        // the CPU routes wherever the selections are equal).
        let m = TensorMap::from([
            ("block_indices".into(), got["block_indices"].clone()),
            ("block_count".into(), got["block_count"].clone()),
            (
                "positions".into(),
                Tensor::from_i32(&[positions.len()], positions),
            ),
        ]);
        let a = [("ratio".to_string(), json!(self.r))].into_iter().collect();
        let routes = ops::run_cpu("expand_route", &m, &a)?;
        let routes_ok = routes["token_indices"] == got["token_indices"]
            && routes["token_count"] == got["token_count"];
        let err = max_finite_err(got_scores, &want["scores"]);

        if let Some(e) = &sel.first_failure {
            self.failures.push(format!("{label}: selection {e}"));
        }
        if !routes_ok {
            self.routes_bad += 1;
            self.failures.push(format!(
                "{label}: token routes differ from expand_route of the GPU selection"
            ));
        }
        if let Err(e) = compare(got_scores, &want["scores"], tol) {
            self.scores_bad += 1;
            self.failures.push(format!("{label}: scores {e}"));
        }
        self.steps += 1;
        self.rows += sel.rows;
        self.exact += sel.exact;
        self.near_tie += sel.tolerated;
        self.failed += sel.failed;
        self.worst_score_err = self.worst_score_err.max(err);
        Ok(json!({
            "selection": { "exact": sel.exact, "near_tie": sel.tolerated, "failed": sel.failed },
            "routes_match": routes_ok,
            "score_max_err": err,
        }))
    }

    /// Checks one step's attention output against the CPU attention over the same selection.
    pub fn attention(&mut self, label: &str, got: &Tensor, want: &Tensor, tol: Tol) {
        self.attn_rows += got.shape[0];
        self.attn_worst = self.attn_worst.max(max_finite_err(got, want));
        if let Err(e) = compare(got, want, tol) {
            self.attn_bad += 1;
            self.failures.push(format!("{label}: attention {e}"));
        }
        self.attn_tol = Some(tol);
    }

    /// The list of checks, the self-test of the selection check last.
    pub fn checks(&self, self_test: (bool, String)) -> Vec<Value> {
        let tol = self.tol;
        let (rows, exact, near, failed) = (self.rows, self.exact, self.near_tie, self.failed);
        let mut list = vec![
            check(
                "block selections (top-k) equal the CPU reference, up to near-ties",
                failed == 0,
                format!("{rows} rows: {exact} exact, {near} near-tie swaps, {failed} wrong"),
            ),
            check(
                "token routes equal expand_route of the selection",
                self.routes_bad == 0,
                format!(
                    "{} steps, {} with different routes",
                    self.steps, self.routes_bad
                ),
            ),
            check(
                "block scores equal the CPU reference within tolerance",
                self.scores_bad == 0,
                format!(
                    "worst |GPU - CPU| {:e} (abs {} + rel {})",
                    self.worst_score_err, tol.abs, tol.rel
                ),
            ),
        ];
        if let Some(t) = self.attn_tol {
            list.push(check(
                "attention output equals the CPU attention over the GPU's selection",
                self.attn_bad == 0,
                format!(
                    "{} rows, worst |GPU - CPU| {:e} (abs {} + rel {})",
                    self.attn_rows, self.attn_worst, t.abs, t.rel
                ),
            ));
        }
        list.push(check(
            "the selection check rejects a perturbed selection",
            self_test.0,
            format!("last step, {}", self_test.1),
        ));
        list
    }
}

fn check(name: &str, pass: bool, detail: String) -> Value {
    json!({ "name": name, "pass": pass, "detail": detail })
}

/// Largest |got − want| over entries finite in both.
fn max_finite_err(got: &Tensor, want: &Tensor) -> f32 {
    got.to_f32()
        .iter()
        .zip(want.to_f32())
        .filter(|(a, b)| a.is_finite() && b.is_finite())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// The selection check must be able to fail: in the widest row of the reference selection,
/// swap the last selected block for the worst unselected visible block or, when every visible
/// block is selected, swap the best and the last selected slots; the check has to reject
/// either. Returns whether it did, and what was tried.
pub fn checker_rejects_a_perturbed_selection(
    want: &TensorMap,
    rows: usize,
    tol: Tol,
) -> (bool, String) {
    let scores = want["scores"].to_f32();
    let w = scores.len() / rows.max(1);
    let k = want["block_indices"].numel() / rows.max(1);
    let mut idx = want["block_indices"].to_i32();
    let cnt = want["block_count"].to_i32();
    let visible = |r: usize| {
        scores[r * w..][..w]
            .iter()
            .filter(|v| v.is_finite())
            .count()
    };
    let Some(r) = (0..rows).max_by_key(|&r| visible(r)) else {
        return (false, "no rows".into());
    };
    let row = &scores[r * w..][..w];
    let c = cnt[r] as usize;
    if c < 2 {
        return (
            false,
            format!("row {r} selects {c} blocks: nothing to perturb"),
        );
    }
    let (first, last) = (r * k, r * k + c - 1);
    let worst = (0..w)
        .filter(|&b| row[b].is_finite() && !idx[first..=last].contains(&(b as i32)))
        .min_by(|&a, &b| row[a].total_cmp(&row[b]));
    let what = match worst {
        Some(b) => {
            let old = idx[last] as usize;
            idx[last] = b as i32;
            format!(
                "row {r}: block {old} (score {}) replaced by block {b} ({})",
                row[old], row[b]
            )
        }
        None => {
            idx.swap(first, last);
            format!("row {r}: the best and the last of {c} selected blocks swapped")
        }
    };
    let bad = Tensor::from_i32(&want["block_indices"].shape, &idx);
    let rep = check_topk(
        &want["scores"],
        &bad,
        &want["block_count"],
        &want["block_indices"],
        tol,
    );
    (rep.failed == 1, what)
}

/// One heat map: the score rows of one sequence, in query-position order (one selection
/// head, Hs = 1).
#[derive(Default)]
pub struct Heat {
    positions: Vec<usize>,
    scores: Vec<Vec<Value>>,
    selected: Vec<Vec<i64>>,
    differs: Vec<bool>,
    prefill_rows: usize,
}

impl Heat {
    /// Appends this step's rows of every sequence to its heat map: the GPU scores (null where
    /// a block is not visible), the GPU selection, and whether it differs from the CPU's.
    pub fn collect(
        heat: &mut [Heat],
        prefill: bool,
        new: &[usize],
        positions: &[i32],
        got_scores: &Tensor,
        got: &TensorMap,
        want: &TensorMap,
    ) {
        let s = got_scores.to_f32();
        let max_blocks = *got_scores.shape.last().unwrap();
        let k = *got["block_indices"].shape.last().unwrap();
        let (gi, gc) = (got["block_indices"].to_i64(), got["block_count"].to_i64());
        let wi = want["block_indices"].to_i64();
        let mut row = 0;
        for (seq, &count) in new.iter().enumerate() {
            let h = &mut heat[seq];
            for _ in 0..count {
                h.positions.push(positions[row] as usize);
                h.scores.push(
                    s[row * max_blocks..][..max_blocks]
                        .iter()
                        .map(|v| match v.is_finite() {
                            true => json!((*v as f64 * 1e4).round() / 1e4),
                            false => Value::Null,
                        })
                        .collect(),
                );
                let c = gc[row].clamp(0, k as i64) as usize;
                h.selected.push(gi[row * k..][..c].to_vec());
                h.differs.push(gi[row * k..][..k] != wi[row * k..][..k]);
                h.prefill_rows += usize::from(prefill);
                row += 1;
            }
        }
    }

    /// The map of sequence `seq`, `width` blocks wide.
    pub fn to_json(self, seq: usize, width: usize) -> Value {
        let scores: Vec<Vec<Value>> = self
            .scores
            .into_iter()
            .map(|r| r.into_iter().take(width).collect())
            .collect();
        json!({
            "sequence": seq,
            "blocks": width,
            "positions": self.positions,
            "scores": scores,
            "selected": self.selected,
            "differs": self.differs,
            "prefill_rows": self.prefill_rows,
        })
    }
}
