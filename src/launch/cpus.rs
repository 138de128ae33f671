//! Placing the clusters that start on the launcher's host on its CPUs
//! (`launch.cpu_bind`, [`CpuBind`]).
//!
//! Split, two or more clusters started here divide the CPUs the launcher may use (its
//! own affinity mask, so `taskset` or a batch system's binding of the launcher is
//! respected): each gets a share in proportion to its compute threads, at least one
//! CPU, made of whole cores of one socket where the counts allow ([`by_core`]), and
//! shares overlap only when there are more clusters than CPUs. This
//! is how `mpirun --bind-to core` and `srun --cpu-bind` place ranks. Apart, the shares
//! are the same, and each cluster's protocol thread is bound to the other clusters'
//! shares ([`Placement::binding`]). `auto` splits when the clusters here have more
//! compute threads than there are CPUs, places them apart when they do not, and leaves
//! them unbound when their INIs are dedicated threads (`ini.inline = false`). Measured on
//! 2 vCPUs (README, *CPU binding*): oversubscribed, unbound clusters lose time slices to
//! each other while the other waits for an answer — the default job (2 clusters × 2
//! threads over UDP) ran Water 512 × 50 in 1.26 s split against 1.64 s unbound (median of
//! 4 interleaved rounds); with a CPU per compute thread (2 × 1), splitting confined each
//! real-time protocol thread with its own busy compute thread (Water 4096 × 3 over shared
//! memory 8 % slower than unbound), where apart it answers on the CPU of the other
//! cluster's thread, which waits for that answer; with dedicated INI threads splitting
//! 2 × 2 made Water 1.5 × slower, each INI thread waiting behind its cluster's compute
//! threads for every datagram.
//!
//! A single cluster here is not bound. Clusters started over ssh that share a host bind
//! themselves to their share of it by the same rule ([`super::self_bind`]).

use std::collections::BTreeSet;
use std::sync::OnceLock;

use multigrain_cluster_config::{ClusterSpec, CpuBind};
use nix::sched::CpuSet;
use nix::unistd::Pid;

/// Where one cluster started on this host runs: the CPUs of the process (its compute
/// threads, and every thread it starts) and, placed apart, those of its protocol thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Binding {
    /// The process's CPUs, ascending.
    pub(crate) cpus: Vec<usize>,
    /// Its protocol thread's CPUs, ascending (the other clusters' shares); `None`: the
    /// process's.
    pub(crate) protocol: Option<Vec<usize>>,
}

/// How each cluster of `clusters` that starts on this host (`here[c.id]`) is bound, by
/// cluster id (`None`: not bound), for `bind` and the launcher's allowed CPUs `allowed`
/// (ascending): the [`Placement`] of [`place_host`] for the local clusters, in cluster
/// order (`core_of` gives each CPU's core; the launcher passes [`sysfs_core`]).
pub(crate) fn plan(
    bind: CpuBind,
    clusters: &[ClusterSpec],
    here: &[bool],
    allowed: &[usize],
    dedicated_inis: bool,
    core_of: impl Fn(usize) -> Option<(u32, u32)>,
) -> Vec<Option<Binding>> {
    let mut out = vec![None; clusters.len()];
    let local: Vec<&ClusterSpec> = clusters.iter().filter(|c| here[c.id]).collect();
    let threads: Vec<usize> = local.iter().map(|c| c.threads.max(1)).collect();
    if let Some(p) = place_host(bind, &threads, allowed, dedicated_inis, core_of) {
        for (i, c) in local.iter().enumerate() {
            out[c.id] = Some(p.binding(i));
        }
    }
    out
}

/// The clusters started together on one host, placed on its CPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Placement {
    /// Each cluster's share of the CPUs, in cluster order, each ascending.
    pub(crate) shares: Vec<Vec<usize>>,
    /// Whether each cluster's protocol thread runs on the other clusters' shares
    /// (`apart`) rather than on its own.
    pub(crate) apart: bool,
}

impl Placement {
    /// The binding of the `i`th cluster: its share, and `apart` the CPUs of the other
    /// shares outside its own for its protocol thread (its own share when there are
    /// none: more clusters than CPUs).
    pub(crate) fn binding(&self, i: usize) -> Binding {
        let own = &self.shares[i];
        let protocol = self.apart.then(|| {
            let others: BTreeSet<usize> = self
                .shares
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .flat_map(|(_, s)| s.iter().copied())
                .filter(|c| !own.contains(c))
                .collect();
            others.into_iter().collect::<Vec<usize>>()
        });
        Binding {
            cpus: own.clone(),
            protocol: protocol.filter(|p| !p.is_empty()),
        }
    }
}

