//! Incremental re-execution: a cache of layer outputs keyed by what determines them.
//!
//! A value's *signature* hashes everything its bits depend on: the producing layer, its
//! treatment under the plan (precision, how each input is rounded or quantized, the
//! accumulator) and, recursively, the signatures of the layer's inputs; a graph input's
//! signature names the input set. Kernels are deterministic, so two runs that give a value the
//! same signature give it the same bits, and the second run can take it from the cache instead
//! of executing the layer. A precision search exploits this: a candidate that marks a prefix in
//! FP32 finds that prefix in the cache from the reference run, one that leaves a prefix in low
//! precision finds it from the all-low run, and repeated candidates find their own earlier
//! layers.
//!
//! The cache is bounded by a byte budget. When full, it evicts first the entries that were
//! never reused, and among those the cheapest to recompute per byte freed (FLOPs of the
//! producing layer over the size of its output).

use crate::precision::Precision;
use crate::tensor::Tensor;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// A 64-bit value signature (see the module docs).
pub type Signature = u64;

/// FNV-1a over bytes: stable across machines and runs (std's hasher is not guaranteed to be).
pub(crate) fn hash_str(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Mixes `x` into `h` (splitmix64 finalizer over the sum): order-sensitive and well spread.
pub(crate) fn mix(h: u64, x: u64) -> u64 {
    let mut z = h.rotate_left(5) ^ x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

struct Entry {
    tensor: Arc<Tensor>,
    /// The float precision the value is already rounded to (lets consumers skip re-rounding).
    mark: Option<Precision>,
    bytes: usize,
    /// FLOPs to recompute the producing layer (at least its output size).
    cost: u64,
    reuses: u64,
    /// The run that last pinned this entry: it must stay until that run has fetched it.
    pinned: u64,
}

/// Counters of a cache's life, for reports and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Layers (nodes) executed by cached runs.
    pub executed: u64,
    /// Layers whose outputs came from the cache instead.
    pub reused: u64,
    /// Entries evicted to stay within the budget.
    pub evictions: u64,
    /// Entries not stored because they alone exceed the budget.
    pub too_large: u64,
    /// The largest number of bytes held at once.
    pub peak_bytes: usize,
}

impl Entry {
    /// Where the entry stands in eviction order (cheapest to lose first): never-reused entries
    /// first, then the lowest recompute cost per byte (a positive f64, whose bits order as it
    /// does), then the signature, so the choice is deterministic.
    fn eviction_key(&self, sig: Signature) -> (bool, u64, Signature) {
        (
            self.reuses > 0,
            (self.cost as f64 / self.bytes as f64).to_bits(),
            sig,
        )
    }
}

/// Layer outputs from earlier runs, by signature, within a byte budget.
pub struct ValueCache {
    entries: HashMap<Signature, Entry>,
    /// Every entry's [`Entry::eviction_key`], in eviction order: an eviction takes the first
    /// unpinned one instead of scanning every entry (PP-OCRv4 det's strict search evicts
    /// 21 thousand times; the scan was 12 % of its time).
    eviction_order: BTreeSet<(bool, u64, Signature)>,
    bytes: usize,
    budget: usize,
    run: u64,
    pub stats: CacheStats,
    /// FLOPs of every layer executed so far, by node index (known once a run executed it).
    pub layer_flops: HashMap<usize, u64>,
}

impl ValueCache {
    /// An empty cache that holds at most `budget` bytes of tensors.
    pub fn new(budget: usize) -> ValueCache {
        ValueCache {
            entries: HashMap::new(),
            eviction_order: BTreeSet::new(),
            bytes: 0,
            budget,
            run: 0,
            stats: CacheStats::default(),
            layer_flops: HashMap::new(),
        }
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Changes the budget, evicting (least valuable first) until the held bytes fit.
    pub fn set_budget(&mut self, budget: usize) {
        self.budget = budget;
        self.run += 1; // nothing is pinned between runs
        while self.bytes > self.budget && self.evict_one() {}
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A cache for a run made at the same time as this one's (`--jobs`): it starts with every
    /// entry of this one, sharing their tensors, under the same budget. [`absorb`](Self::absorb)
    /// brings back what its runs added.
    pub fn fork(&self) -> ValueCache {
        ValueCache {
            entries: self
                .entries
                .iter()
                .map(|(s, e)| {
                    (
                        *s,
                        Entry {
                            tensor: e.tensor.clone(),
                            pinned: 0,
                            ..*e
                        },
                    )
                })
                .collect(),
            eviction_order: self.eviction_order.clone(),
            bytes: self.bytes,
            budget: self.budget,
            run: self.run,
            stats: CacheStats::default(),
            layer_flops: self.layer_flops.clone(),
        }
    }

    /// Takes in a [`fork`](Self::fork)'s new entries (in signature order, so what is kept
    /// does not depend on hash order), its reuse counts and its counters.
    pub fn absorb(&mut self, fork: ValueCache) {
        self.run += 1; // nothing is pinned between runs
        let mut fresh = Vec::new();
        for (sig, e) in fork.entries {
            match self.entries.get(&sig) {
                Some(mine) => self.set_reuses(sig, mine.reuses.max(e.reuses)),
                None => fresh.push((sig, e)),
            }
        }
        fresh.sort_unstable_by_key(|(sig, _)| *sig);
        for (sig, e) in fresh {
            self.insert(sig, &e.tensor, e.mark, e.cost);
            self.set_reuses(sig, e.reuses);
        }
        let f = fork.stats;
        self.stats.executed += f.executed;
        self.stats.reused += f.reused;
        self.stats.evictions += f.evictions;
        self.stats.too_large += f.too_large;
        // The fork's peak counts the tensors it shared with this cache, once.
        self.stats.peak_bytes = self.stats.peak_bytes.max(f.peak_bytes);
        self.layer_flops.extend(fork.layer_flops);
    }

    pub(crate) fn contains(&self, sig: Signature) -> bool {
        self.entries.contains_key(&sig)
    }

    /// Starts a run: the entries it will fetch are pinned until the next run starts.
    pub(crate) fn begin_run(&mut self) {
        self.run += 1;
    }

    pub(crate) fn pin(&mut self, sig: Signature) {
        if let Some(e) = self.entries.get_mut(&sig) {
            e.pinned = self.run;
        }
    }

    /// A copy of a cached value and its rounding mark.
    pub(crate) fn fetch(&mut self, sig: Signature) -> Option<(Arc<Tensor>, Option<Precision>)> {
        let e = self.entries.get(&sig)?;
        let found = (e.tensor.clone(), e.mark);
        self.set_reuses(sig, e.reuses + 1);
        Some(found)
    }

    /// Records a hit without copying (the value is not needed by this run).
    pub(crate) fn touch(&mut self, sig: Signature) {
        if let Some(e) = self.entries.get(&sig) {
            self.set_reuses(sig, e.reuses + 1);
        }
    }

    /// Sets an entry's reuse count, keeping its place in the eviction order.
    fn set_reuses(&mut self, sig: Signature, reuses: u64) {
        if let Some(e) = self.entries.get_mut(&sig) {
            let before = e.eviction_key(sig);
            e.reuses = reuses;
            let after = e.eviction_key(sig);
            if before != after {
                self.eviction_order.remove(&before);
                self.eviction_order.insert(after);
            }
        }
    }

    /// Stores a value, evicting others as the budget requires. A value larger than the whole
    /// budget is not stored.
    pub(crate) fn insert(
        &mut self,
        sig: Signature,
        tensor: &Arc<Tensor>,
        mark: Option<Precision>,
        cost: u64,
    ) {
        if self.entries.contains_key(&sig) {
            return;
        }
        let bytes = tensor.len() * tensor.dtype().size().max(1) + 64;
        if bytes > self.budget {
            self.stats.too_large += 1;
            return;
        }
        while self.bytes + bytes > self.budget {
            if !self.evict_one() {
                // Everything left is pinned by this run: skip storing rather than overflow.
                self.stats.too_large += 1;
                return;
            }
        }
        self.bytes += bytes;
        self.stats.peak_bytes = self.stats.peak_bytes.max(self.bytes);
        let entry = Entry {
            tensor: tensor.clone(),
            mark,
            bytes,
            cost: cost.max(tensor.len() as u64),
            reuses: 0,
            pinned: 0,
        };
        self.eviction_order.insert(entry.eviction_key(sig));
        self.entries.insert(sig, entry);
    }

    /// Evicts the unpinned entry that is cheapest to lose ([`Entry::eviction_key`]).
    fn evict_one(&mut self) -> bool {
        let run = self.run;
        let victim = self
            .eviction_order
            .iter()
            .find(|&&(_, _, sig)| self.entries[&sig].pinned != run)
            .copied();
        match victim {
            Some(key) => {
                self.eviction_order.remove(&key);
                let e = self.entries.remove(&key.2).expect("victim exists");
                self.bytes -= e.bytes;
                self.stats.evictions += 1;
                true
            }
            None => false,
        }
    }
}

/// Parses a byte size: `512M`, `2G`, `2GiB`, `1500000`, `0` (no caching).
pub fn parse_bytes(s: &str) -> Option<usize> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    (n.is_finite() && n >= 0.0).then_some((n * mult) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: usize) -> Arc<Tensor> {
        Arc::new(Tensor::from_f32(vec![n], vec![1.0; n]))
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_bytes("512M"), Some(512 << 20));
        assert_eq!(parse_bytes("2GiB"), Some(2 << 30));
        assert_eq!(parse_bytes("1500"), Some(1500));
        assert_eq!(parse_bytes("0"), Some(0));
        assert_eq!(parse_bytes("x"), None);
        assert_eq!(parse_bytes("5T"), None);
    }

    #[test]
    fn a_fork_shares_the_entries_and_gives_back_what_it_added() {
        let mut c = ValueCache::new(10_000);
        c.begin_run();
        c.insert(1, &t(500), None, 1_000);
        let mut f = c.fork();
        assert!(f.contains(1) && f.bytes() == c.bytes());
        f.begin_run();
        assert!(f.fetch(1).is_some());
        f.insert(2, &t(500), None, 1_000);
        f.stats.executed = 3;
        // The main cache meanwhile stores something else.
        c.insert(3, &t(500), None, 1_000);
        assert!(!c.contains(2) && !f.contains(3));
        c.absorb(f);
        assert!(c.contains(1) && c.contains(2) && c.contains(3));
        assert_eq!(c.stats.executed, 3);
        // Shared tensors are not copied: the fork held the main cache's Arc.
        assert_eq!(c.entries[&1].reuses, 1);
        // Absorbing stays within the budget.
        let mut small = ValueCache::new(2_200);
        small.insert(1, &t(500), None, 1);
        let mut f = small.fork();
        f.set_budget(10_000);
        f.insert(5, &t(500), None, 1);
        f.insert(4, &t(500), None, 1);
        small.absorb(f);
        assert!(small.bytes() <= 2_200);
    }

    #[test]
    fn a_lower_budget_evicts_the_cheapest_until_it_fits() {
        let mut c = ValueCache::new(13_000);
        c.begin_run();
        c.insert(1, &t(1000), None, 1_000_000);
        c.insert(2, &t(1000), None, 1_000);
        c.insert(3, &t(1000), None, 500_000);
        c.set_budget(9_000);
        assert!(c.bytes() <= 9_000 && c.budget() == 9_000);
        assert!(!c.contains(2) && c.contains(1) && c.contains(3));
        c.set_budget(0);
        assert!(c.is_empty());
    }

    #[test]
    fn budget_is_never_exceeded_and_cheap_entries_go_first() {
        // Three 4 KB entries fit in 13 KB; a fourth forces one out.
        let mut c = ValueCache::new(13_000);
        c.begin_run();
        c.insert(1, &t(1000), None, 1_000_000); // expensive (a conv)
        c.insert(2, &t(1000), None, 1_000); // cheap (elementwise)
        c.insert(3, &t(1000), None, 500_000);
        assert_eq!(c.len(), 3);
        c.insert(4, &t(1000), None, 2_000);
        assert!(c.bytes() <= 13_000);
        assert!(!c.contains(2), "the cheapest entry is evicted");
        assert!(c.contains(1) && c.contains(3) && c.contains(4));
        assert_eq!(c.stats.evictions, 1);
    }

    #[test]
    fn reused_entries_outlive_unreused_ones_and_pins_hold() {
        let mut c = ValueCache::new(9_000);
        c.begin_run();
        c.insert(1, &t(1000), None, 10);
        c.insert(2, &t(1000), None, 1_000_000);
        c.fetch(1);
        c.begin_run();
        c.pin(1);
        c.pin(2);
        // Both entries are pinned by this run: the newcomer is dropped.
        c.insert(3, &t(1000), None, 5);
        assert!(c.contains(1) && c.contains(2));
        c.begin_run();
        c.insert(3, &t(1000), None, 5);
        assert!(c.contains(1), "reused entry kept");
        assert!(!c.contains(2), "never-reused entry evicted first");
        assert!(c.contains(3));
    }

    /// The eviction order's victim is the one a scan of every entry picks (never-reused
    /// first, then the lowest cost per byte, then the signature; pinned entries skipped), over
    /// a long mixed sequence of stores, hits, runs, pins, forks and budget changes.
    #[test]
    fn the_eviction_order_picks_what_a_scan_of_every_entry_picks() {
        fn scan_victim(c: &ValueCache) -> Option<Signature> {
            c.entries
                .iter()
                .filter(|(_, e)| e.pinned != c.run)
                .min_by(|(sa, a), (sb, b)| {
                    let ka = (a.reuses > 0, a.cost as f64 / a.bytes as f64);
                    let kb = (b.reuses > 0, b.cost as f64 / b.bytes as f64);
                    ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1)).then(sa.cmp(sb))
                })
                .map(|(s, _)| *s)
        }
        fn consistent(c: &ValueCache) {
            let keys: BTreeSet<_> = c.entries.iter().map(|(s, e)| e.eviction_key(*s)).collect();
            assert_eq!(keys, c.eviction_order);
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let mut c = ValueCache::new(40_000);
        let mut evictions = 0;
        for step in 0..4000 {
            match next(10) {
                0..=3 => {
                    let sig = next(300);
                    let size = 100 + next(2000) as usize;
                    let before = scan_victim(&c);
                    let needs_room = c.bytes + size * 4 + 64 > c.budget && !c.contains(sig);
                    let evicted_before = c.stats.evictions;
                    c.insert(sig, &t(size), None, next(1_000_000));
                    if needs_room && c.stats.evictions > evicted_before {
                        // The first entry to go was the scan's choice.
                        assert!(!c.contains(before.unwrap()), "step {step}");
                        evictions += 1;
                    }
                }
                4..=5 => {
                    c.fetch(next(300));
                }
                6 => c.touch(next(300)),
                7 => c.begin_run(),
                8 => c.pin(next(300)),
                _ => {
                    if next(4) == 0 {
                        let mut f = c.fork();
                        f.begin_run();
                        f.insert(1000 + next(50), &t(500), None, next(1000));
                        f.fetch(next(300));
                        c.absorb(f);
                    } else {
                        c.set_budget(20_000 + next(40_000) as usize);
                    }
                }
            }
            consistent(&c);
            assert!(c.bytes <= c.budget);
        }
        assert!(evictions > 100, "{evictions} evictions checked");
    }

    #[test]
    fn oversize_values_are_not_stored() {
        let mut c = ValueCache::new(100);
        c.insert(1, &t(1000), None, 1);
        assert!(c.is_empty());
        assert_eq!(c.stats.too_large, 1);
    }

    #[test]
    fn hashing_is_stable() {
        // Fixed values: a change here changes every signature (and would be a format break
        // only for in-memory caches, but it should be deliberate).
        assert_eq!(hash_str(""), 0xcbf2_9ce4_8422_2325);
        assert_ne!(mix(1, 2), mix(2, 1));
    }
}

