//! Builds the kernels of `kernels.yaml`: searched, scheduled and compiled here, once; later
//! builds take them from the cache.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    cleave::build::Builder::new().kernels("kernels.yaml").compile()?;
    Ok(())
}
