//! Runs the attention block with the generated kernels and with candle's ops, and prints how
//! far apart they are: on the CPU (host emulation), and on the GPU when built with `--features
//! cuda` on a machine that has one.

use candle_core::{DType, Device, Tensor};
use cleave_candle_example::{rel_err, Block, MODEL};

fn run(device: &Device) -> candle_core::Result<()> {
    let block = Block::random(device, 0.5)?;
    for s in [1, 37, 100] {
        let x = Tensor::randn(0f32, 1.0, (s, MODEL), device)?.to_dtype(DType::F16)?;
        let ours = block.forward(&x)?;
        let theirs = block.forward_candle(&x)?;
        let err = rel_err(&ours, &theirs)?;
        let line = format!("{:?} s={s:>3}: max |cleave - candle| / max |candle| = {err:.2e}", device.location());
        std::io::Write::write_all(&mut std::io::stdout(), format!("{line}\n").as_bytes())?;
    }
    Ok(())
}

fn main() -> candle_core::Result<()> {
    run(&Device::Cpu)?;
    if let Ok(gpu) = Device::new_cuda(0) {
        run(&gpu)?;
    }
    Ok(())
}
