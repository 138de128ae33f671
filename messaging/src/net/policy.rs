//! Which INI a compute thread's inter-cluster message goes through (paper 002 §3.1,
//! the scheduling policies the thesis compares in chapter 5).

use multigrain_cluster_config::IniPolicy;
use std::cell::Cell;

/// The INI (of `k`) that a message of compute thread `thread_index` goes through, by
/// `policy` (paper 002 §3.1): `static` maps thread i to INI i mod K; `round-robin`
/// rotates per sending thread (`rr` is its counter); `least-loaded` takes the INI with
/// the least outstanding work — `load(j)`: messages in its hand-off queue, messages
/// waiting for its sliding windows, and 1 while it is serving — ties broken by rotating
/// from `rr`, so equal INIs share the load.
pub(crate) fn pick(
    policy: IniPolicy,
    k: usize,
    thread_index: usize,
    rr: &Cell<usize>,
    load: impl Fn(usize) -> usize,
) -> usize {
    match policy {
        IniPolicy::Static => thread_index % k,
        IniPolicy::RoundRobin => {
            let i = rr.get() % k;
            rr.set(i + 1);
            i
        }
        IniPolicy::LeastLoaded => {
            let start = rr.get() % k;
            rr.set(start + 1);
            (0..k)
                .map(|j| (start + j) % k)
                .min_by_key(|&j| load(j))
                .unwrap_or(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picks(policy: IniPolicy, thread: usize, loads: &[usize], n: usize) -> Vec<usize> {
        let rr = Cell::new(thread);
        (0..n)
            .map(|_| pick(policy, loads.len(), thread, &rr, |j| loads[j]))
            .collect()
    }

    #[test]
    fn static_maps_thread_i_to_ini_i_mod_k() {
        for t in 0..7 {
            assert_eq!(picks(IniPolicy::Static, t, &[5, 0, 9], 4), vec![t % 3; 4]);
        }
    }

    #[test]
    fn round_robin_rotates_per_thread_whatever_the_load() {
        assert_eq!(
            picks(IniPolicy::RoundRobin, 1, &[0, 100, 0], 5),
            vec![1, 2, 0, 1, 2]
        );
    }

    #[test]
    fn least_loaded_takes_the_ini_with_least_outstanding_work() {
        // INI 0: empty hand-off queue but 3 messages waiting for its windows and serving
        // (load 4); INI 1: 2 queued (load 2); INI 2: 3 queued. INI 1 wins every time.
        assert_eq!(picks(IniPolicy::LeastLoaded, 0, &[4, 2, 3], 4), vec![1; 4]);
        // A busy INI (load 1: serving, nothing queued) loses to an idle one.
        assert_eq!(picks(IniPolicy::LeastLoaded, 5, &[1, 0], 3), vec![1; 3]);
        // Ties rotate, so idle INIs share the messages.
        assert_eq!(
            picks(IniPolicy::LeastLoaded, 0, &[0, 0, 0], 3),
            vec![0, 1, 2]
        );
    }
}
