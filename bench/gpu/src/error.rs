//! The benchmark's one error type: a message that says what failed and why.

use std::fmt;

use cleave::runtime::cudarc::driver::DriverError;
use cleave_core::graph::DType;

#[derive(Debug)]
pub(crate) struct BenchError {
    message: String,
}

impl BenchError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        BenchError { message: message.into() }
    }

    /// "`step`: CUDA_ERROR_NAME (the driver's description)".
    pub(crate) fn driver(step: &str, e: DriverError) -> Self {
        let text = |r: Result<&std::ffi::CStr, DriverError>| r.ok().map(|s| s.to_string_lossy().into_owned());
        match (text(e.error_name()), text(e.error_string())) {
            (Some(name), Some(what)) => BenchError::new(format!("{step}: {name} ({what})")),
            _ => BenchError::new(format!("{step}: {:?}", e.0)),
        }
    }

    pub(crate) fn dtype(name: &str, want: DType) -> Self {
        BenchError::new(format!("buffer `{name}` does not hold {want} elements (a bug in the benchmark's dispatch)"))
    }

    pub(crate) fn arity(kernel: &str, what: &str, want: usize, got: usize) -> Self {
        BenchError::new(format!("kernel `{kernel}` takes {want} {what}, but the benchmark passed {got}"))
    }
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<cleave::Error> for BenchError {
    fn from(e: cleave::Error) -> Self {
        BenchError::new(e.to_string())
    }
}
