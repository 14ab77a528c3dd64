//! The crate's one error type. Every variant that concerns an operator names it, the input or
//! attribute at fault, and the offending value, so a user can tell what to fix without a debugger.

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, from a bad case file to a GPU validation error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor input has the wrong type, shape or values.
    #[error("{op}: input `{input}`: {msg}")]
    Input {
        op: &'static str,
        input: String,
        msg: String,
    },
    /// An attribute is missing, malformed or out of range.
    #[error("{op}: attribute `{attr}`: {msg}")]
    Attr {
        op: &'static str,
        attr: String,
        msg: String,
    },
    /// A value only the GPU saw (a page-table entry, a length in a device buffer) was out of
    /// range; the shader clamped its accesses and raised the flag named here.
    #[error("{op}: device-side check failed: {msg}")]
    Device { op: &'static str, msg: String },
    /// A buffer would exceed one of the adapter's limits.
    #[error("{op}: `{input}` needs {need} bytes, over the adapter's {limit_name} of {limit}")]
    Limit {
        op: &'static str,
        input: String,
        need: u64,
        limit_name: &'static str,
        limit: u64,
    },
    /// The case file itself is malformed (not safetensors, no `op`, bad metadata).
    #[error("case file: {0}")]
    Case(String),
    /// The case names an operator this library does not have.
    #[error("unknown operator `{0}` (known: {1})")]
    UnknownOp(String, String),
    /// No adapter could be found or the device could not be created.
    #[error("GPU adapter: {0}")]
    Adapter(String),
    /// A shader failed to compile or a pipeline failed to build.
    #[error("shader `{name}`: {msg}")]
    Shader { name: String, msg: String },
    /// A validation or out-of-memory error raised by wgpu during encoding or submission.
    #[error("GPU: {0}")]
    Gpu(String),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Shorthand for [`Error::Input`].
    pub fn input(op: &'static str, input: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Input {
            op,
            input: input.into(),
            msg: msg.into(),
        }
    }

    /// Shorthand for [`Error::Attr`].
    pub fn attr(op: &'static str, attr: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Attr {
            op,
            attr: attr.into(),
            msg: msg.into(),
        }
    }
}
