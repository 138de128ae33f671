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

/// The remote INI (of `r`) that local INI `i` (of `k`) sends its next message to a
/// cluster through, and the turn to use next time (`turn` starts at 0). Every local INI
/// has a connection to every remote INI (paper 002 §3.1) and the INI counts may differ
/// (Tables 5.8/5.9): when `k ≥ r`, INI `i` always sends to remote INI `i mod r`; when
/// `k < r`, it takes turns, message by message, over the remote INIs `i, i + k, i + 2k,
/// …` below `r`, so every remote INI receives and the receive load stays balanced.
///
/// # Panics
/// If `r == 0` or `i ≥ k`.
pub(crate) fn remote_ini(i: usize, k: usize, r: usize, turn: usize) -> (usize, usize) {
    assert!(r > 0 && i < k, "remote_ini({i}, {k}, {r})");
    if k >= r {
        return (i % r, 0);
    }
    let mine = (r - i).div_ceil(k);
    let turn = turn % mine;
    (i + turn * k, (turn + 1) % mine)
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

    fn remote_sequence(i: usize, k: usize, r: usize, n: usize) -> Vec<usize> {
        let mut turn = 0;
        (0..n)
            .map(|_| {
                let (j, next) = remote_ini(i, k, r, turn);
                turn = next;
                j
            })
            .collect()
    }

    #[test]
    fn remote_ini_covers_every_remote_ini_once_per_round() {
        // Equal counts: INI i talks to remote INI i.
        assert_eq!(remote_sequence(1, 3, 3, 3), vec![1, 1, 1]);
        // More local INIs than remote: i mod r.
        assert_eq!(remote_sequence(3, 4, 2, 2), vec![1, 1]);
        // Fewer: INI 0 of 2 rotates over 0, 2, 4 of 5; INI 1 over 1, 3.
        assert_eq!(remote_sequence(0, 2, 5, 6), vec![0, 2, 4, 0, 2, 4]);
        assert_eq!(remote_sequence(1, 2, 5, 4), vec![1, 3, 1, 3]);
        // One local INI reaches every remote INI in turn.
        assert_eq!(remote_sequence(0, 1, 4, 5), vec![0, 1, 2, 3, 0]);
        // Over all local INIs, each remote INI is some INI's target.
        for (k, r) in [(1, 1), (2, 3), (3, 8), (4, 4), (5, 2), (3, 7)] {
            let mut hit = vec![false; r];
            for i in 0..k {
                for j in remote_sequence(i, k, r, r) {
                    assert!(j < r);
                    hit[j] = true;
                }
            }
            assert!(hit.iter().all(|&h| h), "k={k} r={r}: {hit:?}");
        }
    }
}
