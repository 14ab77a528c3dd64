//! What every operator shares: named inputs and attributes, the checks of SPEC §0, the CPU
//! row transform (RMS norm + split-half RoPE) and the GPU dispatch helper.

use crate::error::{Error, Result};
use crate::gpu::{BindingKind, Context, GpuTensor, PipelineKey, Readback};
use crate::tensor::{DType, Tensor};
use std::collections::BTreeMap;

/// Tensors by contract name.
pub type TensorMap = BTreeMap<String, Tensor>;
/// Attribute values by name, as parsed from the case file's JSON text.
pub type AttrMap = BTreeMap<String, serde_json::Value>;

/// Where an operator runs.
#[derive(Clone, Copy)]
pub enum Exec<'a> {
    Cpu,
    Gpu(&'a Context),
}

/// A required input.
pub fn req<'a>(op: &'static str, m: &'a TensorMap, name: &str) -> Result<&'a Tensor> {
    m.get(name)
        .ok_or_else(|| Error::input(op, name, "required input is missing"))
}

/// An optional input; a zero-element tensor counts as absent (SPEC §0).
pub fn opt<'a>(m: &'a TensorMap, name: &str) -> Option<&'a Tensor> {
    m.get(name).filter(|t| t.numel() > 0)
}

/// Checks the rank of `t` and returns its shape.
pub fn rank<'a>(op: &'static str, name: &str, t: &'a Tensor, r: usize) -> Result<&'a [usize]> {
    if t.shape.len() != r {
        return Err(Error::input(
            op,
            name,
            format!("expected rank {r}, got shape {:?}", t.shape),
        ));
    }
    Ok(&t.shape)
}

/// Checks that `t` has exactly `shape`.
pub fn shape_is(op: &'static str, name: &str, t: &Tensor, shape: &[usize]) -> Result<()> {
    shape_because(op, name, t, shape, None)
}

/// [`shape_is`], the message saying where `shape` comes from (`why`, e.g. the input that
/// fixed it), so that a mismatch between two inputs names both.
pub fn shape_because(
    op: &'static str,
    name: &str,
    t: &Tensor,
    shape: &[usize],
    why: Option<&str>,
) -> Result<()> {
    if t.shape != shape {
        let why = why.map_or(String::new(), |w| format!(" ({w})"));
        return Err(Error::input(
            op,
            name,
            format!("expected shape {shape:?}{why}, got {:?}", t.shape),
        ));
    }
    Ok(())
}

/// Checks that `t` is a float tensor of the call's type `dt`.
pub fn float_of(op: &'static str, name: &str, t: &Tensor, dt: DType) -> Result<()> {
    if t.dtype != dt {
        return Err(Error::input(
            op,
            name,
            format!(
                "dtype {} differs from the call's activation type {dt}",
                t.dtype
            ),
        ));
    }
    Ok(())
}

/// The activation type of a call, from its leading float input.
pub fn float_type(op: &'static str, name: &str, t: &Tensor) -> Result<DType> {
    if !t.dtype.is_float() {
        return Err(Error::input(
            op,
            name,
            format!("dtype {} is not one of f32, f16, bf16", t.dtype),
        ));
    }
    Ok(t.dtype)
}

/// Integer input values (i32 or u32 accepted; the contract names the usual type).
pub fn ints(op: &'static str, name: &str, t: &Tensor) -> Result<Vec<i64>> {
    if !matches!(t.dtype, DType::I32 | DType::U32) {
        return Err(Error::input(
            op,
            name,
            format!("dtype {} is not an integer type (i32 or u32)", t.dtype),
        ));
    }
    Ok(t.to_i64())
}

/// Integer values that must be ≥ 0 and fit in u32.
pub fn uints(op: &'static str, name: &str, t: &Tensor) -> Result<Vec<u32>> {
    ints(op, name, t)?
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            u32::try_from(v)
                .map_err(|_| Error::input(op, name, format!("element {i} is {v}, must be >= 0")))
        })
        .collect()
}

/// A page table as the device reads it. Entries that no position reaches may hold anything, −1
/// (a common filler) included, so a negative entry becomes `u32::MAX`, which is never a page;
/// [`check_page`] rejects it, like any other entry past the pool, where a position reaches it.
pub fn page_entries(op: &'static str, t: &Tensor) -> Result<Vec<u32>> {
    Ok(ints(op, "page_table", t)?
        .into_iter()
        .map(|v| u32::try_from(v).unwrap_or(u32::MAX))
        .collect())
}

