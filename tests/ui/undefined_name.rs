cleave::kernel! {
    name: scaled,
    dims: { t: dyn 256, k: 64 },
    inputs: { x: f16[t, k] },
    outputs: { y: f16[t, k] },
    body: { y = x * scale }
}

fn main() {}
