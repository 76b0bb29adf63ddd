//! A small seeded generator (splitmix64): the load's choices repeat from a seed, with no
//! dependency for it.

/// A seeded generator: the same seed gives the same numbers.
#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True once in `n` times.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

/// The seed named by the environment variable `name`, or else one from the clock (print it:
/// setting the variable to it repeats the run's choices).
pub fn seed_from_env(name: &str) -> u64 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        now.map_or(1, |since| since.as_nanos() as u64)
    })
}
