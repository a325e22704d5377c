// A valid declaration in a crate whose build script never ran `cleave::build::Builder`: the
// error says what to add, and the stub module keeps the code below type-checking.
cleave::kernel! {
    name: swiglu,
    dims: { t: dyn 256, k: 64, f: 128 },
    inputs: { x: f16[t, k], w1: f16[k, f], w2: f16[k, f] },
    outputs: { y: f16[t, f] },
    body: { y = silu(matmul(x, w1)) * matmul(x, w2) }
}

fn main() {
    let x = vec![cleave::f16::ZERO; 3 * 64];
    let w = vec![cleave::f16::ZERO; 64 * 128];
    let mut y = vec![cleave::f16::ZERO; 3 * 128];
    let _ = swiglu::run_host(&x, &w, &w, &mut y, swiglu::Dims { t: 3 });
}