#[cfg(test)]
mod run_tests {
    use super::ValueCache;
    use crate::exec::{Feeds, Interpreter, PlanOptions, PreparedPlan, RunOptions};
    use crate::graph::testing::chain;
    use crate::precision::{plan::PrecisionPlan, Precision};
    use crate::tensor::Tensor;

    fn plan_marking(layers: usize, fp32: &[usize]) -> PrecisionPlan {
        let mut p = vec![Precision::Float16; layers];
        for &i in fp32 {
            p[i] = Precision::Float32;
        }
        PrecisionPlan::from_layers(p)
    }

    #[test]
    fn cached_runs_equal_uncached_runs_and_skip_unchanged_prefixes() {
        let g = chain(64, 6); // 18 layers
        let interp = Interpreter::new(&g).unwrap();
        let mut feeds = Feeds::new();
        let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        feeds.insert("x".into(), Tensor::from_f32(vec![64], x));
        let mut cache = ValueCache::new(1 << 20);
        let opts = RunOptions::default();
        // The FP32 reference seeds the cache.
        let reference = interp
            .run_cached(&feeds, 0, &opts, None, &mut cache)
            .unwrap();
        assert_eq!(cache.stats.executed, 18);
        assert_eq!(
            reference.outputs[0].1.as_f32(),
            interp.run(&feeds).unwrap().outputs[0].1.as_f32()
        );
        // Marking the first 9 layers FP32 reuses them from the reference run.
        for (marked, executed) in [(9usize, 9u64), (0, 18), (12, 6), (18, 0)] {
            let before = cache.stats.executed;
            let plan = plan_marking(18, &(0..marked).collect::<Vec<_>>());
            let prepared = PreparedPlan::new(&g, &plan, &PlanOptions::default()).unwrap();
            let got = interp
                .run_cached(&feeds, 0, &opts, Some(&prepared), &mut cache)
                .unwrap();
            let want = interp.run_plan(&feeds, &opts, &prepared).unwrap();
            assert_eq!(
                got.outputs[0].1.as_f32(),
                want.outputs[0].1.as_f32(),
                "{marked} marked"
            );
            assert_eq!(cache.stats.executed - before, executed, "{marked} marked");
        }
        // A marked suffix reuses the all-FP16 prefix (run above with 0 marked).
        let before = cache.stats.executed;
        let plan = plan_marking(18, &(15..18).collect::<Vec<_>>());
        let prepared = PreparedPlan::new(&g, &plan, &PlanOptions::default()).unwrap();
        interp
            .run_cached(&feeds, 0, &opts, Some(&prepared), &mut cache)
            .unwrap();
        assert_eq!(cache.stats.executed - before, 3);
        // Other inputs share nothing.
        let before = cache.stats.executed;
        interp
            .run_cached(&feeds, 1, &opts, None, &mut cache)
            .unwrap();
        assert_eq!(cache.stats.executed - before, 18);
    }

    #[test]
    fn a_tiny_budget_still_gives_correct_results() {
        let g = chain(256, 4);
        let interp = Interpreter::new(&g).unwrap();
        let mut feeds = Feeds::new();
        feeds.insert("x".into(), Tensor::from_f32(vec![256], vec![0.5; 256]));
        let mut cache = ValueCache::new(3000); // about two values
        let opts = RunOptions::default();
        interp
            .run_cached(&feeds, 0, &opts, None, &mut cache)
            .unwrap();
        for marked in [0usize, 6, 3, 12] {
            let plan = plan_marking(12, &(0..marked).collect::<Vec<_>>());
            let prepared = PreparedPlan::new(&g, &plan, &PlanOptions::default()).unwrap();
            let got = interp
                .run_cached(&feeds, 0, &opts, Some(&prepared), &mut cache)
                .unwrap();
            let want = interp.run_plan(&feeds, &opts, &prepared).unwrap();
            assert_eq!(got.outputs[0].1.as_f32(), want.outputs[0].1.as_f32());
            assert!(cache.bytes() <= 3000);
        }
        assert!(cache.stats.evictions > 0);
    }
}
