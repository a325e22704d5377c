cleave::kernel! {
    name: swiglu,
    dims: { t: dyn 256, k: 64, f: 128 },
    inputs: { x: f16[t, k], w1: f16[k, f], w2: f16[k, f] },
    outputs: { y: f16[t, f] },
    body: { y = swish(matmul(x, w1)) * matmul(x, w2) }
}

fn main() {}
