//! The browser side of the demo: the wasm-bindgen entry point, a clock (`performance.now`) and
//! a logger that writes to the browser console. The run itself is in [`demo`], its checks
//! and heat maps in [`report`], its inputs in [`synth`].

pub mod demo;
pub mod report;
pub mod synth;

use wasm_bindgen::prelude::*;

/// Runs the demo. `options` is a JSON object (see [`demo::Options::parse`]); the result is a
/// JSON document with the timings, the checks against the CPU reference and the heat maps.
/// Errors become a rejected promise with the error's text.
#[wasm_bindgen]
pub async fn run_demo(options: String) -> Result<String, JsValue> {
    init_once();
    let opts = demo::Options::parse(&options).map_err(|e| JsValue::from_str(&e))?;
    let out = demo::run(&opts, &now_ms)
        .await
        .map_err(|e| JsValue::from_str(&e.to_string()))?;
    Ok(out.to_string())
}

/// Milliseconds since the page started, from `performance.now()`.
fn now_ms() -> f64 {
    web_sys::window()
        .and_then(|w| w.performance())
        .map(|p| p.now())
        .unwrap_or(0.0)
}

struct ConsoleLog;

impl log::Log for ConsoleLog {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let msg = JsValue::from_str(&format!("{} {}: {}", r.level(), r.target(), r.args()));
        match r.level() {
            log::Level::Error => web_sys::console::error_1(&msg),
            log::Level::Warn => web_sys::console::warn_1(&msg),
            _ => web_sys::console::log_1(&msg),
        }
    }
    fn flush(&self) {}
}

static LOGGER: ConsoleLog = ConsoleLog;

fn init_once() {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
        // A panic aborts the module; say why on the console first.
        std::panic::set_hook(Box::new(|info| {
            web_sys::console::error_1(&JsValue::from_str(&format!("panic: {info}")));
        }));
    }
}
