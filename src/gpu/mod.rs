//! The GPU context: adapter choice, limits negotiated once, features kept for operator
//! variants, and the wrappers that turn wgpu errors into [`Error`]s instead of panics.

mod buffers;
mod cache;
mod copy;
pub mod pin;
mod texture;
mod timer;

pub use buffers::{GpuTensor, Readback};
pub use cache::{BindingKind, CachedPipeline, PipelineCache, PipelineKey};
#[cfg(not(target_arch = "wasm32"))]
pub use copy::ClockHold;
pub use copy::{roofline, BenchCopyParams, Roofline};
pub use texture::{WordTexture, TEX_WIDTH};
pub use timer::Timer;

use crate::error::{Error, Result};
use crate::shaders::ShaderTarget;
use std::sync::Arc;

/// How to pick the adapter.
#[derive(Clone, Debug, Default)]
pub struct ContextOptions {
    /// Backends to consider, e.g. `"vulkan"`, `"gl"`, `"metal,dx12"`. `None` honours
    /// `WGPU_BACKEND` and otherwise takes every backend wgpu was built with.
    pub backends: Option<String>,
    /// Never choose an operator's subgroup variant (the portable kernels run instead).
    pub disable_subgroups: bool,
    /// Never read from texture copies of buffers (the indexer's scoring then reads its index
    /// queries and block keys from their buffers, as the standalone `block_score` does, and
    /// `nsa_compress_attention` its K and V).
    pub disable_textures: bool,
    /// Never load 32 bytes per invocation through 64-bit integer words (the NSA and attention
    /// subgroup variants then load 16-byte words, as on adapters without 64-bit integers).
    pub disable_wide_loads: bool,
    /// Leave a CPU adapter's compute workers to the scheduler instead of binding each to its
    /// own core (Linux, Mesa's llvmpipe: [`pin`]).
    pub disable_thread_pinning: bool,
    /// Spread a few wide top-k rows over many workgroups (`block_topk`'s split kernels,
    /// [`Capabilities::split_topk`]). Off by default: faster on the H200, but the whole test
    /// suite has not yet passed with it there (docs/perf.md, "On a real GPU").
    pub split_topk: bool,
    /// Run `nsa_compress_attention`'s logits and values stages as their GPU-shaped kernels
    /// ([`Capabilities::gpu_nsa`]). Off by default: they are built for a GPU's many threads
    /// and have not yet run on one (docs/perf.md, "On a real GPU").
    pub gpu_nsa: bool,
    /// Score every row in one-row tiles, prefill included ([`Capabilities::one_row_scores`]).
    /// Off by default: meant for GPUs and not yet measured on one.
    pub one_row_scores: bool,
    /// Keep the indexer's compress and query preparation in two dispatches (see
    /// [`Capabilities::fused_prepare`]).
    pub disable_fused_prepare: bool,
}

/// Storage buffers of `qsa_compress_query.wgsl`, the indexer's compress and query preparation
/// in one dispatch: an adapter must allow that many per shader stage for it.
pub const FUSED_PREPARE_BUFFERS: u32 = 13;

