//! Placing the clusters that start on the launcher's host on its CPUs
//! (`launch.cpu_bind`, [`CpuBind`]).
//!
//! Split, two or more clusters started here divide the CPUs the launcher may use (its
//! own affinity mask, so `taskset` or a batch system's binding of the launcher is
//! respected): each gets a share in proportion to its compute threads, at least one
//! CPU, made of whole cores of one socket where the counts allow ([`by_core`]), and
//! shares overlap only when there are more clusters than CPUs. This
//! is how `mpirun --bind-to core` and `srun --cpu-bind` place ranks. `auto` splits only
//! when the clusters here have more compute threads than there are CPUs and their INIs
//! are inline (`ini.inline`, the default). Measured on 2 vCPUs (README, *CPU binding*):
//! oversubscribed, unbound clusters lose time slices to each other while the other waits
//! for an answer — the default job (2 clusters × 2 threads over UDP) ran Water 512 × 50
//! in 1.26 s split against 1.64 s unbound (median of 4 interleaved rounds); with a CPU
//! per compute thread (2 × 1), splitting took the protocol threads' idle CPU away: Water
//! 4096 × 3 over shared memory 8 % slower; with dedicated INI threads (`ini.inline =
//! false`) splitting 2 × 2 made Water 1.5 × slower, each INI thread waiting behind its
//! cluster's compute threads for every datagram.
//!
//! A single cluster here is not bound. Clusters started over ssh that share a host bind
//! themselves to their share of it by the same rule ([`super::self_bind`]).

use std::collections::BTreeSet;

use multigrain_cluster_config::{ClusterSpec, CpuBind};
use nix::sched::CpuSet;
use nix::unistd::Pid;

/// The CPUs each cluster of `clusters` that starts on this host (`here[c.id]`) is bound
/// to, by cluster id (`None`: not bound), for `bind` and the launcher's allowed CPUs
/// `allowed` (ascending): [`shares`] of `allowed` in [`by_core`] order by `core_of`
/// (each share listed ascending; the launcher passes [`sysfs_core`]) for `split`, and
/// for `auto` when the
/// local clusters' compute threads outnumber `allowed` and the INIs are not
/// `dedicated_inis` (`ini.inline = false`: an INI thread then needs a CPU for every
/// datagram, and confined with its cluster's busy compute threads it waits for a time
/// slice).
pub(crate) fn plan(
    bind: CpuBind,
    clusters: &[ClusterSpec],
    here: &[bool],
    allowed: &[usize],
    dedicated_inis: bool,
    core_of: impl Fn(usize) -> Option<(u32, u32)>,
) -> Vec<Option<Vec<usize>>> {
    let mut out = vec![None; clusters.len()];
    let local: Vec<&ClusterSpec> = clusters.iter().filter(|c| here[c.id]).collect();
    let threads: Vec<usize> = local.iter().map(|c| c.threads.max(1)).collect();
    if let Some(split) = split_host(bind, &threads, allowed, dedicated_inis, core_of) {
        for (c, share) in local.iter().zip(split) {
            out[c.id] = Some(share);
        }
    }
    out
}

/// The shares of one host's CPUs `allowed` (ascending) for the clusters started
/// together on it, whose compute threads are `threads` (in cluster order), each share
/// ascending — or `None` when they stay unbound: `bind` is `none`, or `auto` and their
/// threads do not outnumber the CPUs or the INIs are `dedicated_inis`, or fewer than two
/// clusters, or no CPU. The rule of [`plan`], for the launcher's host and, in a cluster
/// started over ssh, for its own ([`super::self_bind`]).
pub(crate) fn split_host(
    bind: CpuBind,
    threads: &[usize],
    allowed: &[usize],
    dedicated_inis: bool,
    core_of: impl Fn(usize) -> Option<(u32, u32)>,
) -> Option<Vec<Vec<usize>>> {
    let split = match bind {
        CpuBind::Split => true,
        CpuBind::Auto => !dedicated_inis && threads.iter().sum::<usize>() > allowed.len(),
        CpuBind::None => false,
    };
    if !split || threads.len() < 2 || allowed.is_empty() {
        return None;
    }
    let ordered = by_core(allowed, core_of);
    let mut split = shares(&ordered, threads);
    for share in &mut split {
        share.sort_unstable();
    }
    Some(split)
}

/// `cpus` ordered so that a contiguous run of them is whole cores, grouped by socket:
/// by `(package, core)` as `core_of` gives them, then CPU number; CPUs whose place is
/// unknown (`None`) keep their numeric order after the others. Linux numbers the
/// second hardware thread of every core after all the first ones (`0-15` and `16-31`
/// on 16 cores with SMT): in numeric order, halves of the CPUs would give two clusters
/// the two threads of the same cores, where `mpirun --bind-to core` gives each rank
/// whole cores.
pub(crate) fn by_core(cpus: &[usize], core_of: impl Fn(usize) -> Option<(u32, u32)>) -> Vec<usize> {
    let mut keyed: Vec<(Option<(u32, u32)>, usize)> =
        cpus.iter().map(|&c| (core_of(c), c)).collect();
    // `None` after every `Some`: sort on (is unknown, place, cpu).
    keyed.sort_by_key(|&(place, cpu)| (place.is_none(), place, cpu));
    keyed.into_iter().map(|(_, c)| c).collect()
}

