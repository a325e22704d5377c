cleave::kernel! {
    name: projection,
    dims: { t: dyn 256, k: 64, n: 128 },
    inputs: { x: f16[t, k], w: f16[n, k] },
    outputs: { y: f16[t, n] },
    body: { y = matmul(x, w) }
}

fn main() {}
