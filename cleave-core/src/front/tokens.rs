//! The Rust-token front end: `kernel! { name: .., dims: {..}, .. }` to a [`KernelDecl`].
