cleave::kernel! {
    name: rowsum,
    dims: { t: dyn 256, k: 64 },
    inputs: { x: f32[t, k] },
    outputs: { y: f32[t, k] },
    body: { y = sum(x, axis=-1) }
}

fn main() {}
