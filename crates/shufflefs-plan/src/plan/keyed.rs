//! A keyed pseudo-random permutation of `0..n`, evaluated one index at a time in O(1)
//! memory, both ways.
//!
//! Why: the plan today materialises whole permutations (epoch 0 shuffles every sample id,
//! each exchange slot shuffles every rank), so every rank pays O(N) memory and O(N) time per
//! epoch for the whole job's plan. With a permutation that is evaluated per index, rank `r`
//! can compute the part it needs alone: the ids of its epoch-0 chunk (`apply` over its
//! positions), where its `i`-th outgoing sample goes (`apply(r)` of slot `i`'s permutation of
//! the ranks) and who sends to it (`invert(r)`), in O(share) for the whole epoch.
//! Grain and tf.data shuffle the same way (a Feistel network with cycle-walking).
//!
//! # Construction
//! A Feistel network of [`ROUNDS`] rounds on `b` bits, `b` the width of `n - 1` (at least
//! 2), is a permutation of `0..2^b`; cycle-walking (apply again while the result is `>= n`)
//! restricts it to a permutation of `0..n`. Since `2^b < 2n`, a walk takes under 2 steps on
//! average. When `b` is odd the halves differ by one bit and trade widths every round (an
//! unbalanced Feistel network is still a bijection, and it halves the walk of a balanced one
//! on `b + 1` bits). The round function mixes the right half with a round key through the
//! SplitMix64 finaliser; the keys come from the plan's ChaCha8 stream for
//! `(seed, domain, a, b)`, and a tweak (one per exchange slot, per rank) is one more mixed
//! word in every round, so tweaking costs one mix, not a fresh key stream. Both the mix and
//! the keys are fixed here (no crate's algorithm that could change between releases), so a
//! cache planned by one build plans identically under the next.

use super::stream;
use rand_core::Rng;

/// Feistel rounds: 4 make a pseudo-random permutation in theory (Luby-Rackoff); 8 leave
/// room for the weak round function, at two multiplications a round.
const ROUNDS: usize = 8;
const _: () = assert!(
    ROUNDS.is_multiple_of(2),
    "backward assumes the halves end as they start"
);

/// A permutation of `0..n` keyed by the plan's seed and a tuple naming its use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyedPermutation {
    n: u64,
    /// Bits of the Feistel network's domain.
    bits: u32,
    keys: [u64; ROUNDS],
    /// Mixed into every round ([`KeyedPermutation::tweaked`]); 0 for none.
    tweak: u64,
}

impl KeyedPermutation {
    /// The permutation of `0..n` for `(seed, domain, a, b)`: distinct tuples give independent
    /// permutations, as distinct [`stream`]s do.
    pub fn new(n: u64, seed: u64, domain: u64, a: u64, b: u64) -> KeyedPermutation {
        let bits = (64 - n.saturating_sub(1).leading_zeros()).max(2);
        let mut rng = stream(seed, domain, a, b);
        let keys = std::array::from_fn(|_| rng.next_u64());
        KeyedPermutation {
            n,
            bits,
            keys,
            tweak: 0,
        }
    }

    /// An independent permutation of the same size for `tweak` (e.g. one per exchange
    /// slot), without a fresh ChaCha8 stream: one mix of the tweak enters every round.
    pub fn tweaked(&self, tweak: u64) -> KeyedPermutation {
        KeyedPermutation {
            tweak: mix(tweak ^ 0x5446_5745_414B_0001),
            ..*self
        }
    }

    /// How many indices it permutes.
    pub fn len(&self) -> u64 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Where index `x` (`< n`) goes.
    pub fn apply(&self, x: u64) -> u64 {
        debug_assert!(x < self.n, "{x} is outside 0..{}", self.n);
        let mut y = x;
        loop {
            y = self.forward(y);
            if y < self.n {
                return y;
            }
        }
    }

    /// The index that goes to `y` (`< n`): `invert(apply(x)) == x`.
    pub fn invert(&self, y: u64) -> u64 {
        debug_assert!(y < self.n, "{y} is outside 0..{}", self.n);
        let mut x = y;
        loop {
            x = self.backward(x);
            if x < self.n {
                return x;
            }
        }
    }

    /// The round function for round `i` on a half `half`, cut to `width` bits.
    fn round(&self, i: usize, half: u64, width: u32) -> u64 {
        let t = self.tweak.rotate_left(8 * i as u32);
        mix(half ^ self.keys[i] ^ t) & mask(width)
    }

    /// Widths of the left and right halves at the start (the right one takes the odd bit).
    fn widths(&self) -> (u32, u32) {
        (self.bits / 2, self.bits - self.bits / 2)
    }

