cleave::kernel! {
    name: scaled,
    dims: { t: dyn 256 },
    inputs: { x: f16[t], bias: f16[t] },
    outputs: { y: f16[t] },
    body: { y = exp(x) }
}

fn main() {}
