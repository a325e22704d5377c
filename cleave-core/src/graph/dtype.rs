//! Element types.

use std::fmt;

/// The element type of a graph input or output. Everything computed inside a kernel is carried
/// in f32, whatever the storage type: accumulation is always f32.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE binary32.
    F32,
    /// 32-bit signed integers: index tensors (a ragged dim's `indptr`, a page table). They
    /// address other tensors and never take part in the computation.
    I32,
}

impl DType {
    /// Parses the declaration-language spelling.
    pub fn parse(s: &str) -> Option<DType> {
        match s {
            "f16" => Some(DType::F16),
            "bf16" => Some(DType::BF16),
            "f32" => Some(DType::F32),
            "i32" => Some(DType::I32),
            _ => None,
        }
    }

    /// The declaration-language spelling.
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::I32 => "i32",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
        }
    }

    /// True for the floating-point types, the ones values are computed in.
    pub fn is_float(self) -> bool {
        self != DType::I32
    }

    /// Rounds an f64 to the nearest value representable in this type (round to nearest even),
    /// so reference inputs are exactly what a kernel sees.
    pub fn round(self, x: f64) -> f64 {
        match self {
            DType::F32 => x as f32 as f64,
            DType::F16 => half::f16::from_f64(x).to_f64(),
            DType::BF16 => half::bf16::from_f64(x).to_f64(),
            DType::I32 => x.round().clamp(f64::from(i32::MIN), f64::from(i32::MAX)),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_lands_on_representable_values() {
        assert_eq!(DType::F16.round(1.0 + 1.0 / 4096.0), 1.0);
        assert_eq!(DType::F16.round(65520.0), f64::INFINITY);
        assert_eq!(DType::BF16.round(1.00390625), 1.0, "ties go to even");
        assert_eq!(DType::F32.round(0.1), f64::from(0.1f32));
    }
}
