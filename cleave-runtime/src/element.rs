//! The element types a launcher accepts, tied to their [`DType`].

use half::{bf16, f16};

use crate::plan::DType;

/// A tensor element type: `f16`, `bf16`, `f32`, or `i32` for index tensors.
///
/// The trait is sealed: its `DTYPE` is what the executors compare against the declaration, so
/// only types whose memory layout is exactly that dtype may implement it.
pub trait Element: Copy + cudarc::driver::DeviceRepr + sealed::Sealed {
    /// The dtype this Rust type stores.
    const DTYPE: DType;
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}

impl Element for i32 {
    const DTYPE: DType = DType::I32;
}

mod sealed {
    /// Not nameable outside this crate, so no other crate can implement `Element`.
    pub trait Sealed {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for f32 {}
    impl Sealed for i32 {}
}
