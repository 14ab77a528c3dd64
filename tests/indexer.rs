//! The orchestrated step: one submission of compress → query → score → top-k → expand equals
//! the composition of the CPU operators, over a chunked prefill and decode rows mixed in a
//! ragged batch; after the first step no pipeline is built.

mod util;

use qsa_wgpu::indexer::{IndexerConfig, QsaIndexer};
use qsa_wgpu::testing::Rng;
use qsa_wgpu::DType;

#[test]
fn step_equals_cpu_composition() {
    let ctx = util::ctx();
    let mut rng = Rng::new(12);
    for hs in [1, 2] {
        let cfg = IndexerConfig {
            hi: 4,
            di: 40,
            dr: 16,
            r: 4,
            k: 8,
            hs,
            page_size: 16,
            dtype: DType::F32,
            epsilon: 1e-6,
            k_norm_offset: 1.0,
            q_norm_offset: 0.0,
            scale: None,
            max_len: 400,
            max_seqs: 3,
        };
        let pages = 3 * 400usize.div_ceil(16);
        let k_norm = rng.tensor(DType::F32, &[40]);
        let q_norm = rng.tensor(DType::F32, &[40]);
        let mut ix = QsaIndexer::new(
            ctx.clone(),
            cfg.clone(),
            k_norm,
            q_norm,
            rng.permutation(pages),
        )
        .unwrap();
        for _ in 0..3 {
            ix.add_sequence().unwrap();
        }
        // Prefill chunks of different sizes per sequence, then decode rows (one sequence idle).
        let steps: Vec<Vec<usize>> = vec![
            vec![37, 64, 5],
            vec![64, 0, 61],
            vec![1, 1, 1],
            vec![1, 0, 1],
            vec![2, 1, 1],
        ];
        let mut after_first = 0;
        for (i, step) in steps.iter().enumerate() {
            for (s, &cnt) in step.iter().enumerate() {
                ix.append_keys(s, &rng.normals(cnt * 40)).unwrap();
            }
            let t: usize = step.iter().sum();
            let q = rng.tensor(DType::F32, &[t, 4, 40]);
            let out = pollster::block_on(ix.step(step, &q)).unwrap();
            let got = pollster::block_on(out.read(&ctx)).unwrap();
            let want = ix.step_cpu(step, &q).unwrap();
            for name in [
                "block_indices",
                "block_count",
                "token_indices",
                "token_count",
            ] {
                assert_eq!(got[name], want[name], "hs={hs} step {i}: {name}");
            }
            if i == 0 {
                after_first = ix.pipelines_created();
            }
        }
        assert_eq!(
            ix.pipelines_created(),
            after_first,
            "a pipeline was built after the first step"
        );
    }
}
