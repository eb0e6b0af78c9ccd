//! Counter-based randomness: every draw is a pure function of (seed, stream, index).
//!
//! Nothing random depends on thread timing or on how many draws someone else made: the
//! shard order of an epoch is drawn from (seed, epoch), a shuffle buffer's k-th pick from
//! (seed, epoch, k), a random operator's generator for a sample from (seed, epoch, the
//! sample's position). So results are the same whatever the parallelism, and a resumed
//! pipeline continues with the very draws it would have made.

/// SplitMix64's finaliser: a strong 64-bit mix.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hashes several words into one.
pub fn hash(words: &[u64]) -> u64 {
    words
        .iter()
        .fold(0x243f_6a88_85a3_08d3, |h, &w| mix(h ^ mix(w)))
}

/// A small generator (SplitMix64) for one sample or one decision.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded from `words`.
    pub fn from_words(words: &[u64]) -> Rng {
        Rng { state: hash(words) }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), without modulo bias worth speaking of (Lemire's method).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A seeded permutation of `0..n` (Fisher-Yates).
pub fn permutation(n: usize, words: &[u64]) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    let mut rng = Rng::from_words(words);
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_are_permutations_and_differ_by_seed() {
        let a = permutation(1000, &[1, 0]);
        let b = permutation(1000, &[1, 1]);
        let mut s = a.clone();
        s.sort_unstable();
        assert_eq!(s, (0..1000).collect::<Vec<u32>>());
        assert_ne!(a, b);
        assert_eq!(a, permutation(1000, &[1, 0]));
    }

    #[test]
    fn below_stays_in_range() {
        let mut r = Rng::from_words(&[7]);
        for n in 1..200 {
            assert!(r.below(n) < n);
        }
    }
}
