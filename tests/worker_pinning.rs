//! The context binds a CPU adapter's compute workers to a core each (src/gpu/pin.rs): on
//! llvmpipe with 2 to 16 usable cores (Mesa's default of one worker per core) every worker is
//! bound, each to a different core, and no other thread of the process is touched; the
//! operators still give the CPU reference's results. Linux only (elsewhere nothing is bound).

mod util;

use qsa_wgpu::ops::{self, AttrMap, Exec, TensorMap};
use qsa_wgpu::testing::Rng;
use qsa_wgpu::DType;

/// The allowed cores of the thread whose /proc directory is `dir`.
#[cfg(target_os = "linux")]
fn cpus_allowed(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string()
}

/// Each thread of the process with its allowed cores, from /proc.
#[cfg(target_os = "linux")]
fn affinities() -> Vec<(String, String)> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let name = std::fs::read_to_string(p.join("comm")).unwrap();
            (name.trim_end().to_string(), cpus_allowed(&p))
        })
        .collect()
}

#[cfg(target_os = "linux")]
#[test]
fn llvmpipe_workers_are_bound_one_per_core() {
    // The cores this thread (and every thread the process had) may use.
    let all = cpus_allowed(std::path::Path::new("/proc/thread-self"));
    assert!(affinities().iter().all(|(_, c)| *c == all));
    let ctx = util::ctx();
    let cores = std::thread::available_parallelism().unwrap().get();
    let after = affinities();
    let single: Vec<&(String, String)> = after.iter().filter(|(_, c)| *c != all).collect();
    eprintln!(
        "{} (llvmpipe {}), {cores} cores, {} bound: {single:?}",
        ctx.describe(),
        ctx.caps.llvmpipe,
        ctx.pinned_workers
    );
    // Exactly the bound workers run on other cores than the process's, one core each, all
    // different.
    assert_eq!(single.len(), ctx.pinned_workers);
    let mut seen: Vec<&str> = single.iter().map(|(_, c)| c.as_str()).collect();
    assert!(seen.iter().all(|c| c.parse::<usize>().is_ok()), "{seen:?}");
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), single.len());
    assert!(single.iter().all(|(n, _)| !n.starts_with("llvmpipe-")));
    if ctx.caps.llvmpipe
        && std::env::var_os("LP_NUM_THREADS").is_none()
        && (2..=16).contains(&cores)
    {
        assert_eq!(ctx.pinned_workers, cores, "every llvmpipe worker bound");
    }
    if !ctx.caps.llvmpipe {
        assert_eq!(ctx.pinned_workers, 0);
    }

    // The bound workers run the operators as before: block_topk against the CPU reference.
    let mut rng = Rng::new(3);
    let scores = rng.tensor(DType::F32, &[16, 1, 5000]);
    let inputs = TensorMap::from([("scores".to_string(), scores)]);
    let attrs = AttrMap::from([("k".to_string(), serde_json::json!(64))]);
    let want = ops::run_cpu("block_topk", &inputs, &attrs).unwrap();
    let got = ops::run_blocking("block_topk", &inputs, &attrs, Exec::Gpu(&ctx)).unwrap();
    assert_eq!(got["block_indices"], want["block_indices"]);
    assert_eq!(got["block_count"], want["block_count"]);
}
