//! Splitting a sweep's seed range between machines: `slice:M/N` runs the
//! M-th of N contiguous slices, `hash:M/N` the seeds whose hash falls in
//! part M. The N parts of either kind are disjoint and together cover the
//! range, so N machines given M = 1..=N run every seed exactly once.

use std::fmt;
use std::ops::Range;

/// Most parts a range may be split into (machines in one CI matrix).
pub const PARTS_MAX: u64 = 65_536;

/// Most seeds one sweep runs through (about a year of one core's time).
pub const SWEEP_SEEDS_MAX: u64 = 100_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Partition {
    /// Part `index` (1-based) of `count` contiguous slices, sizes within one.
    Slice { index: u64, count: u64 },
    /// The seeds whose hash is `index - 1` modulo `count`: parts that mix
    /// early and late seeds, whatever the range.
    Hash { index: u64, count: u64 },
}

impl Partition {
    /// `slice:M/N` or `hash:M/N` with 1 <= M <= N.
    pub fn parse(text: &str) -> Result<Partition, String> {
        let (kind, part) = text
            .split_once(':')
            .ok_or_else(|| format!("{text:?} is not KIND:M/N (slice:1/4, hash:2/3)"))?;
        let (index, count) = part
            .split_once('/')
            .ok_or_else(|| format!("{part:?} in {text:?} is not M/N"))?;
        let number = |what: &str, n: &str| {
            n.trim()
                .parse::<u64>()
                .map_err(|_| format!("{what} {n:?} in {text:?} is not a whole number"))
        };
        let (index, count) = (number("M", index)?, number("N", count)?);
        if count == 0 || count > PARTS_MAX {
            return Err(format!("N in {text:?} must be 1..={PARTS_MAX}"));
        }
        if index == 0 || index > count {
            return Err(format!(
                "M in {text:?} must be 1..={count} (M counts from 1)"
            ));
        }
        match kind {
            "slice" => Ok(Partition::Slice { index, count }),
            "hash" => Ok(Partition::Hash { index, count }),
            _ => Err(format!("unknown partition kind {kind:?} (slice or hash)")),
        }
    }

    /// The part of `range` a sweep walks: the slice, or the whole range for
    /// hash parts (which [`Partition::contains`] then filters).
    pub fn walk(&self, range: &Range<u64>) -> Range<u64> {
        match *self {
            Partition::Slice { index, count } => {
                let total = u128::from(range.end - range.start);
                let at = |i: u64| range.start + (total * u128::from(i) / u128::from(count)) as u64;
                at(index - 1)..at(index)
            }
            Partition::Hash { .. } => range.clone(),
        }
    }

    /// Whether `seed`, inside the walked range, belongs to this part.
    pub fn contains(&self, seed: u64) -> bool {
        match *self {
            Partition::Slice { .. } => true,
            Partition::Hash { index, count } => mix64(seed) % count == index - 1,
        }
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Partition::Slice { index, count } => write!(f, "slice:{index}/{count}"),
            Partition::Hash { index, count } => write!(f, "hash:{index}/{count}"),
        }
    }
}

/// The seeds one sweep runs: a range, perhaps one part of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedSet {
    pub range: Range<u64>,
    pub partition: Option<Partition>,
}

impl SeedSet {
    /// `count` seeds from `start`, or the error a user should see.
    pub fn new(start: u64, count: u64, partition: Option<Partition>) -> Result<SeedSet, String> {
        if count > SWEEP_SEEDS_MAX {
            return Err(format!(
                "--seeds {count}: at most {SWEEP_SEEDS_MAX} per sweep"
            ));
        }
        let end = start
            .checked_add(count)
            .ok_or_else(|| format!("--seed-start {start} + --seeds {count} overflows u64"))?;
        Ok(SeedSet {
            range: start..end,
            partition,
        })
    }

    /// The seeds to walk; [`SeedSet::contains`] says which of them run.
    pub fn walk(&self) -> Range<u64> {
        match &self.partition {
            Some(p) => p.walk(&self.range),
            None => self.range.clone(),
        }
    }

    pub fn contains(&self, seed: u64) -> bool {
        self.partition.is_none_or(|p| p.contains(seed))
    }

