//! The mesh's bookkeeping, as pure logic over CLOCK_MONOTONIC nanoseconds:
//! when each target is due, and which probes are in flight until when.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::Hash;
use std::time::Duration;

pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// First due time of the `index`-th of `count` targets added at `now`: spread
/// evenly over one interval so that many targets do not probe in a burst.
pub fn first_due(now: u64, interval: Duration, index: usize, count: usize) -> u64 {
    let count = count.max(1) as u128;
    let offset = nanos(interval) as u128 * (index as u128 % count) / count;
    now.saturating_add(offset as u64)
}

/// First due time, at or after `now`, of a target on the grid that
/// [`first_due`] lays out from `epoch`: targets resolved at different times
/// still keep their even spread.
pub fn phase_due(now: u64, epoch: u64, interval: Duration, index: usize, count: usize) -> u64 {
    let start = first_due(epoch, interval, index, count);
    if start >= now {
        return start;
    }
    let step = nanos(interval).max(1);
    start.saturating_add((now - start).div_ceil(step).saturating_mul(step))
}

/// One timer per key, ordered by time.
#[derive(Debug)]
pub struct Timers<K> {
    order: BTreeSet<(u64, K)>,
    at: HashMap<K, u64>,
}

impl<K: Ord + Hash + Copy> Default for Timers<K> {
    fn default() -> Self {
        Timers {
            order: BTreeSet::new(),
            at: HashMap::new(),
        }
    }
}

impl<K: Ord + Hash + Copy> Timers<K> {
    /// Sets (or moves) the timer of `key`.
    pub fn set(&mut self, key: K, at: u64) {
        if let Some(old) = self.at.insert(key, at) {
            self.order.remove(&(old, key));
        }
        self.order.insert((at, key));
    }

    pub fn remove(&mut self, key: K) {
        if let Some(old) = self.at.remove(&key) {
            self.order.remove(&(old, key));
        }
    }

    #[cfg(test)]
    pub fn get(&self, key: K) -> Option<u64> {
        self.at.get(&key).copied()
    }

    pub fn next_at(&self) -> Option<u64> {
        self.order.first().map(|(at, _)| *at)
    }

