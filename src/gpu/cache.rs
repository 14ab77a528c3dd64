//! The pipeline cache: a typed, hashable key (shader, entry point, specialisation constants)
//! maps to a compute pipeline whose bind group layout is *reflected* from the shader by naga,
//! so bindings are never written twice. Pipelines are built once and kept for the context's
//! life; a counter lets tests prove that a steady-state step builds none.

use crate::error::{Error, Result};
use crate::shaders::{self, ShaderTarget};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Identity of a pipeline: which shader, which entry point, which override values. The ordered
/// map of constants is both the specialisation passed to wgpu and part of the key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PipelineKey {
    pub shader: &'static str,
    pub entry: &'static str,
    pub constants: BTreeMap<&'static str, u32>,
}

impl PipelineKey {
    pub fn new(shader: &'static str, entry: &'static str) -> Self {
        PipelineKey {
            shader,
            entry,
            constants: BTreeMap::new(),
        }
    }

    /// Adds one override constant.
    pub fn with(mut self, name: &'static str, value: u32) -> Self {
        self.constants.insert(name, value);
        self
    }
}

/// A built pipeline with its reflected layout.
pub struct CachedPipeline {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
    /// Bindings of group 0 (number, kind) in order, as the shader declares them.
    pub bindings: Vec<(u32, BindingKind)>,
    pub workgroup_size: [u32; 3],
}

/// Built-once pipelines, keyed by [`PipelineKey`].
#[derive(Default)]
pub struct PipelineCache {
    map: Mutex<HashMap<PipelineKey, Arc<CachedPipeline>>>,
    created: AtomicUsize,
    /// Who compiles the shaders given to the device.
    target: ShaderTarget,
}

/// Kind of one reflected binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindingKind {
    Uniform,
    Storage {
        read_only: bool,
    },
    /// A 2-D texture of unsigned integer texels read by `textureLoad` (`texture_2d<u32>`).
    TextureU32,
}

/// Group-0 bindings (number, kind) in order, and the workgroup size.
pub type Reflection = (Vec<(u32, BindingKind)>, [u32; 3]);

/// Bindings of group 0 and the workgroup size of `entry`, read from the module by naga.
pub fn reflect(module: &naga::Module, entry: &str) -> Option<Reflection> {
    let ep = module.entry_points.iter().find(|e| e.name == entry)?;
    let mut out = Vec::new();
    for (_, var) in module.global_variables.iter() {
        let Some(rb) = &var.binding else { continue };
        if rb.group != 0 {
            continue;
        }
        let kind = match var.space {
            naga::AddressSpace::Uniform => BindingKind::Uniform,
            naga::AddressSpace::Storage { access } => BindingKind::Storage {
                read_only: !access.contains(naga::StorageAccess::STORE),
            },
            naga::AddressSpace::Handle => match module.types[var.ty].inner {
                naga::TypeInner::Image {
                    dim: naga::ImageDimension::D2,
                    arrayed: false,
                    class:
                        naga::ImageClass::Sampled {
                            kind: naga::ScalarKind::Uint,
                            multi: false,
                        },
                } => BindingKind::TextureU32,
                _ => continue,
            },
            _ => continue,
        };
        out.push((rb.binding, kind));
    }
    out.sort_by_key(|b| b.0);
    Some((out, ep.workgroup_size))
}

impl PipelineCache {
    /// An empty cache whose shaders are compiled by `target`.
    pub fn new(target: ShaderTarget) -> PipelineCache {
        PipelineCache {
            target,
            ..Default::default()
        }
    }

    /// Number of pipelines built so far.
    pub fn created(&self) -> usize {
        self.created.load(Ordering::Relaxed)
    }

    /// Whether a pipeline of `shader` (any entry point and constants) has been built.
    pub fn built(&self, shader: &str) -> bool {
        self.map.lock().unwrap().keys().any(|k| k.shader == shader)
    }

    /// Returns the cached pipeline for `key`, building it on first use.
    pub async fn get(
        &self,
        device: &wgpu::Device,
        key: &PipelineKey,
    ) -> Result<Arc<CachedPipeline>> {
        if let Some(p) = self.map.lock().unwrap().get(key) {
            return Ok(p.clone());
        }
        let built = Arc::new(build(device, key, self.target).await?);
        self.created.fetch_add(1, Ordering::Relaxed);
        self.map.lock().unwrap().insert(key.clone(), built.clone());
        Ok(built)
    }
}