/// Entry `idx` of `table` (read by [`page_entries`] from `t`), which column `col` of sequence
/// `seq` reaches: its page, or an error naming the entry as given.
pub fn check_page(
    op: &'static str,
    t: &Tensor,
    table: &[u32],
    (idx, seq, col): (usize, usize, usize),
    num_pages: usize,
) -> Result<usize> {
    let page = table[idx] as usize;
    if page < num_pages {
        return Ok(page);
    }
    let given = t.to_i64()[idx];
    let why = if given < 0 {
        format!("page {given} is negative")
    } else {
        format!("page {given} >= num_pages {num_pages}")
    };
    Err(Error::input(
        op,
        "page_table",
        format!("sequence {seq}, column {col}: {why}"),
    ))
}

fn attr_num(op: &'static str, a: &AttrMap, name: &str) -> Result<Option<f64>> {
    match a.get(name) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| Error::attr(op, name, format!("expected a number, got {v}"))),
    }
}

/// An integer attribute, `default` when absent (`None`: required).
pub fn attr_int(op: &'static str, a: &AttrMap, name: &str, default: Option<i64>) -> Result<i64> {
    match attr_num(op, a, name)? {
        Some(v) if v.fract() == 0.0 && v.abs() < 9.0e15 => Ok(v as i64),
        Some(v) => Err(Error::attr(
            op,
            name,
            format!("expected an integer, got {v}"),
        )),
        None => {
            default.ok_or_else(|| Error::attr(op, name, "required attribute is missing (or null)"))
        }
    }
}

/// An integer attribute in `lo ..= hi`, `default` when absent (`None`: required); the error
/// says which bound a value breaks.
pub fn attr_int_in(
    op: &'static str,
    a: &AttrMap,
    name: &str,
    default: Option<i64>,
    lo: i64,
    hi: i64,
) -> Result<i64> {
    let v = attr_int(op, a, name, default)?;
    if v < lo {
        return Err(Error::attr(op, name, format!("must be >= {lo}, got {v}")));
    }
    if v > hi {
        return Err(Error::attr(
            op,
            name,
            format!("must be at most {hi}, got {v}"),
        ));
    }
    Ok(v)
}

/// A finite float attribute, `default` when absent.
pub fn attr_f32(op: &'static str, a: &AttrMap, name: &str, default: f32) -> Result<f32> {
    match attr_num(op, a, name)? {
        Some(v) if (v as f32).is_finite() => Ok(v as f32),
        Some(v) => Err(Error::attr(
            op,
            name,
            format!("must be finite in f32, got {v}"),
        )),
        None => Ok(default),
    }
}

/// The `epsilon` attribute of the RMS norms: finite, ≥ 0, default 1e-6.
pub fn attr_epsilon(op: &'static str, a: &AttrMap) -> Result<f32> {
    let e = attr_f32(op, a, "epsilon", 1e-6)?;
    if e < 0.0 {
        return Err(Error::attr(op, "epsilon", format!("must be >= 0, got {e}")));
    }
    Ok(e)
}

/// An optional non-negative integer attribute (`None` when absent).
pub fn attr_opt_usize(op: &'static str, a: &AttrMap, name: &str) -> Result<Option<usize>> {
    match attr_opt_int(op, a, name)? {
        Some(v) if v < 0 => Err(Error::attr(op, name, format!("must be >= 0, got {v}"))),
        v => Ok(v.map(|v| v as usize)),
    }
}

/// An optional integer attribute: `None` when absent or null.
pub fn attr_opt_int(op: &'static str, a: &AttrMap, name: &str) -> Result<Option<i64>> {
    match a.get(name) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(_) => attr_int(op, a, name, None).map(Some),
    }
}

/// An optional float attribute: `None` when absent or null.
pub fn attr_opt_f32(op: &'static str, a: &AttrMap, name: &str) -> Result<Option<f32>> {
    match a.get(name) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(_) => attr_f32(op, a, name, 0.0).map(Some),
    }
}

/// A string attribute, `default` when absent.
pub fn attr_str(op: &'static str, a: &AttrMap, name: &str, default: &str) -> Result<String> {
    match a.get(name) {
        None | Some(serde_json::Value::Null) => Ok(default.to_string()),
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(Error::attr(op, name, format!("expected a string, got {v}"))),
    }
}