    /// How many seeds run.
    pub fn len(&self) -> u64 {
        match self.partition {
            None | Some(Partition::Slice { .. }) => {
                let walk = self.walk();
                walk.end - walk.start
            }
            Some(_) => self.walk().filter(|s| self.contains(*s)).count() as u64,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// "seeds 1..201" or "seeds 1..201, part slice:2/4 (51..101)".
    pub fn describe(&self) -> String {
        let range = format!("seeds {}..{}", self.range.start, self.range.end);
        match self.partition {
            None => range,
            Some(p @ Partition::Slice { .. }) => {
                let walk = self.walk();
                format!("{range}, part {p} ({}..{})", walk.start, walk.end)
            }
            Some(p @ Partition::Hash { .. }) => {
                format!("{range}, part {p} ({} seeds by hash)", self.len())
            }
        }
    }
}

/// SplitMix64's finaliser: a fixed, well-mixed hash, so a part holds the
/// same seeds on every machine and in every build.
fn mix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seeds(set: &SeedSet) -> Vec<u64> {
        set.walk().filter(|s| set.contains(*s)).collect()
    }

    /// For both kinds and several shapes of range: the N parts are
    /// disjoint, their union is the range, and `len` counts each part.
    #[test]
    fn parts_are_disjoint_and_cover_the_range() {
        for (start, count) in [(1, 200), (7, 3), (0, 0), (1000, 17), (u64::MAX - 9, 9)] {
            for n in [1, 2, 3, 4, 7] {
                for kind in ["slice", "hash"] {
                    let mut all = Vec::new();
                    for m in 1..=n {
                        let p = Partition::parse(&format!("{kind}:{m}/{n}")).unwrap();
                        let set = SeedSet::new(start, count, Some(p)).unwrap();
                        let part = seeds(&set);
                        assert_eq!(part.len() as u64, set.len(), "{p} of {start}+{count}");
                        all.extend(part);
                    }
                    all.sort_unstable();
                    let whole: Vec<u64> = (start..start + count).collect();
                    assert_eq!(all, whole, "{kind} into {n} of {start}+{count}");
                }
            }
        }
    }

    #[test]
    fn slices_are_contiguous_and_even() {
        let sizes: Vec<u64> = (1..=3)
            .map(|m| {
                let p = Partition::Slice { index: m, count: 3 };
                let walk = p.walk(&(10..20));
                walk.end - walk.start
            })
            .collect();
        assert_eq!(sizes, [3, 3, 4]);
        let p = Partition::parse("slice:2/3").unwrap();
        assert_eq!(p.walk(&(10..20)), 13..16);
    }

    /// Hash parts do not depend on the range: a seed is in the same part
    /// whether the sweep starts at 1 or at 100.
    #[test]
    fn hash_parts_follow_the_seed_not_the_range() {
        let p = Partition::parse("hash:2/3").unwrap();
        let a = SeedSet::new(1, 200, Some(p)).unwrap();
        let b = SeedSet::new(100, 50, Some(p)).unwrap();
        for seed in 100..150 {
            assert_eq!(a.contains(seed), b.contains(seed));
        }
        // Roughly a third each, not all in one part.
        assert!((50..85).contains(&a.len()), "{}", a.len());
    }

    #[test]
    fn bad_partitions_are_named() {
        let cases = [
            ("slice", "KIND:M/N"),
            ("slice:1", "M/N"),
            ("slice:a/4", "M \"a\""),
            ("slice:1/b", "N \"b\""),
            ("slice:0/4", "counts from 1"),
            ("slice:5/4", "1..=4"),
            ("slice:1/0", "N in"),
            ("slice:1/100000", "N in"),
            ("range:1/4", "\"range\""),
        ];
        for (text, named) in cases {
            let e = Partition::parse(text).unwrap_err();
            assert!(e.contains(named), "{text}: {e}");
        }
        assert!(SeedSet::new(u64::MAX, 2, None)
            .unwrap_err()
            .contains("overflows"));
        assert!(SeedSet::new(1, SWEEP_SEEDS_MAX + 1, None).is_err());
    }

    #[test]
    fn descriptions_name_the_part() {
        let slice = SeedSet::new(1, 200, Partition::parse("slice:2/4").ok()).unwrap();
        assert_eq!(slice.describe(), "seeds 1..201, part slice:2/4 (51..101)");
        let hash = SeedSet::new(1, 200, Partition::parse("hash:1/2").ok()).unwrap();
        assert!(hash.describe().starts_with("seeds 1..201, part hash:1/2 ("));
        assert_eq!(SeedSet::new(5, 3, None).unwrap().describe(), "seeds 5..8");
    }
}
