//! Shared by the integration tests: one GPU context per test binary.
#![allow(dead_code)]

pub mod nsa;

use qsa_wgpu::gpu::{Context, ContextOptions};
use qsa_wgpu::Tensor;
use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

static GL_TURN: Mutex<()> = Mutex::new(());

thread_local! {
    /// The GL turn this test thread holds; dropped when the test's thread ends.
    static HELD: RefCell<Option<MutexGuard<'static, ()>>> = const { RefCell::new(None) };
}

/// The context for this test binary, on the adapter `WGPU_BACKEND` selects. A missing adapter
/// fails the test: CI always has lavapipe or llvmpipe GL.
///
/// On GL the tests of one binary take turns: wgpu's GL backend has one context lock, llvmpipe
/// runs a dispatch inside the submit that holds it, and a thread that waits for the lock more
/// than a few seconds panics. The first call in a test thread waits for the turn, which that
/// thread keeps until the test ends.
pub fn ctx() -> Arc<Context> {
    static CTX: OnceLock<Arc<Context>> = OnceLock::new();
    shared(&CTX, ContextOptions::default())
}

/// The context in `cell`, made once per test binary with `opts`; on GL, the test thread takes
/// its turn (above).
fn shared(cell: &OnceLock<Arc<Context>>, opts: ContextOptions) -> Arc<Context> {
    let c = cell
        .get_or_init(|| {
            let _ = env_logger::builder().is_test(true).try_init();
            let c = Context::new_blocking(&opts).expect("a GPU adapter (lavapipe or llvmpipe GL)");
            eprintln!("adapter: {}", c.describe());
            c
        })
        .clone();
    if c.info.backend == wgpu::Backend::Gl {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if h.is_none() {
                *h = Some(GL_TURN.lock().unwrap_or_else(|e| e.into_inner()));
            }
        });
    }
    c
}

/// A context on the same adapter that never chooses a subgroup variant (the portable
/// kernels), to compare the two.
pub fn portable_ctx() -> Arc<Context> {
    Context::new_blocking(&ContextOptions {
        disable_subgroups: true,
        ..Default::default()
    })
    .unwrap()
}

/// A context on the same adapter whose subgroup variants load 16 bytes per invocation even
/// where it has 64-bit integers (the 32-byte word variants' counterpart).
pub fn narrow_ctx() -> Arc<Context> {
    Context::new_blocking(&ContextOptions {
        disable_wide_loads: true,
        ..Default::default()
    })
    .unwrap()
}

/// A context on the same adapter whose top-k spreads a few wide rows over many workgroups
/// (`block_topk`'s split kernels, chosen only when asked for), one per test binary like
/// [`ctx`]: its pipelines are built once.
pub fn split_ctx() -> Arc<Context> {
    static CTX: OnceLock<Arc<Context>> = OnceLock::new();
    shared(
        &CTX,
        ContextOptions {
            split_topk: true,
            ..Default::default()
        },
    )
}

/// A context on the same adapter whose `nsa_compress_attention` runs the GPU-shaped logits and
/// values kernels (`Capabilities::gpu_nsa`, chosen only when asked for), one per test binary
/// like [`ctx`].
pub fn gpu_nsa_ctx() -> Arc<Context> {
    static CTX: OnceLock<Arc<Context>> = OnceLock::new();
    shared(
        &CTX,
        ContextOptions {
            gpu_nsa: true,
            ..Default::default()
        },
    )
}

/// A context on the same adapter that scores every row in one-row tiles
/// (`Capabilities::one_row_scores`), to compare with the default tilings.
pub fn one_row_ctx() -> Arc<Context> {
    Context::new_blocking(&ContextOptions {
        one_row_scores: true,
        ..Default::default()
    })
    .unwrap()
}

/// A context on the same adapter whose indexer runs the compress and the query preparation as
/// two dispatches (see `Capabilities::fused_prepare`), to compare the two.
pub fn unfused_ctx() -> Arc<Context> {
    Context::new_blocking(&ContextOptions {
        disable_fused_prepare: true,
        ..Default::default()
    })
    .unwrap()
}

/// A context on the same adapter that never reads from texture copies (the indexer scores
/// from its buffers), to compare the two.
pub fn buffer_ctx() -> Arc<Context> {
    Context::new_blocking(&ContextOptions {
        disable_textures: true,
        ..Default::default()
    })
    .unwrap()
}

/// Rows `a..b` of a tensor along its first axis.
pub fn rows(t: &Tensor, a: usize, b: usize) -> Tensor {
    let row: usize = t.shape[1..].iter().product::<usize>() * t.dtype.size();
    let mut shape = t.shape.clone();
    shape[0] = b - a;
    Tensor::from_bytes(t.dtype, &shape, t.data[a * row..b * row].to_vec()).unwrap()
}

/// Concatenates tensors along the first axis.
pub fn cat(ts: &[Tensor]) -> Tensor {
    let mut shape = ts[0].shape.clone();
    shape[0] = ts.iter().map(|t| t.shape[0]).sum();
    let data = ts.iter().flat_map(|t| t.data.iter().copied()).collect();
    Tensor::from_bytes(ts[0].dtype, &shape, data).unwrap()
}