/// A boolean attribute, `default` when absent (also accepts 0 / 1).
pub fn attr_bool(op: &'static str, a: &AttrMap, name: &str, default: bool) -> Result<bool> {
    match a.get(name) {
        None | Some(serde_json::Value::Null) => Ok(default),
        Some(serde_json::Value::Bool(b)) => Ok(*b),
        Some(serde_json::Value::Number(n)) if n.as_i64() == Some(0) => Ok(false),
        Some(serde_json::Value::Number(n)) if n.as_i64() == Some(1) => Ok(true),
        Some(v) => Err(Error::attr(
            op,
            name,
            format!("expected true or false, got {v}"),
        )),
    }
}

/// Largest channel count one workgroup row holds (`MAX_D` in `shaders/common/rowmath.wgsl`).
pub const MAX_D: usize = 2048;

/// Checks a channel count against [`MAX_D`].
pub fn check_di(op: &'static str, name: &str, di: usize) -> Result<()> {
    if di == 0 || di > MAX_D {
        return Err(Error::input(
            op,
            name,
            format!("channel count {di} must be in 1..={MAX_D}"),
        ));
    }
    Ok(())
}

/// Checks a rotary dimension: even, ≤ Di.
pub fn check_dr(op: &'static str, name: &str, dr: usize, di: usize) -> Result<()> {
    if !dr.is_multiple_of(2) || dr > di {
        return Err(Error::input(
            op,
            name,
            format!("rotary dim {dr} must be even and <= Di = {di}"),
        ));
    }
    Ok(())
}

/// CPU row transform, written to read like `shaders/common/rowmath.wgsl`: RMS norm with
/// weight `(offset + w)` when `w` is given, then split-half RoPE of the first `dr` channels
/// with per-channel `cos(c)`, `sin(c)`.
pub fn transform_row(
    row: &mut [f32],
    w: Option<&[f32]>,
    eps: f32,
    offset: f32,
    dr: usize,
    cs: impl Fn(usize) -> (f32, f32),
) {
    let d = row.len();
    if let Some(w) = w {
        let ss: f32 = row.iter().map(|v| v * v).sum();
        let inv = 1.0 / (ss / d as f32 + eps).sqrt();
        for (c, v) in row.iter_mut().enumerate() {
            *v = *v * inv * (offset + w[c]);
        }
    }
    if dr > 0 {
        let h = dr / 2;
        let y: Vec<f32> = row[..dr].to_vec();
        for c in 0..dr {
            let (co, si) = cs(c);
            row[c] = if c < h {
                y[c] * co - y[c + h] * si
            } else {
                y[c] * co + y[c - h] * si
            };
        }
    }
}

/// One compute dispatch: a pipeline, its params, its storage buffers in binding order
/// (binding 0 is the uniform params), the textures of a shader that declares some (in the
/// order of their bindings; the buffers take the other bindings), and the number of
/// workgroups.
pub struct Dispatch<'a> {
    pub key: PipelineKey,
    pub params: &'a [u8],
    pub buffers: Vec<&'a wgpu::Buffer>,
    pub textures: Vec<&'a wgpu::TextureView>,
    pub groups: u32,
}

/// A pipeline with a bind group over fixed buffers and its own uniform buffer, ready to be
/// recorded any number of times (once per submission: the params are written by the queue
/// before the submission that follows, so two recordings of one `Bound` in one encoder would
/// share the last params).
pub struct Bound {
    pipeline: std::sync::Arc<crate::gpu::CachedPipeline>,
    group: wgpu::BindGroup,
    uniform: wgpu::Buffer,
    label: String,
}

