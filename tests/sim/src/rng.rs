//! The simulator's one source of chance: splitmix64, written out here so that a seed
//! draws the same sequence on any machine and with any version of any dependency.
//! Every draw of a run comes from one [`Rng`], in the order the events are processed,
//! so the seed alone fixes the run.

/// A splitmix64 generator (Steele, Lea and Flood's 64-bit mixer over a Weyl sequence).
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi` (`lo` when `hi <= lo`). The multiply-shift keeps the slight
    /// bias of a 64-bit draw, which a simulation does not mind, and needs no loop.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        let span = hi - lo + 1;
        if span == 0 {
            return self.next_u64();
        }
        lo + ((u128::from(self.next_u64()) * u128::from(span)) >> 64) as u64
    }

    /// True with probability `per_million` / 1,000,000.
    pub fn chance(&mut self, per_million: u64) -> bool {
        self.between(0, 999_999) < per_million
    }

    /// An index below `len` (0 when `len` is 0).
    pub fn index(&mut self, len: usize) -> usize {
        self.between(0, (len as u64).saturating_sub(1)) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_of_a_seed_never_changes() {
        // splitmix64's published first outputs from seed 0.
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn between_stays_in_its_range() {
        let mut r = Rng::new(7);
        for _ in 0..10_000 {
            let x = r.between(3, 9);
            assert!((3..=9).contains(&x), "{x}");
        }
        assert_eq!(r.between(5, 5), 5);
        assert_eq!(r.between(5, 1), 5);
    }
}
