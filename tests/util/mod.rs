//! Shared by the integration tests: one GPU context per test binary.
#![allow(dead_code)]

pub mod nsa;

use qsa_wgpu::gpu::{Context, ContextOptions};
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
    let c = CTX
        .get_or_init(|| {
            let _ = env_logger::builder().is_test(true).try_init();
            let c = Context::new_blocking(&ContextOptions::default())
                .expect("a GPU adapter (lavapipe or llvmpipe GL)");
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
