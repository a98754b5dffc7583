//! A tiny deterministic random source (SplitMix64, Steele, Lea and Flood 2014), so one `--seed`
//! reproduces the same workload without a `rand` dependency.

/// The SplitMix64 generator: a 64-bit counter stepped by the golden-ratio increment, then mixed.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 finaliser: a bijective mix of one word.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A well-spread word derived from `seed` and a list of coordinates (a job, a step, an
/// attempt): the same inputs always give the same draw, whatever order calls happen in.
pub fn hash(seed: u64, coordinates: &[u64]) -> u64 {
    coordinates
        .iter()
        .fold(mix(seed), |acc, &c| mix(acc ^ c.wrapping_mul(GOLDEN_GAMMA)))
}

/// A uniform draw in `[0, 1)` from a word.
pub fn unit(word: u64) -> f64 {
    // The top 53 bits fill an f64's mantissa exactly.
    (word >> 11) as f64 / (1u64 << 53) as f64
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next word.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix(self.state)
    }

    /// A uniform integer in `lo..=hi` (`lo` when `hi < lo`).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        let span = hi - lo + 1;
        // Lemire's multiply-shift: unbiased enough for a demo, and never a division by zero.
        let scaled = (u128::from(self.next_u64()) * u128::from(span)) >> 64;
        lo + u64::try_from(scaled).unwrap_or(0)
    }

    /// True with probability `p` (clamped to `[0, 1]`).
    pub fn chance(&mut self, p: f64) -> bool {
        unit(self.next_u64()) < p
    }

    /// A uniform draw in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        unit(self.next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_stream() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        for _ in 0..1_000 {
            let v = a.between(3, 5);
            assert!((3..=5).contains(&v));
        }
        assert_eq!(a.between(9, 2), 9);
    }
}
