//! The check of a GPU step against the CPU step, shared by the tests and `qsa demo --nsa`:
//! the compressed-branch output within tolerance, the selection equal up to near ties of the
//! reference's scores, and the selected branch equal to the CPU's over the *GPU's* selection
//! (when a near tie swapped a block, the CPU attends the GPU's blocks for the comparison).

use super::NsaSelector;
use crate::ops::TensorMap;
use crate::tensor::{DType, Tensor};
use crate::testing::{attention_tol, compare, compare_selection, weighted_sum_tol, Tol};

/// How a step compared with the CPU's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepCheck {
    /// Selection rows (query row, KV head) compared.
    pub rows: usize,
    /// Rows whose selection equals the reference's.
    pub exact: usize,
    /// Rows that differ only by near ties.
    pub near_ties: usize,
}

impl std::ops::AddAssign for StepCheck {
    fn add_assign(&mut self, o: StepCheck) {
        self.rows += o.rows;
        self.exact += o.exact;
        self.near_ties += o.near_ties;
    }
}

/// Near-tie tolerance of the selection scores. The scores are f32 sums of f32 probabilities,
/// but their inputs, the compressed keys, are rounded to T: where the GPU's f32 window sum
/// and the CPU's round to neighbouring T values, logits and scores move by about one unit of
/// T's last place times the query's size.
pub fn selection_tol(dt: DType) -> Tol {
    match dt {
        DType::F32 => Tol {
            abs: 1e-6,
            rel: 2e-5,
        },
        DType::F16 => Tol {
            abs: 1e-6,
            rel: 5e-4,
        },
        _ => Tol {
            abs: 1e-5,
            rel: 2e-3,
        },
    }
}

/// Tolerance of the compressed branch: its output is Σ round_T(P_j)·V_j, so the half types
/// may differ by about one unit in the last place of T (besides f32 noise).
pub fn cmp_out_tol(dt: DType) -> Tol {
    weighted_sum_tol(dt)
}

fn get<'a>(m: &'a TensorMap, side: &str, name: &str) -> Result<&'a Tensor, String> {
    m.get(name)
        .ok_or_else(|| format!("the {side} outputs have no `{name}`"))
}

/// Checks the GPU outputs `got` of a step against the CPU step's `want` (which holds the
/// `scores` it ranked). Call it before anything more is appended: where the selections differ
/// by near ties it re-runs the selected branch on the CPU ([`NsaSelector::attend_cpu`]) over
/// the GPU's selection, for the same `new_tokens` and `query`.
pub fn check_step(
    sel: &NsaSelector,
    new_tokens: &[usize],
    query: &Tensor,
    got: &TensorMap,
    want: &TensorMap,
) -> Result<StepCheck, String> {
    let dt = sel.cfg.dtype;
    let g = |n| get(got, "GPU", n);
    let w = |n| get(want, "CPU", n);
    compare(g("cmp_out")?, w("cmp_out")?, cmp_out_tol(dt)).map_err(|e| format!("cmp_out: {e}"))?;
    let scores = w("scores")?;
    let width = *scores.shape.last().unwrap_or(&1);
    let (gt, wt) = (g("topk")?, w("topk")?);
    compare_selection(gt, wt, &scores.to_f32(), width, selection_tol(dt))
        .map_err(|e| format!("topk: {e}"))?;
    let k = sel.cfg.k;
    let (gv, wv) = (gt.to_i32(), wt.to_i32());
    let rows = gv.len() / k;
    let exact = (0..rows)
        .filter(|r| gv[r * k..][..k] == wv[r * k..][..k])
        .count();
    let over_gpu;
    let reference = if exact == rows {
        want
    } else {
        over_gpu = sel
            .attend_cpu(new_tokens, query, gt)
            .map_err(|e| format!("the CPU over the GPU's selection: {e}"))?;
        &over_gpu
    };
    for name in ["token_indices", "token_count"] {
        if g(name)? != get(reference, "CPU", name)? {
            return Err(format!("{name} differs from the CPU's"));
        }
    }
    compare(g("out")?, get(reference, "CPU", "out")?, attention_tol(dt))
        .map_err(|e| format!("out: {e}"))?;
    Ok(StepCheck {
        rows,
        exact,
        near_ties: rows - exact,
    })
}
