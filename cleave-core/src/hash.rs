//! A stable content hash for cache keys: 128-bit FNV-1a. Stable across Rust versions and
//! platforms, unlike `std`'s hasher, so a cache written by one build is found by the next.

/// 128-bit FNV-1a of a sequence of byte strings (each length-prefixed, so `["ab", "c"]` and
/// `["a", "bc"]` differ).
pub fn fnv128(parts: &[&[u8]]) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    let mut h = OFFSET;
    for part in parts {
        for b in (part.len() as u64).to_le_bytes().iter().chain(part.iter()) {
            h ^= u128::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

/// The hash as 32 hex digits.
pub fn hex(parts: &[&[u8]]) -> String {
    format!("{:032x}", fnv128(parts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors_and_prefixing() {
        // FNV-1a 128 of the empty input is the offset basis; length-prefixing changes it.
        assert_ne!(fnv128(&[b""]), fnv128(&[]));
        assert_ne!(fnv128(&[b"ab", b"c"]), fnv128(&[b"a", b"bc"]));
        assert_eq!(hex(&[b"x"]), hex(&[b"x"]));
        assert_eq!(hex(&[b"x"]).len(), 32);
    }
}
