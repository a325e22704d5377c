cleave::kernel! {
    name: twice,
    dims: { t: dyn 256 },
    inputs: { x: f16[t], x: f16[t] },
    outputs: { y: f16[t] },
    body: { y = exp(x) }
}

fn main() {}