/// CPU `cpu`'s `(physical_package_id, core_id)` from
/// `/sys/devices/system/cpu/cpuN/topology`, if the kernel says.
pub(crate) fn sysfs_core(cpu: usize) -> Option<(u32, u32)> {
    let read = |name: &str| -> Option<u32> {
        std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/topology/{name}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some((read("physical_package_id")?, read("core_id")?))
}

/// Splits `allowed` (CPU numbers) into one contiguous share per entry of `threads`, in
/// proportion to it: share `i` is `allowed[m·Tᵢ/T .. m·Tᵢ₊₁/T]` (`m` CPUs, `Tᵢ` the
/// threads before entry `i`, `T` all of them), or the single CPU at its start when
/// that range is empty (more entries than CPUs: neighbours share one).
///
/// # Panics
/// If `allowed` is empty.
pub(crate) fn shares(allowed: &[usize], threads: &[usize]) -> Vec<Vec<usize>> {
    assert!(!allowed.is_empty(), "no CPU to share");
    let m = allowed.len();
    let total: usize = threads.iter().sum::<usize>().max(1);
    let mut before = 0;
    threads
        .iter()
        .map(|&t| {
            let start = m * before / total;
            before += t;
            let end = m * before / total;
            if end > start {
                allowed[start..end].to_vec()
            } else {
                vec![allowed[start.min(m - 1)]]
            }
        })
        .collect()
}

/// The CPUs this process may run on, ascending.
///
/// # Errors
/// `sched_getaffinity`'s.
pub(crate) fn allowed() -> nix::Result<Vec<usize>> {
    let set = nix::sched::sched_getaffinity(Pid::from_raw(0))?;
    Ok(multigrain_messaging::sched::cpus_in(&set))
}

/// `cpus` as a kernel CPU mask.
///
/// # Errors
/// `EINVAL` for a CPU number beyond the mask's size ([`CpuSet::count`]).
pub(crate) fn cpu_set(cpus: &[usize]) -> nix::Result<CpuSet> {
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c)?;
    }
    Ok(set)
}

/// `cpus` (ascending) as a list of ranges, as `taskset -c` writes it: `0-3,8,10-11`.
pub(crate) fn describe(cpus: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if j > i {
            format!("{}-{}", cpus[i], cpus[j])
        } else {
            cpus[i].to_string()
        });
        i = j + 1;
    }
    parts.join(",")
}

/// Most CPUs [`parse`] accepts in one list: more than any machine has, so that a
/// malformed or forged list (statistics come from the cluster processes) cannot make
/// the reader allocate without bound.
const MAX_LISTED_CPUS: usize = 1 << 16;

