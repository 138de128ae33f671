//! Home assignment and copysets.
//!
//! Every page has a *home* cluster that holds its master copy and its directory
//! (the copyset). Under the static policies ([`crate::HomePolicy::RoundRobin`],
//! [`crate::HomePolicy::Block`]) every cluster computes the home locally. Under
//! [`crate::HomePolicy::FirstTouch`] the home is decided without races by the page's
//! *directory manager*, cluster `page mod clusters`:
//!
//! 1. A cluster that faults on a page whose home it does not know sends
//!    [`crate::Message::HomeQuery`] to the manager (or decides locally if it is the
//!    manager) and keeps the fault pending.
//! 2. The manager handles queries one at a time (they are messages to one machine):
//!    the first query for an unassigned page assigns the page to the querying
//!    cluster; every query is answered with [`crate::Message::HomeIs`] naming the
//!    assigned home. The manager's answer is therefore the same for everyone.
//! 3. A cluster told that it is the home starts with an untouched (all-zero) master
//!    copy; the others fetch from the home. Requests that reach the new home before
//!    its own `HomeIs` are held until it arrives.
//!
//! This is ArgoDSM's first-touch scheme (`src/data_distribution/first_touch_distribution.hpp`:
//! a compare-and-swap on the owner directory at node `page mod nodes`), with the
//! compare-and-swap replaced by the manager's serial message handling. hlrc may later
//! move a home at a barrier (single-writer migration, see [`crate::hlrc`]); every
//! cluster, including the directory manager, applies the move from the barrier
//! departure, so the manager's answers stay current.

use crate::config::{Config, HomePolicy};
use crate::ids::{ClusterId, PageId};

const UNKNOWN: u16 = u16::MAX;

/// Known home of every page at one cluster (dense: two bytes per page).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct HomeMap {
    homes: Vec<u16>,
}

/// The home `page` starts with in the job `cfg`: its static home, or none under
/// first-touch (decided at its first fault, see the module documentation).
pub(crate) fn initial_home(cfg: &Config, page: PageId) -> Option<ClusterId> {
    (cfg.home_policy != HomePolicy::FirstTouch).then(|| cfg.static_home(page))
}

impl HomeMap {
    pub(crate) fn new(cfg: &Config) -> Self {
        let homes = (0..cfg.pages)
            .map(|p| {
                PageId::new(p)
                    .and_then(|p| initial_home(cfg, p))
                    .map_or(UNKNOWN, ClusterId::get)
            })
            .collect();
        Self { homes }
    }

    pub(crate) fn get(&self, page: PageId) -> Option<ClusterId> {
        self.homes.get(page.index()).and_then(|&h| {
            if h == UNKNOWN {
                None
            } else {
                ClusterId::new(h)
            }
        })
    }

    pub(crate) fn set(&mut self, page: PageId, home: ClusterId) {
        if let Some(h) = self.homes.get_mut(page.index()) {
            *h = home.get();
        }
    }
}

/// A set of clusters (bitmap), used for copysets.
///
/// Source: the copyset of a page's directory entry (Li & Hudak, TOCS 1989 §4.1;
/// HLRC OSDI 1996 §2).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct CopySet {
    bits: Vec<u64>,
}

impl CopySet {
    pub(crate) fn insert(&mut self, c: ClusterId) {
        let (w, b) = (c.index() / 64, c.index() % 64);
        if self.bits.len() <= w {
            self.bits.resize(w + 1, 0);
        }
        self.bits[w] |= 1 << b;
    }

    pub(crate) fn remove(&mut self, c: ClusterId) {
        let (w, b) = (c.index() / 64, c.index() % 64);
        if let Some(x) = self.bits.get_mut(w) {
            *x &= !(1 << b);
        }
        while self.bits.last() == Some(&0) {
            self.bits.pop();
        }
    }

    pub(crate) fn contains(&self, c: ClusterId) -> bool {
        let (w, b) = (c.index() / 64, c.index() % 64);
        self.bits.get(w).is_some_and(|x| x & (1 << b) != 0)
    }

    /// Whether the set holds a cluster other than `c`.
    pub(crate) fn contains_other_than(&self, c: ClusterId) -> bool {
        let (w, b) = (c.index() / 64, c.index() % 64);
        self.bits.iter().enumerate().any(|(i, &x)| {
            let x = if i == w { x & !(1u64 << b) } else { x };
            x != 0
        })
    }

    /// The members, in id order.
    pub(crate) fn members(&self) -> impl Iterator<Item = ClusterId> + '_ {
        self.bits.iter().enumerate().flat_map(|(w, &x)| {
            (0..64)
                .filter(move |b| x & (1u64 << b) != 0)
                .filter_map(move |b| ClusterId::new((w * 64 + b) as u16))
        })
    }

    pub(crate) fn clear(&mut self) {
        self.bits.clear();
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = ClusterId> + '_ {
        self.bits.iter().enumerate().flat_map(|(w, &x)| {
            (0..64)
                .filter(move |b| x & (1u64 << b) != 0)
                .filter_map(move |b| ClusterId::new((w * 64 + b) as u16))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Protocol;

    #[test]
    fn copyset_ops() {
        let c = |n| ClusterId::new(n).unwrap();
        let mut s = CopySet::default();
        s.insert(c(3));
        s.insert(c(700));
        assert!(s.contains(c(700)) && !s.contains(c(4)));
        assert!(s.contains_other_than(c(3)) && s.contains_other_than(c(700)));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![c(3), c(700)]);
        s.remove(c(700));
        assert_eq!(s.bits.len(), 1);
        assert!(!s.contains_other_than(c(3)) && s.contains_other_than(c(4)));
        s.remove(c(3));
        assert!(s.bits.is_empty() && s.iter().next().is_none());
        assert!(!s.contains_other_than(c(3)));
    }

    #[test]
    fn first_touch_starts_unknown() {
        let mut cfg = Config::new(Protocol::Hlrc, 2, 4);
        cfg.home_policy = HomePolicy::FirstTouch;
        let p = PageId::new(1).unwrap();
        let mut m = HomeMap::new(&cfg);
        assert_eq!(m.get(p), None);
        m.set(p, ClusterId::new(1).unwrap());
        assert_eq!(m.get(p).map(ClusterId::get), Some(1));
        cfg.home_policy = HomePolicy::RoundRobin;
        assert_eq!(HomeMap::new(&cfg).get(p).map(ClusterId::get), Some(1));
    }
}