impl Bound {
    /// Builds (or reuses) the pipeline of `d` and a bind group over `d`'s buffers.
    pub async fn new(ctx: &Context, d: &Dispatch<'_>) -> Result<Bound> {
        let cp = ctx.cache.get(&ctx.device, &d.key).await?;
        let label = format!("qsa.{}", d.key.shader);
        let uniform = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(&label),
            size: (d.params.len().div_ceil(16) * 16).max(16) as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: uniform.as_entire_binding(),
        }];
        let mut buffers = d.buffers.iter();
        let mut textures = d.textures.iter();
        for &(binding, kind) in cp.bindings.iter().filter(|b| b.0 != 0) {
            let resource = match kind {
                BindingKind::TextureU32 => textures
                    .next()
                    .map(|t| wgpu::BindingResource::TextureView(t)),
                _ => buffers.next().map(|b| b.as_entire_binding()),
            };
            let Some(resource) = resource else { break };
            entries.push(wgpu::BindGroupEntry { binding, resource });
        }
        if entries.len() != cp.bindings.len()
            || buffers.next().is_some()
            || textures.next().is_some()
        {
            return Err(Error::Shader {
                name: d.key.shader.to_string(),
                msg: format!(
                    "host binds {} buffers and {} textures, shader declares {} bindings besides \
                     its params",
                    d.buffers.len(),
                    d.textures.len(),
                    cp.bindings.len() - 1
                ),
            });
        }
        let group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&label),
            layout: &cp.layout,
            entries: &entries,
        });
        Ok(Bound {
            pipeline: cp,
            group,
            uniform,
            label,
        })
    }

    /// Writes `params` and records one dispatch of `groups` workgroups into `enc`, in a pass
    /// that writes `timestamps` when given.
    pub fn record(
        &self,
        ctx: &Context,
        enc: &mut wgpu::CommandEncoder,
        params: &[u8],
        groups: u32,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) {
        // Params structs are whole 32-bit words, as write_buffer wants; anything else is
        // padded (the uniform buffer is at least as large, rounded up to 16 bytes).
        if params.len().is_multiple_of(4) {
            ctx.queue.write_buffer(&self.uniform, 0, params);
        } else {
            let mut bytes = params.to_vec();
            bytes.resize(params.len().div_ceil(4) * 4, 0);
            ctx.queue.write_buffer(&self.uniform, 0, &bytes);
        }
        let (x, y) = ctx.grid(groups);
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(&self.label),
            timestamp_writes: timestamps,
        });
        pass.set_pipeline(&self.pipeline.pipeline);
        pass.set_bind_group(0, &self.group, &[]);
        if groups > 0 {
            pass.dispatch_workgroups(x, y, 1);
        }
    }
}

/// Records `d` into `enc` with a fresh bind group (the pipeline comes from the cache).
pub async fn encode(ctx: &Context, enc: &mut wgpu::CommandEncoder, d: Dispatch<'_>) -> Result<()> {
    Bound::new(ctx, &d)
        .await?
        .record(ctx, enc, d.params, d.groups, None);
    Ok(())
}

/// What one (stage, slot) of a [`BindCache`] holds: the bind group and what it was built for.
struct Entry {
    key: PipelineKey,
    buffers: Vec<wgpu::Buffer>,
    textures: Vec<wgpu::TextureView>,
    bound: Bound,
}

impl Entry {
    /// Whether this entry was built for `d`'s pipeline and buffers.
    fn serves(&self, d: &Dispatch<'_>) -> bool {
        self.key == d.key
            && self.buffers.len() == d.buffers.len()
            && self.buffers.iter().zip(&d.buffers).all(|(a, b)| a == *b)
            && self.textures.len() == d.textures.len()
            && self.textures.iter().zip(&d.textures).all(|(a, b)| a == *b)
    }
}

/// Bind groups kept across submissions, for a caller (the orchestrators) that records the same
/// stages over the same buffers step after step. Each (stage, slot) holds one bind group,
/// rebuilt when the pipeline or the buffers differ from those it was built for, so it is never
/// stale; checking that allocates nothing. The cache also owns the optional stage timer.
#[derive(Default)]
pub struct BindCache {
    map: std::collections::HashMap<(&'static str, usize), Entry>,
    created: usize,
    /// When set, every recorded pass writes timestamps labelled by its stage.
    timer: Option<crate::gpu::Timer>,
}

impl BindCache {
    /// Bind groups this cache has built. The pipeline cache is consulted only when one is
    /// built, so a count that stays put also means no pipeline was built for this cache.
    pub fn created(&self) -> usize {
        self.created
    }

    /// Turns stage timing on (up to `passes` passes per submission) or off; returns whether
    /// the adapter can time them (it needs timestamp queries).
    pub fn set_timing(&mut self, ctx: &Context, on: bool, passes: u32) -> bool {
        self.timer = if on {
            crate::gpu::Timer::new(ctx, passes)
        } else {
            None
        };
        self.timer.is_some()
    }

    /// GPU milliseconds per stage of the last submission, when timing is on.
    pub async fn stage_times(&self, ctx: &Context) -> Result<Option<Vec<(&'static str, f64)>>> {
        match &self.timer {
            Some(t) => Ok(Some(t.read(ctx).await?)),
            None => Ok(None),
        }
    }

    /// Starts a submission's recording: forgets the previous one's timed passes.
    pub fn begin(&mut self) {
        if let Some(t) = &mut self.timer {
            t.clear();
        }
    }

