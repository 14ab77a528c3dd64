//! One core per worker thread of a CPU adapter (Linux, Mesa's llvmpipe).
//!
//! llvmpipe runs compute dispatches on a pool of worker threads, one per core by default, that
//! sleep between dispatches. Left to the scheduler, two of them sometimes wake on the same core
//! and stay there for a while: on the 2-core machine of docs/perf.md a step then runs about
//! twice as long, and runs of the same step alternate between two speeds (the attention step:
//! ~1.3 or ~2.4 ms). With each worker bound to its own core the slow mode went away (docs/perf.md).
//!
//! The workers are found by what Mesa 22.3 (Debian 12) does: creating the adapter starts the
//! rasterizer threads, named `llvmpipe-0`, `llvmpipe-1`, …, then the compute workers, which
//! carry no name of their own and so show the name of the thread that created them. The
//! workers are therefore the threads that did not exist before the context was made, were
//! started after the last `llvmpipe-N`, and have the creating thread's name. They are bound
//! only when there is exactly one of them per core this thread may run on; otherwise (another
//! driver version, an `LP_NUM_THREADS` other than the core count, more cores than Mesa's
//! thread limit, a CPU quota over a wider affinity mask, contexts made at once on several
//! threads) nothing is changed.

/// A thread of this process: its id and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub tid: i32,
    pub name: String,
}

/// The compute workers among `after` (the process's threads once the adapter exists), given
/// `before` (its threads before) and `creator` (the name of the thread that made the adapter):
/// see the module's description. Sorted by id; empty when there are no `llvmpipe-N` threads.
pub fn workers(before: &[Task], after: &[Task], creator: &str) -> Vec<i32> {
    let new: Vec<&Task> = after
        .iter()
        .filter(|t| !before.iter().any(|b| b.tid == t.tid))
        .collect();
    let is_raster = |n: &str| {
        n.strip_prefix("llvmpipe-")
            .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
    };
    let Some(last) = new
        .iter()
        .filter(|t| is_raster(&t.name))
        .map(|t| t.tid)
        .max()
    else {
        return Vec::new();
    };
    let mut w: Vec<i32> = new
        .iter()
        .filter(|t| t.tid > last && t.name == creator)
        .map(|t| t.tid)
        .collect();
    w.sort_unstable();
    w
}

#[cfg(target_os = "linux")]
mod os {
    use super::Task;

    /// This process's threads, from /proc (empty where it cannot be read).
    pub fn tasks() -> Vec<Task> {
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
            return Vec::new();
        };
        dir.filter_map(|e| {
            let e = e.ok()?;
            let tid: i32 = e.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(e.path().join("comm")).ok()?;
            Some(Task {
                tid,
                name: name.trim_end().to_string(),
            })
        })
        .collect()
    }

    /// The name of the calling thread.
    pub fn own_name() -> Option<String> {
        std::fs::read_to_string("/proc/thread-self/comm")
            .ok()
            .map(|s| s.trim_end().to_string())
    }

    /// The cores the calling thread may run on.
    pub fn allowed_cpus() -> Vec<usize> {
        // SAFETY: `set` is a plain bit set that sched_getaffinity fills; the size passed is its
        // own.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return Vec::new();
            }
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    }

    /// Binds thread `tid` of this process to core `cpu`.
    pub fn bind(tid: i32, cpu: usize) -> bool {
        // SAFETY: as above; sched_setaffinity only reads `set`, and a thread id that has gone
        // away gives an error, not undefined behaviour.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }
}

/// What [`bind_new_workers`] needs from before the adapter was made.
pub struct Before {
    #[cfg(target_os = "linux")]
    tasks: Vec<Task>,
    #[cfg(target_os = "linux")]
    name: Option<String>,
}

/// Notes the process's threads; call before creating the instance and adapter.
pub fn before() -> Before {
    Before {
        #[cfg(target_os = "linux")]
        tasks: os::tasks(),
        #[cfg(target_os = "linux")]
        name: os::own_name(),
    }
}