/// Adapter features an operator may choose a variant by.
#[derive(Clone, Copy, Debug, Default)]
pub struct Capabilities {
    pub shader_f16: bool,
    pub subgroups: bool,
    pub timestamps: bool,
    /// The subgroup size when subgroups are enabled and the adapter reports one fixed size
    /// (lavapipe: 8 lanes at 256-bit SIMD), which subgroup variants are specialised for.
    pub subgroup_size: Option<u32>,
    /// Mesa's llvmpipe (behind lavapipe and its GL), which ends every loop of an invocation
    /// after 65535 iterations: operators refuse sizes that could reach that.
    pub llvmpipe: bool,
    /// Whether the indexer keeps texture copies of its index queries and block keys and scores
    /// from them, and `nsa_compress_attention`'s subgroup variants read texture copies of K and
    /// V (the NSA selector keeps them of its compressed caches): on every adapter but a discrete GPU (llvmpipe counts as a CPU adapter
    /// whatever type a backend reports for it), unless
    /// [`ContextOptions::disable_textures`]. Texel fetches are the faster loads on llvmpipe;
    /// on the H200 the storage reads were faster (bf16 decode score 0.031 → 0.025 ms, prefill
    /// f32 1.96 → 1.80 ms without textures; docs/perf.md).
    pub textures: bool,
    /// Whether subgroup variants may load 32 bytes per invocation as a `vec4<u64>`: natively,
    /// where the adapter has 64-bit integers in shaders (wgpu's `SHADER_INT64`), except on a
    /// discrete GPU and unless [`ContextOptions::disable_wide_loads`]. On llvmpipe a load is
    /// a loop over the SIMD lanes per component, so four 64-bit components move twice the
    /// bytes of four 32-bit ones for about the same cost; on the H200's 32 lanes the wider
    /// words left lanes idle (bf16 attention partial pass 0.070 against 0.044 ms;
    /// docs/perf.md). Neither this nor `textures` can be forced on where they are off: on a
    /// discrete GPU those kernels are left untaken (the tests cover them on CPU adapters).
    pub wide_loads: bool,
    /// Whether `block_topk` spreads a few wide rows (decode) over many workgroups, two
    /// dispatches (`block_topk_split.wgsl`), instead of one workgroup per row: where
    /// [`ContextOptions::split_topk`] asks for it. Meant for GPUs (on the H200 the decode
    /// top-k went from 0.086 to 0.065 ms); on a CPU adapter a workgroup is one thread and one
    /// per row already keeps the cores busy.
    pub split_topk: bool,
    /// Whether `nsa_compress_attention` (and the NSA selector's step) runs its logits and
    /// values stages as the GPU-shaped kernels (`nsa_compress_attention_gpu.wgsl`,
    /// `…_values_gpu.wgsl`): where [`ContextOptions::gpu_nsa`] asks for it, on any adapter. A
    /// workgroup per 256 compressed tokens with one token per invocation, and one per part of
    /// each values split, where the portable kernels and their subgroup variants have 64
    /// invocations of 16 tokens (or 16 channels × 16 heads) each, a shape for llvmpipe's
    /// 8-lane SIMD threads: at nsa-decode 128 + 128 workgroups instead of 32 + 16, on a GPU with
    /// over a hundred multiprocessors. Same results within the operator's tolerances (the sums
    /// run in another order).
    pub gpu_nsa: bool,
    /// Whether `block_score` (and the indexer's score stage) tiles every call in one-row
    /// tiles (`Tiling::OneRow`: a workgroup per row and 1024 blocks, each invocation 16 blocks
    /// × 4 heads) instead of 24-row tiles for prefill: where
    /// [`ContextOptions::one_row_scores`] asks for it. The row tiles keep 24 rows × 16 blocks
    /// of dot products per invocation, which suits llvmpipe's SIMD threads (each key read once
    /// for 24 rows) but spills on a GPU, where the 8K prefill's score ran at a sixth of the
    /// H200's multiply-add rate. Both tilings give the same scores bit for bit.
    pub one_row_scores: bool,
    /// Whether the indexer runs the compress of a step's blocks and the preparation of its
    /// index queries in one dispatch (`qsa_compress_query.wgsl`; each workgroup runs one
    /// operator's kernel, the same results): where the adapter allows
    /// [`FUSED_PREPARE_BUFFERS`] storage buffers per stage (WebGPU's default is 8), the word
    /// kernel of the query preparation applies, and unless
    /// [`ContextOptions::disable_fused_prepare`]; the indexer takes it for a step whose
    /// queries are one workgroup (decode rows, [`crate::indexer::FUSED_QUERY_PAIRS`]). A
    /// decode step's two are one workgroup each, one core idling while the other works on a
    /// CPU adapter (docs/perf.md, qsa-decode-128k).
    pub fused_prepare: bool,
}

/// Adapter, device, queue and the pipeline cache. Cheap to share through an `Arc`.
pub struct Context {
    pub instance: wgpu::Instance,
    pub adapter: wgpu::Adapter,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub caps: Capabilities,
    pub cache: PipelineCache,
    /// A 16-byte storage buffer bound where an optional input is absent.
    pub(crate) dummy: wgpu::Buffer,
    /// Three more, bound where optional outputs are absent (writable bindings of one
    /// dispatch must not share a buffer).
    pub(crate) dummy_out: [wgpu::Buffer; 3],
    /// A CPU adapter's compute workers, the cores they may run on, and how many of them this
    /// context bound to a core each ([`pin`]; all zero where it did not look: another adapter,
    /// or `disable_thread_pinning`).
    pub pinning: pin::Pinning,
}

