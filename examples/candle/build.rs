//! Builds the block's two kernels: searched, scheduled and compiled here, once.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    cleave::build::Builder::new().kernels("kernels.yaml").compile()?;
    Ok(())
}