/// The CPUs a list in the kernel's list format names (`0-3,8`: 0, 1, 2, 3 and 8; what
/// [`describe`] writes); `None` if it is empty, malformed, or names more than
/// [`MAX_LISTED_CPUS`].
pub(crate) fn parse(list: &str) -> Option<BTreeSet<usize>> {
    if list.is_empty() {
        return None;
    }
    let mut cpus = BTreeSet::new();
    for part in list.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<usize>().ok()?, hi.parse::<usize>().ok()?),
            None => {
                let c = part.parse::<usize>().ok()?;
                (c, c)
            }
        };
        if lo > hi || hi - lo >= MAX_LISTED_CPUS || cpus.len() + (hi - lo) >= MAX_LISTED_CPUS {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    Some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn parses_are_read_in_the_kernels_format_and_bad_ones_are_none() {
        let n = |l: &str| parse(l).map(|s| s.len());
        assert_eq!(n("0"), Some(1));
        assert_eq!(n("0-3,8"), Some(5));
        assert_eq!(parse("2,4-5"), Some([2, 4, 5].into()));
        for bad in ["", "x", "3-1", "0-", "1,,2", "0-99999999999"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    fn spec(id: usize, threads: usize) -> ClusterSpec {
        ClusterSpec {
            id,
            host: "127.0.0.1".into(),
            port: 0,
            threads,
            inis: None,
        }
    }

    #[test]
    fn equal_clusters_split_the_cpus_in_blocks() {
        let cpus: Vec<usize> = (0..16).collect();
        assert_eq!(
            shares(&cpus, &[8, 8]),
            vec![(0..8).collect::<Vec<_>>(), (8..16).collect()]
        );
        assert_eq!(shares(&[0, 1], &[2, 2]), vec![vec![0], vec![1]]);
        // Three clusters on 16 CPUs: 5, 5 and 6, every CPU used once.
        let s = shares(&cpus, &[1, 1, 1]);
        assert_eq!(s.iter().map(Vec::len).collect::<Vec<_>>(), vec![5, 5, 6]);
        assert_eq!(s.concat(), cpus);
    }

    #[test]
    fn shares_follow_the_thread_counts_and_the_allowed_mask() {
        // A launcher confined to CPUs 2, 3, 6, 7 (taskset): a cluster of 3 threads
        // gets three of them, its neighbour of 1 thread the last.
        assert_eq!(shares(&[2, 3, 6, 7], &[3, 1]), vec![vec![2, 3, 6], vec![7]]);
    }

    #[test]
    fn more_clusters_than_cpus_share_neighbouring_cpus() {
        assert_eq!(
            shares(&[0, 1], &[1, 1, 1, 1]),
            vec![vec![0], vec![0], vec![1], vec![1]]
        );
        assert_eq!(shares(&[5], &[1, 1, 1]), vec![vec![5], vec![5], vec![5]]);
    }

    #[test]
    fn only_clusters_started_together_here_are_bound() {
        let clusters = [spec(0, 2), spec(1, 2), spec(2, 4)];
        let cpus = [0, 1, 2, 3];
        // `plan` for these clusters, those of `here` local, on the first `n` CPUs, whose
        // places are unknown (numeric order, whatever this machine's topology).
        let p = |bind, here: [bool; 3], n: usize, dedicated_inis| {
            plan(bind, &clusters, &here, &cpus[..n], dedicated_inis, |_| None)
        };
        let (all, two_here, one_here) = ([true; 3], [true, true, false], [false, true, false]);
        // 8 compute threads on 4 CPUs: auto splits.
        for bind in [CpuBind::Auto, CpuBind::Split] {
            assert_eq!(
                p(bind, all, 4, false),
                vec![Some(vec![0]), Some(vec![1]), Some(vec![2, 3])]
            );
        }
        // Cluster 2 starts over ssh: the two local ones (4 threads) split this host's
        // CPUs if told to; auto leaves them a CPU per thread, unbound.
        assert_eq!(
            p(CpuBind::Split, two_here, 4, false),
            vec![Some(vec![0, 1]), Some(vec![2, 3]), None]
        );
        assert_eq!(p(CpuBind::Auto, two_here, 4, false), vec![None, None, None]);
        // On 3 CPUs those 4 threads outnumber them: auto splits.
        assert_eq!(
            p(CpuBind::Auto, two_here, 3, false),
            vec![Some(vec![0]), Some(vec![1, 2]), None]
        );
        // One cluster here: it keeps every CPU.
        assert_eq!(
            p(CpuBind::Split, one_here, 1, false),
            vec![None, None, None]
        );
        assert_eq!(p(CpuBind::None, all, 1, false), vec![None, None, None]);
        // Dedicated INI threads: auto leaves them unbound, split does as told.
        assert_eq!(p(CpuBind::Auto, all, 4, true), vec![None, None, None]);
        assert_eq!(
            p(CpuBind::Split, all, 4, true),
            vec![Some(vec![0]), Some(vec![1]), Some(vec![2, 3])]
        );
    }

    #[test]
    fn shares_are_whole_cores_of_one_socket() {
        // 2 sockets × 2 cores × 2 threads, Linux numbering: CPU c and c + 4 are the two
        // threads of one core; CPUs 0, 1, 4, 5 on socket 0.
        let core_of = |c: usize| Some(((c % 4 / 2) as u32, (c % 2) as u32));
        let cpus: Vec<usize> = (0..8).collect();
        let ordered = by_core(&cpus, core_of);
        assert_eq!(ordered, vec![0, 4, 1, 5, 2, 6, 3, 7]);
        assert_eq!(
            shares(&ordered, &[1, 1]),
            vec![vec![0, 4, 1, 5], vec![2, 6, 3, 7]]
        );
        // Unknown places keep their numeric order, after the known ones.
        let partial = |c: usize| (c >= 2).then_some((0, (c % 2) as u32));
        assert_eq!(by_core(&[0, 1, 2, 3], partial), vec![2, 3, 0, 1]);
        assert_eq!(by_core(&[3, 1, 2], |_| None), vec![1, 2, 3]);
    }

    #[test]
    fn lists_read_as_taskset_writes_them() {
        assert_eq!(describe(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(describe(&[7]), "7");
        assert_eq!(describe(&[]), "");
    }

    #[test]
    fn this_process_has_cpus_and_they_make_a_mask() {
        let cpus = allowed().unwrap();
        assert!(!cpus.is_empty());
        let set = cpu_set(&cpus).unwrap();
        assert!(cpus.iter().all(|&c| set.is_set(c).unwrap()));
        assert!(cpu_set(&[CpuSet::count()]).is_err());
    }
}
