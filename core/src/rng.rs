//! A small seeded pseudo-random generator (SplitMix64): the same seed replays the same run.
//!
//! # Why not a crate
//!
//! The generator is SplitMix64 (Steele, Lea and Flood; the constants of Vigna's reference
//! code), a few lines of arithmetic. `rand_xoshiro::SplitMix64` is the same algorithm, with
//! the same outputs, but would bring `rand_core` in for its trait alone; generators with a
//! better reputation (xoshiro, PCG, `oorandom`, `fastrand`) would give other numbers for the
//! same seed, and so would `rand`'s range sampling, whose reduction differs from
//! [`Rng::below_or_eq`]. A seed given to a scheduler (`--seed`) must replay the same
//! jitter in every version, so the sequence is pinned by a test against the reference
//! outputs, and nothing here needs more than SplitMix64's quality: retry jitter and hasher
//! keys, not security.

/// SplitMix64. Not cryptographic; used for retry jitter and hasher keys derived from a
/// caller-supplied seed.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform value in `0..=max`.
    pub fn below_or_eq(&mut self, max: u64) -> u64 {
        if max == u64::MAX {
            return self.next_u64();
        }
        // Multiply-shift reduction; the bias is below 2^-64 * max, irrelevant for jitter.
        ((u128::from(self.next_u64()) * u128::from(max + 1)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_the_reference_splitmix64() {
        let mut r = Rng::new(0);
        assert_eq!(
            [r.next_u64(), r.next_u64(), r.next_u64()],
            [
                0xE220_A839_7B1D_CDAF,
                0x6E78_9E6A_A1B9_65F4,
                0x06C4_5D18_8009_454F
            ]
        );
        // And the jitter drawn from a seed (multiply-shift reduction).
        let mut r = Rng::new(42);
        let draws: [u64; 5] = core::array::from_fn(|_| r.below_or_eq(1000));
        assert_eq!(draws, [742, 160, 278, 344, 38]);
    }

    #[test]
    fn same_seed_same_sequence() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut c = Rng::new(1);
        for _ in 0..1000 {
            assert!(c.below_or_eq(10) <= 10);
        }
    }
}