    /// Resolves the timed passes into `enc` and submits it.
    pub async fn submit(
        &self,
        ctx: &Context,
        label: &str,
        mut enc: wgpu::CommandEncoder,
    ) -> Result<()> {
        if let Some(t) = &self.timer {
            t.resolve(&mut enc);
        }
        ctx.submit(label, enc).await
    }

    /// Records `d` as slot `slot` of `stage`; each (stage, slot) may be recorded once per
    /// submission.
    pub async fn record(
        &mut self,
        ctx: &Context,
        enc: &mut wgpu::CommandEncoder,
        stage: &'static str,
        slot: usize,
        d: Dispatch<'_>,
    ) -> Result<()> {
        self.prepare(ctx, stage, slot, &d).await?;
        let ts = self.timer.as_mut().and_then(|t| t.writes(stage));
        self.map[&(stage, slot)]
            .bound
            .record(ctx, enc, d.params, d.groups, ts);
        Ok(())
    }

    /// Makes sure slot `slot` of `stage` holds a bind group for `d` (what [`BindCache::record`]
    /// of `d` will use), recording nothing: called alone for a stage that alternates between
    /// variants, so that the first switch builds nothing either.
    pub async fn prepare(
        &mut self,
        ctx: &Context,
        stage: &'static str,
        slot: usize,
        d: &Dispatch<'_>,
    ) -> Result<()> {
        if self.map.get(&(stage, slot)).is_some_and(|e| e.serves(d)) {
            return Ok(());
        }
        let entry = Entry {
            key: d.key.clone(),
            buffers: d.buffers.iter().map(|b| (*b).clone()).collect(),
            textures: d.textures.iter().map(|t| (*t).clone()).collect(),
            bound: Bound::new(ctx, d).await?,
        };
        self.map.insert((stage, slot), entry);
        self.created += 1;
        Ok(())
    }
}

/// Turns the device flag word into an error naming the operator.
pub fn check_flags(op: &'static str, flags: u32) -> Result<()> {
    if flags == 0 {
        return Ok(());
    }
    let names = [
        (1, "key_counts < cache_lengths"),
        (2, "key_counts / r > max_blocks"),
        (4, "a position needs a page-table column past max_pages"),
        (8, "a page-table entry is >= num_pages"),
        (16, "a position is outside the rotary table"),
        (32, "a token index is outside 0 ..= its query position"),
        (
            64,
            "an NSA length or offset is inconsistent with its buffers",
        ),
        (128, "a token count is outside 0 ..= W"),
    ];
    let msg: Vec<&str> = names
        .iter()
        .filter(|(b, _)| flags & b != 0)
        .map(|(_, s)| *s)
        .collect();
    Err(Error::Device {
        op,
        msg: format!("{} (flags {flags:#x})", msg.join("; ")),
    })
}

/// A zeroed device flag word for the shaders of `shaders/common/flags.wgsl`.
pub fn flag_word(ctx: &Context) -> Result<GpuTensor> {
    GpuTensor::upload(ctx, "qsa.flags", &Tensor::from_u32(&[1], &[0]))
}

/// Reads `outputs` and the flag word back in one submission; a raised flag is an error naming
/// `op`, and then no output is returned.
pub async fn read_checked(
    ctx: &Context,
    op: &'static str,
    outputs: &[&GpuTensor],
    flags: &GpuTensor,
) -> Result<Vec<Tensor>> {
    let mut list: Vec<(&wgpu::Buffer, u64)> =
        outputs.iter().map(|t| (&t.buffer, t.bytes())).collect();
    list.push((&flags.buffer, 4));
    let mut got = Readback::new(ctx, &list).await_all(ctx).await?;
    let word = got.pop().unwrap();
    check_flags(op, u32::from_le_bytes(word[..4].try_into().unwrap()))?;
    outputs
        .iter()
        .zip(got)
        .map(|(t, bytes)| Tensor::from_bytes(t.dtype, &t.shape, bytes))
        .collect()
}

/// Concatenates T tensors into one word-aligned buffer image; returns the bytes and each
/// segment's element offset (absent segments get offset 0 and no bytes).
pub fn pack_segments(dt: DType, segs: &[Option<&Tensor>]) -> (Vec<u8>, Vec<u32>) {
    let mut bytes = Vec::new();
    let mut offs = Vec::new();
    for s in segs {
        while bytes.len() % 4 != 0 {
            bytes.push(0);
        }
        offs.push((bytes.len() / dt.size()) as u32);
        if let Some(t) = s {
            bytes.extend_from_slice(&t.data);
        }
    }
    (bytes, offs)
}