    /// The earliest timer due at `now`, removed, with its time.
    pub fn pop_due(&mut self, now: u64) -> Option<(K, u64)> {
        let &(at, key) = self.order.first()?;
        if at > now {
            return None;
        }
        self.order.remove(&(at, key));
        self.at.remove(&key);
        Some((key, at))
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.at.len()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent<K> {
    pub target: K,
    pub sent_ns: u64,
    pub expires_ns: u64,
    /// When its send completion was polled, if it was.
    pub send_done_ns: Option<u64>,
}

impl<K> Sent<K> {
    /// From posting to polling the send completion; for a probe answered at
    /// `answered_ns` before its send completion was polled, the RTT (the
    /// send completion comes no earlier).
    pub fn prober_delay_ns(&self, answered_ns: u64) -> u64 {
        self.send_done_ns
            .unwrap_or(answered_ns)
            .min(answered_ns)
            .saturating_sub(self.sent_ns)
    }
}

/// Probes waiting for their answer, by sequence number; they expire in the
/// order they were sent (one timeout for all).
#[derive(Debug)]
pub struct InFlight<K> {
    by_seq: HashMap<u64, Sent<K>>,
    order: VecDeque<(u64, u64)>,
    capacity: usize,
}

impl<K: Copy + PartialEq> InFlight<K> {
    pub fn new(capacity: usize) -> InFlight<K> {
        InFlight {
            by_seq: HashMap::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Records a probe; if the table is full, the oldest probe is given up
    /// and returned (it counts as lost).
    pub fn insert(
        &mut self,
        seq: u64,
        target: K,
        sent_ns: u64,
        timeout: Duration,
    ) -> Option<(u64, K)> {
        let mut evicted = None;
        if self.by_seq.len() >= self.capacity {
            evicted = self.pop_oldest();
        }
        let expires_ns = sent_ns.saturating_add(nanos(timeout));
        self.by_seq.insert(
            seq,
            Sent {
                target,
                sent_ns,
                expires_ns,
                send_done_ns: None,
            },
        );
        self.order.push_back((expires_ns, seq));
        evicted
    }

    fn pop_oldest(&mut self) -> Option<(u64, K)> {
        while let Some((_, seq)) = self.order.pop_front() {
            if let Some(sent) = self.by_seq.remove(&seq) {
                return Some((seq, sent.target));
            }
        }
        None
    }

    /// The send completion of probe `seq` was polled at `now` (the first
    /// one counts); `false` if the probe is not in flight (answered first,
    /// expired, forgotten).
    pub fn send_completed(&mut self, seq: u64, now: u64) -> bool {
        match self.by_seq.get_mut(&seq) {
            Some(sent) => {
                sent.send_done_ns.get_or_insert(now);
                true
            }
            None => false,
        }
    }

    /// The probe `seq` sent at `sent_ns` answered at `now`: `None` if
    /// unknown, already answered, or past its timeout (then it is left to
    /// expire as lost).
    pub fn answer(&mut self, seq: u64, sent_ns: u64, now: u64) -> Option<Sent<K>> {
        let sent = *self.by_seq.get(&seq)?;
        if now > sent.expires_ns || sent.sent_ns != sent_ns {
            return None;
        }
        self.by_seq.remove(&seq);
        Some(sent)
    }

    /// Probes past their timeout at `now`, oldest first.
    pub fn expire(&mut self, now: u64) -> Vec<(u64, K)> {
        let mut expired = Vec::new();
        while let Some(&(expires_ns, seq)) = self.order.front() {
            if !self.by_seq.contains_key(&seq) {
                self.order.pop_front();
                continue;
            }
            if expires_ns > now {
                break;
            }
            self.order.pop_front();
            if let Some(sent) = self.by_seq.remove(&seq) {
                expired.push((seq, sent.target));
            }
        }
        expired
    }

    /// When the next probe expires.
    pub fn next_expiry(&mut self) -> Option<u64> {
        while let Some(&(expires_ns, seq)) = self.order.front() {
            if self.by_seq.contains_key(&seq) {
                return Some(expires_ns);
            }
            self.order.pop_front();
        }
        None
    }

    /// Drops every probe of `target` without reporting it.
    pub fn forget(&mut self, target: K) {
        self.by_seq.retain(|_, sent| sent.target != target);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_seq.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn first_probes_spread_over_one_interval() {
        let interval = Duration::from_secs(1);
        let dues: Vec<u64> = (0..1000).map(|i| first_due(5, interval, i, 1000)).collect();
        assert_eq!(dues[0], 5);
        assert_eq!(dues[500], 5 + 500 * MS);
        assert_eq!(dues[999], 5 + 999 * MS);
        assert!(dues.windows(2).all(|w| w[1] - w[0] == MS));
        assert_eq!(first_due(0, interval, 0, 0), 0);
    }

    #[test]
    fn phase_keeps_the_spread_for_late_resolutions() {
        let interval = Duration::from_millis(100);
        // Target 1 of 4: its slots are 25, 125, 225 ms after the epoch.
        assert_eq!(phase_due(0, 0, interval, 1, 4), 25 * MS);
        assert_eq!(phase_due(25 * MS, 0, interval, 1, 4), 25 * MS);
        assert_eq!(phase_due(26 * MS, 0, interval, 1, 4), 125 * MS);
        assert_eq!(phase_due(190 * MS, 0, interval, 1, 4), 225 * MS);
    }

    #[test]
    fn after_a_send_the_next_slot_of_the_grid_without_bursts() {
        let interval = Duration::from_millis(100);
        // sent on its slot (25 ms): the next one
        assert_eq!(phase_due(25 * MS + 1, 0, interval, 1, 4), 125 * MS);
        // the first probe sent at once on resolution (60 ms): back on the grid
        assert_eq!(phase_due(60 * MS + 1, 0, interval, 1, 4), 125 * MS);
        // behind by more than an interval: the next slot, not a burst
        assert_eq!(phase_due(390 * MS + 1, 0, interval, 1, 4), 425 * MS);
    }

    #[test]
    fn timers_pop_in_time_order_and_move() {
        let mut t = Timers::default();
        t.set(1u32, 30);
        t.set(2, 10);
        t.set(3, 20);
        t.set(1, 5);
        assert_eq!(t.len(), 3);
        assert_eq!(t.next_at(), Some(5));
        t.remove(3);
        assert_eq!(t.pop_due(4), None);
        assert_eq!(t.pop_due(100), Some((1, 5)));
        assert_eq!(t.pop_due(100), Some((2, 10)));
        assert_eq!(t.pop_due(100), None);
        assert_eq!(t.next_at(), None);
        assert_eq!(t.get(1), None);
    }

    #[test]
    fn in_flight_answers_expires_and_forgets() {
        let timeout = Duration::from_millis(10);
        let mut f = InFlight::new(100);
        f.insert(1, 'a', 0, timeout);
        f.insert(2, 'b', MS, timeout);
        f.insert(3, 'a', 2 * MS, timeout);
        f.insert(4, 'c', 3 * MS, timeout);
        assert_eq!(f.next_expiry(), Some(10 * MS));
        let sent = f.answer(2, MS, 5 * MS).unwrap();
        assert_eq!((sent.target, sent.sent_ns), ('b', MS));
        assert_eq!(f.answer(2, MS, 5 * MS), None, "answered twice");
        assert_eq!(f.answer(99, MS, 5 * MS), None, "unknown");
        assert_eq!(f.answer(3, 7, 5 * MS), None, "wrong sender timestamp");
        // Late answer: not counted, the probe still expires as lost.
        assert_eq!(f.answer(1, 0, 10 * MS + 1), None);
        f.forget('c');
        assert_eq!(f.expire(11 * MS), vec![(1, 'a')]);
        assert_eq!(f.next_expiry(), Some(12 * MS));
        assert_eq!(f.expire(100 * MS), vec![(3, 'a')]);
        assert_eq!(f.len(), 0);
        assert_eq!(f.next_expiry(), None);
    }

    #[test]
    fn send_completions_give_the_prober_delay() {
        let timeout = Duration::from_millis(10);
        let mut f = InFlight::new(100);
        f.insert(1, 'a', MS, timeout);
        f.insert(2, 'a', 2 * MS, timeout);
        f.insert(3, 'b', 3 * MS, timeout);
        assert!(f.send_completed(1, MS + 20_000));
        assert!(f.send_completed(1, MS + 90_000), "a second one is ignored");
        let sent = f.answer(1, MS, MS + 100_000).unwrap();
        assert_eq!(sent.send_done_ns, Some(MS + 20_000));
        assert_eq!(sent.prober_delay_ns(MS + 100_000), 20_000);

        // answered before its send completion: the RTT, and the late send
        // completion finds nothing
        let sent = f.answer(2, 2 * MS, 2 * MS + 50_000).unwrap();
        assert_eq!(sent.send_done_ns, None);
        assert_eq!(sent.prober_delay_ns(2 * MS + 50_000), 50_000);
        assert!(!f.send_completed(2, 2 * MS + 60_000));

        // expired or forgotten probes take no send completion
        assert!(!f.send_completed(99, 0));
        f.forget('b');
        assert!(!f.send_completed(3, 3 * MS + 1));
        assert_eq!(f.len(), 0);
    }

    #[test]
    fn prober_delay_stays_within_the_rtt() {
        let sent = Sent {
            target: 'a',
            sent_ns: 1_000,
            expires_ns: u64::MAX,
            send_done_ns: Some(5_000),
        };
        assert_eq!(sent.prober_delay_ns(9_000), 4_000);
        assert_eq!(sent.prober_delay_ns(3_000), 2_000, "capped at the RTT");
        let before_post = Sent {
            send_done_ns: Some(500),
            ..sent
        };
        assert_eq!(before_post.prober_delay_ns(9_000), 0);
    }

    #[test]
    fn full_in_flight_gives_up_the_oldest() {
        let mut f = InFlight::new(2);
        let t = Duration::from_secs(1);
        assert_eq!(f.insert(1, 'a', 0, t), None);
        assert_eq!(f.insert(2, 'b', 1, t), None);
        assert_eq!(f.insert(3, 'c', 2, t), Some((1, 'a')));
        assert_eq!(f.len(), 2);
        assert!(f.answer(1, 0, 3).is_none());
        assert!(f.answer(3, 2, 3).is_some());
    }
}