/// The host's CPU cores, read once per process (on Linux `available_parallelism` reads the
/// affinity mask and cgroup files: not something to repeat for every planned call); 4 where it
/// cannot be read and in the browser. A CPU adapter (lavapipe, SwiftShader) runs a workgroup on
/// one of them, so plans for such adapters size their work splits by it.
pub fn cpu_cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| {
        #[cfg(not(target_arch = "wasm32"))]
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        #[cfg(target_arch = "wasm32")]
        let cores = 4;
        cores.max(1)
    })
}

/// Whether a GL context of version string `version` (GL_VERSION: "4.5 (Core Profile) Mesa …",
/// "OpenGL ES 3.2 …", "3.3.0 NVIDIA …") runs compute shaders: OpenGL 4.3 or ES 3.1 and up.
/// `None` when the string does not parse.
pub fn gl_has_compute(version: &str) -> Option<bool> {
    let (es, rest) = match version.strip_prefix("OpenGL ES ") {
        Some(r) => (true, r),
        None => (false, version.strip_prefix("OpenGL ").unwrap_or(version)),
    };
    let mut it = rest.split(|c: char| !c.is_ascii_digit());
    let major: u32 = it.next()?.parse().ok()?;
    let minor: u32 = it.next()?.parse().ok()?;
    let need = if es { (3, 1) } else { (4, 3) };
    Some((major, minor) >= need)
}

