//! The context binds a CPU adapter's compute workers to a core each (src/gpu/pin.rs): on
//! llvmpipe, when Mesa started one rasterizer thread (and so one compute worker) per core the
//! process may run on, 2 to 16 of them, every worker is bound, each to a different core, and
//! no other thread of the process is touched. Where the counts differ (a machine whose cores
//! are limited by a CPU quota rather than by the affinity mask, or more cores than Mesa's
//! thread limit) nothing is bound. The operators still give the CPU reference's results.
//! Linux only (elsewhere nothing is bound).

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

/// How many cores a /proc `Cpus_allowed_list` ("0-3,8,10-11") names.
#[cfg(target_os = "linux")]
fn count_cpus(list: &str) -> usize {
    list.split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => {
                r.parse::<usize>().unwrap();
                1
            }
        })
        .sum()
}

#[cfg(target_os = "linux")]
#[test]
fn cpu_lists_are_counted() {
    assert_eq!(count_cpus("0"), 1);
    assert_eq!(count_cpus("0-1"), 2);
    assert_eq!(count_cpus("0-3,8,10-11"), 7);
}

#[cfg(target_os = "linux")]
#[test]
fn llvmpipe_workers_are_bound_one_per_core() {
    // The cores this thread (and every thread the process had) may use.
    let all = cpus_allowed(std::path::Path::new("/proc/thread-self"));
    let before = affinities();
    assert!(before.iter().all(|(_, c)| *c == all));
    let ctx = util::ctx();
    let cores = count_cpus(&all);
    let after = affinities();
    // Mesa's rasterizer threads, one per worker it starts.
    let rasterizers = after
        .iter()
        .filter(|(n, _)| {
            n.strip_prefix("llvmpipe-")
                .is_some_and(|i| i.parse::<u32>().is_ok())
        })
        .count()
        - before
            .iter()
            .filter(|(n, _)| n.starts_with("llvmpipe-"))
            .count();
    // Threads bound to one core other than the process's set. (Under a narrowed mask, as with
    // `taskset -c 0`, Mesa's disk-cache thread widens its own to every core; it is not ours.)
    let single: Vec<&(String, String)> = after
        .iter()
        .filter(|(_, c)| *c != all && c.parse::<usize>().is_ok())
        .collect();
    let widened = after
        .iter()
        .filter(|(_, c)| *c != all && c.parse::<usize>().is_err());
    assert!(
        widened.clone().all(|(_, c)| count_cpus(c) > cores),
        "{after:?}"
    );
    eprintln!(
        "{} (llvmpipe {}), {cores} cores allowed ({all}), {rasterizers} rasterizer threads, \
         {} bound: {single:?}",
        ctx.describe(),
        ctx.caps.llvmpipe,
        ctx.pinning.bound
    );
    // Exactly the bound workers run on one core other than the process's set, all different;
    // no thread was narrowed otherwise.
    assert_eq!(single.len(), ctx.pinning.bound);
    assert!(widened.clone().all(|(n, _)| !n.starts_with("llvmpipe")));
    let mut seen: Vec<&str> = single.iter().map(|(_, c)| c.as_str()).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), single.len());
    assert!(single.iter().all(|(n, _)| !n.starts_with("llvmpipe-")));
    // The context found Mesa's workers (one per rasterizer thread) and the mask's cores.
    if ctx.caps.llvmpipe {
        assert_eq!(ctx.pinning.workers, rasterizers, "{:?}", ctx.pinning);
        assert_eq!(ctx.pinning.cores, cores, "{:?}", ctx.pinning);
    } else {
        assert_eq!(ctx.pinning, Default::default());
    }
    if ctx.caps.llvmpipe && (2..=16).contains(&cores) && rasterizers == cores {
        assert_eq!(ctx.pinning.bound, cores, "every llvmpipe worker bound");
    }
    if !ctx.caps.llvmpipe || rasterizers != cores {
        assert_eq!(ctx.pinning.bound, 0, "nothing bound");
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