/// The placement of the clusters started together on one host with the CPUs `allowed`
/// (ascending), whose compute threads are `threads` (in cluster order): [`shares`] of
/// `allowed` in [`by_core`] order by `core_of`, for `split` and `apart`; for `auto`,
/// `split` when their threads outnumber the CPUs and `apart` when they do not, or
/// unbound when the INIs are `dedicated_inis` (`ini.inline = false`: an INI thread then
/// needs a CPU for every datagram, and confined with its cluster's busy compute threads
/// it waits for a time slice). `None` (unbound) also for `none`, fewer than two
/// clusters, or no CPU. The rule of [`plan`], for the launcher's host and, in a cluster
/// started over ssh, for its own ([`super::self_bind`]).
pub(crate) fn place_host(
    bind: CpuBind,
    threads: &[usize],
    allowed: &[usize],
    dedicated_inis: bool,
    core_of: impl Fn(usize) -> Option<(u32, u32)>,
) -> Option<Placement> {
    let apart = match bind {
        CpuBind::Split => false,
        CpuBind::Apart => true,
        CpuBind::Auto if dedicated_inis => return None,
        CpuBind::Auto => threads.iter().sum::<usize>() <= allowed.len(),
        CpuBind::None => return None,
    };
    if threads.len() < 2 || allowed.is_empty() {
        return None;
    }
    let ordered = by_core(allowed, core_of);
    let mut shares = shares(&ordered, threads);
    for share in &mut shares {
        share.sort_unstable();
    }
    Some(Placement { shares, apart })
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

/// The variable that tells a cluster process the CPUs of its protocol thread, in the
/// kernel's list format (`1`, `8-15`; what [`describe`] writes): set by `multigrain
/// launch` for the clusters it places apart on its own host ([`Binding::protocol`]).
/// A cluster started over ssh that places itself apart ([`super::self_bind`]) notes its
/// own ([`note_protocol_cpus`]). Read by [`protocol_cpus`].
pub const ENV_PROTOCOL_CPUS: &str = "MULTIGRAIN_PROTOCOL_CPUS";

/// The protocol thread's CPUs that this process's self-binding chose.
static SELF_PROTOCOL_CPUS: OnceLock<Vec<usize>> = OnceLock::new();

/// Notes the CPUs that [`super::self_bind`] chose for this process's protocol thread.
pub(crate) fn note_protocol_cpus(cpus: Vec<usize>) {
    let _ = SELF_PROTOCOL_CPUS.set(cpus);
}

/// The CPUs this cluster process's protocol thread is to run on (ascending): those its
/// self-binding chose, else [`ENV_PROTOCOL_CPUS`]; `None` when neither says (it runs
/// where the process does).
///
/// # Errors
/// The variable's value, when it is not a CPU list (the protocol thread then runs where
/// the process does; the caller warns).
pub(crate) fn protocol_cpus() -> Result<Option<Vec<usize>>, String> {
    if let Some(cpus) = SELF_PROTOCOL_CPUS.get() {
        return Ok(Some(cpus.clone()));
    }
    match std::env::var(ENV_PROTOCOL_CPUS) {
        Err(_) => Ok(None),
        Ok(v) => parse(&v)
            .map(|s| Some(s.into_iter().collect()))
            .ok_or_else(|| {
                format!("{ENV_PROTOCOL_CPUS}={v:?} is not a CPU list such as 1 or 8-15,32")
            }),
    }
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
        // The process CPUs of `plan` for these clusters, those of `here` local, on the
        // first `n` CPUs, whose places are unknown (numeric order, whatever this
        // machine's topology).
        let p = |bind, here: [bool; 3], n: usize, dedicated_inis| {
            plan(bind, &clusters, &here, &cpus[..n], dedicated_inis, |_| None)
                .into_iter()
                .map(|b| b.map(|b| b.cpus))
                .collect::<Vec<_>>()
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
        // CPUs if told to, and auto, with a CPU per thread, places them apart.
        for bind in [CpuBind::Split, CpuBind::Auto, CpuBind::Apart] {
            assert_eq!(
                p(bind, two_here, 4, false),
                vec![Some(vec![0, 1]), Some(vec![2, 3]), None]
            );
        }
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
    fn apart_each_protocol_thread_runs_on_the_other_clusters_cpus() {
        let protocol = |bind, threads: &[usize], allowed: &[usize]| {
            place_host(bind, threads, allowed, false, |_| None).map(|p| {
                (0..threads.len())
                    .map(|i| p.binding(i).protocol)
                    .collect::<Vec<_>>()
            })
        };
        // 2 × 1 on 2 CPUs (auto: a CPU per thread): each cluster's protocol thread on the
        // other's CPU.
        assert_eq!(
            protocol(CpuBind::Auto, &[1, 1], &[0, 1]),
            Some(vec![Some(vec![1]), Some(vec![0])])
        );
        // Three clusters on 6 CPUs: the two other shares.
        assert_eq!(
            protocol(CpuBind::Apart, &[1, 1, 1], &[0, 1, 2, 3, 4, 5]),
            Some(vec![
                Some(vec![2, 3, 4, 5]),
                Some(vec![0, 1, 4, 5]),
                Some(vec![0, 1, 2, 3])
            ])
        );
        // More clusters than CPUs: the CPUs outside its own share; on one CPU there are
        // none, and the protocol thread stays with its cluster.
        assert_eq!(
            protocol(CpuBind::Apart, &[1, 1, 1, 1], &[0, 1]),
            Some(vec![
                Some(vec![1]),
                Some(vec![1]),
                Some(vec![0]),
                Some(vec![0])
            ])
        );
        assert_eq!(
            protocol(CpuBind::Apart, &[1, 1], &[5]),
            Some(vec![None, None])
        );
        // Split, and auto when oversubscribed (2 × 2 on 2 CPUs), keep it with its cluster.
        assert_eq!(
            protocol(CpuBind::Split, &[1, 1], &[0, 1]),
            Some(vec![None, None])
        );
        assert_eq!(
            protocol(CpuBind::Auto, &[2, 2], &[0, 1]),
            Some(vec![None, None])
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