impl Context {
    /// Creates a context (async: the browser cannot block).
    pub async fn new(opts: &ContextOptions) -> Result<Arc<Context>> {
        // Without a choice, try the primary backends first, then GL (probing EGL is noisy
        // and slower, so it is only reached when nothing else answers).
        let tries: Vec<wgpu::Backends> = match (&opts.backends, wgpu::Backends::from_env()) {
            (Some(list), _) => {
                let b = wgpu::Backends::from_comma_list(list);
                if b.is_empty() {
                    return Err(Error::Adapter(format!("unknown backend list `{list}`")));
                }
                vec![b]
            }
            (None, Some(b)) => vec![b],
            (None, None) => vec![wgpu::Backends::PRIMARY, wgpu::Backends::SECONDARY],
        };
        // The process's threads before the driver starts its own ([`pin`]).
        let threads_before = pin::before();
        let mut found = None;
        let mut errors = Vec::new();
        for backends in tries {
            match Self::adapter(backends).await {
                Ok(x) => {
                    found = Some(x);
                    break;
                }
                Err(e) => errors.push(format!("{backends:?}: {e}")),
            }
        }
        let (instance, adapter) = found
            .ok_or_else(|| Error::Adapter(format!("no adapter found ({})", errors.join("; "))))?;
        let info = adapter.get_info();
        if info.backend == wgpu::Backend::Gl && gl_has_compute(&info.driver_info) == Some(false) {
            // wgpu would fail later with an internal error ("Parent device is lost").
            return Err(Error::Adapter(format!(
                "{} on GL gave an OpenGL {} context, which has no compute shaders (OpenGL 4.3 or \
                 ES 3.1 needed); NVIDIA's EGL does this: use Vulkan (--backend vulkan)",
                info.name, info.driver_info
            )));
        }
        let available = adapter.features();
        // Subgroup variants run only natively with the feature on and one fixed size; the
        // browser build keeps the portable kernels (`disable_subgroups` does the same here).
        let subgroups = available.contains(wgpu::Features::SUBGROUP)
            && !opts.disable_subgroups
            && ShaderTarget::of(info.backend) != ShaderTarget::Browser;
        let fixed = info.subgroup_min_size == info.subgroup_max_size;
        let llvmpipe = format!("{} {}", info.name, info.driver)
            .to_lowercase()
            .contains("llvmpipe");
        let gpu = load_tuned_for_gpu(info.device_type, llvmpipe);
        // Limits are negotiated once: everything the adapter offers.
        let limits = adapter.limits();
        let caps = Capabilities {
            shader_f16: available.contains(wgpu::Features::SHADER_F16),
            subgroups,
            timestamps: available.contains(wgpu::Features::TIMESTAMP_QUERY),
            subgroup_size: (subgroups && fixed).then_some(info.subgroup_min_size),
            llvmpipe,
            textures: !opts.disable_textures && !gpu,
            wide_loads: available.contains(wgpu::Features::SHADER_INT64)
                && !opts.disable_wide_loads
                && !gpu
                && ShaderTarget::of(info.backend) != ShaderTarget::Browser,
            split_topk: opts.split_topk,
            gpu_nsa: opts.gpu_nsa
                && limits.max_compute_invocations_per_workgroup >= 256
                && limits.max_compute_workgroup_size_x >= 256,
            one_row_scores: opts.one_row_scores,
            fused_prepare: !opts.disable_fused_prepare
                && limits.max_storage_buffers_per_shader_stage >= FUSED_PREPARE_BUFFERS,
        };
        let mut required = wgpu::Features::empty();
        if caps.timestamps {
            required |= wgpu::Features::TIMESTAMP_QUERY;
        }
        if caps.subgroups {
            required |= wgpu::Features::SUBGROUP;
        }
        if caps.wide_loads {
            required |= wgpu::Features::SHADER_INT64;
        }
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("qsa.device"),
                required_features: required,
                required_limits: limits.clone(),
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| Error::Adapter(format!("request_device on {}: {e}", info.name)))?;
        // Errors outside an error scope are logged, never a panic.
        device.on_uncaptured_error(Arc::new(|e: wgpu::Error| {
            log::error!("uncaptured wgpu error: {e}");
        }));
        let scratch = |label| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: 16,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        };
        let dummy = scratch("qsa.dummy");
        let dummy_out = ["qsa.dummy_out.0", "qsa.dummy_out.1", "qsa.dummy_out.2"].map(scratch);
        let target = ShaderTarget::of(info.backend);
        let pinning = if caps.llvmpipe && !opts.disable_thread_pinning {
            pin::bind_new_workers(&threads_before)
        } else {
            pin::Pinning::default()
        };
        Ok(Arc::new(Context {
            instance,
            adapter,
            device,
            queue,
            info,
            limits,
            caps,
            cache: PipelineCache::new(target),
            dummy,
            dummy_out,
            pinning,
        }))
    }

    async fn adapter(
        backends: wgpu::Backends,
    ) -> Result<(wgpu::Instance, wgpu::Adapter), wgpu::RequestAdapterError> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = backends;
        desc.flags = wgpu::InstanceFlags::from_build_config().with_env();
        desc.backend_options = wgpu::BackendOptions::from_env_or_default();
        let instance = wgpu::Instance::new(desc);
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::from_env()
                    .unwrap_or(wgpu::PowerPreference::HighPerformance),
                force_fallback_adapter: false,
                compatible_surface: None,
                apply_limit_buckets: false,
            })
            .await?;
        Ok((instance, adapter))
    }

    /// Blocking wrapper of [`Context::new`] for native callers.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new_blocking(opts: &ContextOptions) -> Result<Arc<Context>> {
        pollster::block_on(Context::new(opts))
    }

    /// One line naming adapter, backend and driver.
    pub fn describe(&self) -> String {
        format!(
            "{} ({:?}, {:?}, driver {} {})",
            self.info.name,
            self.info.backend,
            self.info.device_type,
            self.info.driver,
            self.info.driver_info
        )
    }

    /// The largest buffer one storage binding can hold: the binding limit, or the buffer
    /// limit where that is smaller.
    pub fn binding_capacity(&self) -> u64 {
        self.limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size)
    }

    /// Pages per buffer when `num_pages` pages of `page_bytes` are split into buffers that each
    /// fit one binding ([`Context::binding_capacity`]), at most `cap` pages each. A typed error
    /// names `op`'s `input` when one page does not fit.
    pub fn shard_pages(
        &self,
        op: &'static str,
        input: &str,
        page_bytes: u64,
        num_pages: usize,
        cap: Option<usize>,
    ) -> Result<usize> {
        let limit = self.binding_capacity();
        if page_bytes > limit {
            return Err(Error::Limit {
                op,
                input: input.into(),
                need: page_bytes,
                limit_name: "max_storage_buffer_binding_size",
                limit,
            });
        }
        Ok(((limit / page_bytes.max(1)) as usize)
            .min(num_pages)
            .min(cap.unwrap_or(usize::MAX))
            .max(1))
    }

    /// Checks a buffer size against the binding and buffer limits.
    pub fn check_binding_size(&self, op: &'static str, input: &str, bytes: u64) -> Result<()> {
        let lim = self.limits.max_storage_buffer_binding_size;
        if bytes > lim {
            return Err(Error::Limit {
                op,
                input: input.to_string(),
                need: bytes,
                limit_name: "max_storage_buffer_binding_size",
                limit: lim,
            });
        }
        let lim = self.limits.max_buffer_size;
        if bytes > lim {
            return Err(Error::Limit {
                op,
                input: input.to_string(),
                need: bytes,
                limit_name: "max_buffer_size",
                limit: lim,
            });
        }
        Ok(())
    }

    /// Submits command buffers inside validation and out-of-memory error scopes.
    pub async fn submit(&self, label: &str, encoder: wgpu::CommandEncoder) -> Result<()> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let val = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let cmd = encoder.finish();
        self.queue.submit([cmd]);
        let v = val.pop().await;
        let o = oom.pop().await;
        if let Some(e) = v.or(o) {
            return Err(Error::Gpu(format!("{label}: {e}")));
        }
        Ok(())
    }

    /// Waits for all submitted work (native only; in the browser the readback future waits).
    pub fn wait(&self) -> Result<()> {
        self.wait_for(None)
    }

    /// Waits for one submission (`None`: the latest); native only.
    ///
    /// It waits in slices: wgpu's GL backend holds its one context lock while it waits, and
    /// other threads give up on that lock after a few seconds.
    pub fn wait_for(&self, submission: Option<wgpu::SubmissionIndex>) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        loop {
            let wait = wgpu::PollType::Wait {
                submission_index: submission.clone(),
                timeout: Some(std::time::Duration::from_millis(50)),
            };
            match self.device.poll(wait) {
                Ok(_) => break,
                Err(wgpu::PollError::Timeout) => std::thread::yield_now(),
                Err(e) => return Err(Error::Gpu(format!("poll: {e}"))),
            }
        }
        #[cfg(target_arch = "wasm32")]
        let _ = submission;
        Ok(())
    }

    /// Number of 1-D workgroups split over x and y so neither exceeds the per-dimension limit.
    /// Shaders recover the linear index as `wg.y * num_workgroups.x + wg.x`.
    pub fn grid(&self, groups: u32) -> (u32, u32) {
        let max = self.limits.max_compute_workgroups_per_dimension.max(1);
        if groups <= max {
            (groups.max(1), 1)
        } else {
            (max, groups.div_ceil(max))
        }
    }
}

