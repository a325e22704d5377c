// `include_kernels!` and `kernel!(name)` in a crate without a build script.
cleave::include_kernels!();
cleave::kernel!(attention);

fn main() {}