    fn forward(&self, x: u64) -> u64 {
        let (mut lw, mut rw) = self.widths();
        let (mut left, mut right) = (x >> rw, x & mask(rw));
        for i in 0..ROUNDS {
            (left, right) = (right, left ^ self.round(i, right, lw));
            (lw, rw) = (rw, lw);
        }
        (left << rw) | right
    }

    fn backward(&self, y: u64) -> u64 {
        // ROUNDS is even, so the halves end with the widths they started with.
        let (mut lw, mut rw) = self.widths();
        let (mut left, mut right) = (y >> rw, y & mask(rw));
        for i in (0..ROUNDS).rev() {
            // Before round i: right was `left` now, left was `right ^ f(left)`.
            (lw, rw) = (rw, lw);
            (left, right) = (right ^ self.round(i, left, lw), left);
        }
        (left << rw) | right
    }
}

/// The low `width` bits (`width < 64`).
fn mask(width: u32) -> u64 {
    (1u64 << width) - 1
}

/// The SplitMix64 finaliser: every input bit reaches every output bit.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(p: &KeyedPermutation) -> Vec<u64> {
        (0..p.len()).map(|x| p.apply(x)).collect()
    }

    #[test]
    fn every_size_is_a_bijection_and_inverts() {
        for n in (1..70).chain([255, 256, 257, 1000, 4096, 4097]) {
            let p = KeyedPermutation::new(n, 7, 1, 2, 3);
            let mut seen = image(&p);
            for (x, &y) in seen.iter().enumerate() {
                assert_eq!(p.invert(y), x as u64, "n {n}");
            }
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n {n}");
        }
    }

    #[test]
    fn the_same_key_gives_the_same_permutation_and_others_differ() {
        let n = 1000;
        let a = image(&KeyedPermutation::new(n, 7, 1, 2, 3));
        assert_eq!(a, image(&KeyedPermutation::new(n, 7, 1, 2, 3)));
        for other in [(8, 1, 2, 3), (7, 2, 2, 3), (7, 1, 3, 3), (7, 1, 2, 4)] {
            let (s, d, x, y) = other;
            let b = image(&KeyedPermutation::new(n, s, d, x, y));
            let same = a.iter().zip(&b).filter(|(p, q)| p == q).count();
            // Two independent permutations agree on about one index.
            assert!(same < 10, "{other:?}: {same} fixed points in common");
        }
    }

    /// Pinned outputs: a cache planned by this build must plan the same under the next, so
    /// the construction may never change silently.
    #[test]
    fn outputs_are_pinned() {
        let p = KeyedPermutation::new(5_000_000_000, 42, 9, 0, 0);
        let got: Vec<u64> = (0..4).map(|x| p.apply(x)).collect();
        let again: Vec<u64> = (0..4).map(|x| p.apply(x)).collect();
        assert_eq!(got, again);
        assert!(got.iter().all(|&y| y < 5_000_000_000));
        assert_eq!(
            got.iter().map(|&y| p.invert(y)).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert_eq!(got, PINNED);
    }

    const PINNED: [u64; 4] = [4_078_861_258, 4_772_229_435, 767_280_814, 3_796_146_087];

    /// Where index 0 lands is close to uniform over many keys (a chi-square-like bound on
    /// 10 buckets of 0..1000 over 10,000 keys).
    #[test]
    fn images_are_spread_evenly() {
        let mut buckets = [0u32; 10];
        for key in 0..10_000 {
            let p = KeyedPermutation::new(1000, key, 1, 0, 0);
            buckets[(p.apply(0) / 100) as usize] += 1;
        }
        for b in buckets {
            assert!((850..1150).contains(&b), "{buckets:?}");
        }
    }

    #[test]
    fn tweaks_give_independent_bijections() {
        let base = KeyedPermutation::new(64, 7, 1, 0, 0);
        let a = image(&base.tweaked(1));
        let b = image(&base.tweaked(2));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..64).collect::<Vec<_>>());
        assert_ne!(a, b);
        assert_ne!(a, image(&base));
        assert_eq!(a, image(&base.tweaked(1)));
    }

    #[test]
    fn large_domains_hold_their_range() {
        for n in [u64::from(u32::MAX) + 2, 5_000_000_000, u64::MAX] {
            let p = KeyedPermutation::new(n, 1, 1, 1, 1);
            for x in [0, 1, n / 2, n - 1] {
                let y = p.apply(x);
                assert!(y < n);
                assert_eq!(p.invert(y), x);
            }
        }
    }
}