/// Whether the adapter takes the loads measured fastest on a discrete GPU (storage reads in
/// 16-byte words) rather than those measured fastest on llvmpipe (texel fetches and 32-byte
/// words, where a load is a loop over the SIMD lanes): on the H200, storage reads beat texel
/// fetches and 32-byte words left lanes idle (docs/perf.md, "On a real GPU"). Other adapters
/// (integrated GPUs, CPU adapters, the browser's) keep llvmpipe's choice, the one measured
/// on a software adapter.
fn load_tuned_for_gpu(device_type: wgpu::DeviceType, llvmpipe: bool) -> bool {
    device_type == wgpu::DeviceType::DiscreteGpu && !llvmpipe
}

#[cfg(test)]
mod tests {
    use super::{gl_has_compute, load_tuned_for_gpu};

    #[test]
    fn discrete_gpus_take_storage_reads() {
        use wgpu::DeviceType::*;
        assert!(load_tuned_for_gpu(DiscreteGpu, false));
        for t in [Cpu, IntegratedGpu, VirtualGpu, Other] {
            assert!(!load_tuned_for_gpu(t, false), "{t:?}");
        }
        // llvmpipe keeps its loads whatever type a backend reports for it.
        assert!(!load_tuned_for_gpu(DiscreteGpu, true));
    }

    #[test]
    fn gl_versions_with_and_without_compute() {
        // llvmpipe through EGL, and what NVIDIA's EGL gave wgpu 30 on an H200.
        assert_eq!(gl_has_compute("4.5 (Core Profile) Mesa 22.3.6"), Some(true));
        assert_eq!(gl_has_compute("3.3.0 NVIDIA 580.159.04"), Some(false));
        assert_eq!(gl_has_compute("4.2.0 NVIDIA"), Some(false));
        assert_eq!(gl_has_compute("4.3"), Some(true));
        assert_eq!(
            gl_has_compute("OpenGL ES 3.2 NVIDIA 580.159.04"),
            Some(true)
        );
        assert_eq!(gl_has_compute("OpenGL ES 3.0 Mesa"), Some(false));
        assert_eq!(gl_has_compute("OpenGL 4.6"), Some(true));
        assert_eq!(gl_has_compute("unknown"), None);
        assert_eq!(gl_has_compute(""), None);
    }
}