/// What [`bind_new_workers`] found and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pinning {
    /// The compute workers the adapter started (0 where none were found: another driver,
    /// another platform, or Mesa running single-threaded).
    pub workers: usize,
    /// The cores the creating thread may run on (its affinity mask; 0 where not read).
    pub cores: usize,
    /// How many of the workers were bound to a core each (0 where nothing was changed).
    pub bound: usize,
}

impl Pinning {
    /// One line for `qsa info`: what was found and bound.
    pub fn describe(&self) -> String {
        if self.workers == 0 {
            "none found (left to the scheduler)".to_string()
        } else if self.bound > 0 {
            format!(
                "{} of {} bound to a core each ({} cores in the affinity mask)",
                self.bound, self.workers, self.cores
            )
        } else {
            format!(
                "{} left to the scheduler ({} cores in the affinity mask; bound only at one \
                 worker per core)",
                self.workers, self.cores
            )
        }
    }
}

/// Binds the compute workers started since `b`, one per core, where there is one per core
/// this thread may use; says what it found and how many it bound.
pub fn bind_new_workers(b: &Before) -> Pinning {
    #[cfg(target_os = "linux")]
    {
        let Some(name) = &b.name else {
            return Pinning::default();
        };
        let w = workers(&b.tasks, &os::tasks(), name);
        let cpus = os::allowed_cpus();
        let mut p = Pinning {
            workers: w.len(),
            cores: cpus.len(),
            bound: 0,
        };
        if w.len() < 2 || w.len() != cpus.len() {
            log::debug!(
                "llvmpipe workers {w:?} on {} cores: left to the scheduler",
                cpus.len()
            );
            return p;
        }
        p.bound = w
            .iter()
            .zip(&cpus)
            .filter(|&(&t, &c)| os::bind(t, c))
            .count();
        log::debug!(
            "llvmpipe workers {w:?} bound to cores {cpus:?} ({} bound)",
            p.bound
        );
        p
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = b;
        Pinning::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(tid: i32, name: &str) -> Task {
        Task {
            tid,
            name: name.into(),
        }
    }

    #[test]
    fn describes_what_it_found() {
        let p = |workers, cores, bound| Pinning {
            workers,
            cores,
            bound,
        };
        assert_eq!(
            p(2, 2, 2).describe(),
            "2 of 2 bound to a core each (2 cores in the affinity mask)"
        );
        assert_eq!(
            p(16, 64, 0).describe(),
            "16 left to the scheduler (64 cores in the affinity mask; bound only at one worker \
             per core)"
        );
        assert_eq!(p(0, 2, 0).describe(), "none found (left to the scheduler)");
    }

    #[test]
    fn finds_the_unnamed_threads_started_after_the_rasterizers() {
        let before = vec![t(100, "main"), t(101, "main")];
        // Lavapipe: a queue thread, the rasterizers, two workers, the disk cache; a thread of
        // another part of the program with its own name.
        let after = vec![
            t(100, "main"),
            t(101, "main"),
            t(102, "main"),
            t(103, "llvmpipe-0"),
            t(104, "llvmpipe-1"),
            t(106, "main"),
            t(105, "main"),
            t(107, "main:disk$0"),
            t(108, "worker"),
        ];
        assert_eq!(workers(&before, &after, "main"), vec![105, 106]);
        // Threads that existed before are never taken, whatever their ids.
        let before = vec![t(100, "main"), t(106, "main")];
        assert_eq!(workers(&before, &after, "main"), vec![105]);
        // No rasterizer threads (another driver): nothing.
        let after = vec![t(100, "main"), t(110, "main"), t(111, "main")];
        assert_eq!(workers(&[], &after, "main"), Vec::<i32>::new());
        // A name that only starts like a rasterizer's does not count as one.
        let after = vec![t(100, "llvmpipe-x"), t(110, "main")];
        assert_eq!(workers(&[], &after, "main"), Vec::<i32>::new());
    }
}
