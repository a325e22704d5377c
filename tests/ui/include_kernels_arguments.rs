cleave::include_kernels!("kernels.yaml");

fn main() {}