/// The runtime checks the pipelines are built with: wgpu's defaults without the loop bounding.
///
/// By default wgpu gives every shader loop a hidden iteration counter that breaks out after
/// 2^64 iterations, so that an untrusted shader's endless loop cannot become undefined
/// behaviour in a backend's compiler. These shaders are the crate's own, and each of their
/// loops ends for every input: a counter stepping up by a constant to a bound, or one of the
/// loops `shaders::tests::REVIEWED_LOOPS` lists with the reason it ends (a test fails on any
/// loop that is neither). The counters cost lavapipe's attention pass 4–5 % (docs/perf.md).
/// Bounds checks and the integer division checks stay on; the browser's WebGPU ignores these
/// settings.
fn runtime_checks() -> wgpu::ShaderRuntimeChecks {
    let mut checks = wgpu::ShaderRuntimeChecks::checked();
    checks.force_loop_bounding = false;
    checks
}

async fn build(
    device: &wgpu::Device,
    key: &PipelineKey,
    target: ShaderTarget,
) -> Result<CachedPipeline> {
    let name = format!("qsa.{}", key.shader);
    // naga reads the shader for reflection; the device gets it in its compiler's dialect.
    let src = shaders::assemble(key.shader)?;
    let module = naga::front::wgsl::parse_str(&src).map_err(|e| {
        log::error!("final WGSL of `{}`:\n{src}", key.shader);
        Error::Shader {
            name: key.shader.to_string(),
            msg: e.emit_to_string(&src),
        }
    })?;
    let (bindings, workgroup_size) = reflect(&module, key.entry).ok_or_else(|| Error::Shader {
        name: key.shader.to_string(),
        msg: format!("no entry point `{}`", key.entry),
    })?;
    let entries: Vec<wgpu::BindGroupLayoutEntry> = bindings
        .iter()
        .map(|(b, kind)| wgpu::BindGroupLayoutEntry {
            binding: *b,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: match kind {
                BindingKind::Uniform => buffer_binding(wgpu::BufferBindingType::Uniform),
                BindingKind::Storage { read_only } => {
                    buffer_binding(wgpu::BufferBindingType::Storage {
                        read_only: *read_only,
                    })
                }
                BindingKind::TextureU32 => wgpu::BindingType::Texture {
                    sample_type: wgpu::TextureSampleType::Uint,
                    view_dimension: wgpu::TextureViewDimension::D2,
                    multisampled: false,
                },
            },
            count: None,
        })
        .collect();
    let device_src = shaders::for_target(src, target);
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(&name),
        source: wgpu::ShaderSource::Wgsl(device_src.as_str().into()),
    };
    // SAFETY: `runtime_checks` leaves out only the loop bounding, and every loop of the crate's
    // shaders ends for every input (see there).
    let shader = unsafe { device.create_shader_module_trusted(desc, runtime_checks()) };
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(&name),
        entries: &entries,
    });
    let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(&name),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    let constants: Vec<(&str, f64)> = key.constants.iter().map(|(k, v)| (*k, *v as f64)).collect();
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(&name),
        layout: Some(&pl),
        module: &shader,
        entry_point: Some(key.entry),
        compilation_options: wgpu::PipelineCompilationOptions {
            constants: &constants,
            zero_initialize_workgroup_memory: false,
        },
        cache: None,
    });
    if let Some(e) = scope.pop().await {
        log::error!("final WGSL of `{}`:\n{device_src}", key.shader);
        return Err(Error::Shader {
            name: key.shader.to_string(),
            msg: format!("{} ({:?}): {}", key.entry, key.constants, with_causes(&e)),
        });
    }
    Ok(CachedPipeline {
        pipeline,
        layout,
        bindings,
        workgroup_size,
    })
}

fn buffer_binding(ty: wgpu::BufferBindingType) -> wgpu::BindingType {
    wgpu::BindingType::Buffer {
        ty,
        has_dynamic_offset: false,
        min_binding_size: None,
    }
}

/// An error and its chain of causes on one line (wgpu puts the reason a pipeline is invalid in
/// the causes, not in the error's own message).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        cause = c.source();
    }
    msg
}
