//! Clusters started over ssh on a host they share with other clusters of their job
//! bind themselves to their share of its CPUs (`launch.cpu_bind`).
//!
//! The launcher places the clusters it starts on its own host ([`super::cpus`]), but it
//! cannot see another host's CPUs. So every cluster it starts over ssh on a host that
//! two or more clusters of the job name gets [`ENV_CPU_SHARE`]: the binding rule, its
//! position among those clusters and their compute threads. First thing in `main`,
//! before the process has any other thread, [`bind_self`] reads it and binds the process
//! to its share of the CPUs it may use there, by the rule and in the shares the launcher
//! uses on its own host ([`super::cpus::place_host`]); every thread started later
//! inherits the mask (placed apart, the protocol thread takes the other clusters' CPUs
//! when it starts: [`super::cpus::protocol_cpus`]), and the run report's CPU column
//! shows it. Two host names are one host when [`same_host`] says so (loopback names, case, a trailing dot) or when they
//! resolve to a common address ([`same_machine`]: `node1` and its address are one host).

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;

use multigrain_cluster_config::{ClusterSpec, CpuBind, host_addresses, same_host};
use nix::unistd::Pid;

use super::cpus;

/// The variable that tells a cluster started over ssh its share of a shared host:
/// `RULE:POSITION:THREADS` — `auto`, `split` or `apart`, its position among the job's
/// clusters started on that host (0-based, in cluster order), and their compute threads,
/// comma separated (e.g. `auto:1:2,2`). Set by `multigrain launch`; read by [`bind_self`].
pub const ENV_CPU_SHARE: &str = "MULTIGRAIN_CPU_SHARE";

/// A cluster's place among the clusters of its job started over ssh on one host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Share {
    /// `auto`, `split` or `apart` (never `none`: such clusters get no share).
    pub(crate) bind: CpuBind,
    /// Its position among them, in cluster order.
    pub(crate) position: usize,
    /// Their compute threads, in cluster order (two entries at least).
    pub(crate) threads: Vec<usize>,
}

impl Share {
    /// The value of [`ENV_CPU_SHARE`].
    pub(crate) fn encode(&self) -> String {
        let threads: Vec<String> = self.threads.iter().map(usize::to_string).collect();
        format!("{}:{}:{}", self.bind, self.position, threads.join(","))
    }

    /// Reads a value of [`ENV_CPU_SHARE`].
    ///
    /// # Errors
    /// What is wrong with `s`, in words.
    pub(crate) fn parse(s: &str) -> Result<Share, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let [bind, position, threads] = parts[..] else {
            return Err("not RULE:POSITION:THREADS".into());
        };
        let bind = match bind.parse::<CpuBind>() {
            Ok(b @ (CpuBind::Auto | CpuBind::Split | CpuBind::Apart)) => b,
            _ => return Err(format!("rule {bind:?} is not auto, split or apart")),
        };
        let threads = threads
            .split(',')
            .map(|t| t.parse::<usize>().ok().filter(|&n| n >= 1))
            .collect::<Option<Vec<usize>>>()
            .filter(|t| t.len() >= 2)
            .ok_or_else(|| {
                format!("threads {threads:?} are not two or more counts of at least 1")
            })?;
        let position = position
            .parse::<usize>()
            .ok()
            .filter(|&p| p < threads.len())
            .ok_or_else(|| {
                format!(
                    "position {position:?} is not one of 0..{} (the clusters on this host)",
                    threads.len()
                )
            })?;
        Ok(Share {
            bind,
            position,
            threads,
        })
    }
}

/// The share to tell each cluster of `clusters` (by id) that starts over ssh (`here`
/// false) on a host that two or more of them name (`same`: whether two host names are
/// one machine, [`same_machine`] in the launcher): `None` for the others, and for all
/// when `bind` is `none`, or `auto` with dedicated INI threads (`dedicated_inis`: such
/// a thread confined with its cluster's busy compute threads waits for a time slice
/// for every datagram; see [`super::cpus`]).
pub(crate) fn remote_shares(
    bind: CpuBind,
    clusters: &[ClusterSpec],
    here: &[bool],
    dedicated_inis: bool,
    same: impl Fn(&str, &str) -> bool,
) -> Vec<Option<Share>> {
    let mut out = vec![None; clusters.len()];
    if bind == CpuBind::None || (bind == CpuBind::Auto && dedicated_inis) {
        return out;
    }
    // Groups in the order of their first cluster; a cluster joins the first group whose
    // first host names its machine.
    let mut groups: Vec<Vec<&ClusterSpec>> = Vec::new();
    for c in clusters.iter().filter(|c| !here[c.id]) {
        match groups.iter_mut().find(|g| same(&g[0].host, &c.host)) {
            Some(g) => g.push(c),
            None => groups.push(vec![c]),
        }
    }
    for group in groups.iter().filter(|g| g.len() >= 2) {
        let threads: Vec<usize> = group.iter().map(|c| c.threads.max(1)).collect();
        for (position, c) in group.iter().enumerate() {
            out[c.id] = Some(Share {
                bind,
                position,
                threads: threads.clone(),
            });
        }
    }
    out
}

/// Whether two host names of the job's configuration are one machine, for
/// [`remote_shares`]: [`same_host`], or both resolve (here, by the system's resolver)
/// to a common address. Each name is resolved at most once; one that does not resolve
/// is only itself.
pub(crate) fn same_machine() -> impl Fn(&str, &str) -> bool {
    let resolved: RefCell<HashMap<String, Vec<IpAddr>>> = RefCell::default();
    move |a: &str, b: &str| {
        if same_host(a, b) {
            return true;
        }
        let mut cache = resolved.borrow_mut();
        let mut ips = |host: &str| -> Vec<IpAddr> {
            cache
                .entry(host.to_owned())
                .or_insert_with(|| host_addresses(host).unwrap_or_default())
                .clone()
        };
        let (x, y) = (ips(a), ips(b));
        x.iter().any(|ip| y.contains(ip))
    }
}

/// What [`bind_self`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SelfBinding {
    /// Bound to these CPUs (ascending), by this rule; placed apart, its protocol thread
    /// to those of the other clusters on this host (ascending).
    Bound(Vec<usize>, CpuBind, Option<Vec<usize>>),
    /// Left unbound: the process may use no CPU it could name (their count, 0).
    Unbound(usize),
    /// Not bound, because of this (a bad [`ENV_CPU_SHARE`], or the kernel refused).
    Failed(String),
}

/// In a cluster process started with [`ENV_CPU_SHARE`]: binds this process to its
/// share of the CPUs it may use (see the module documentation) and returns what it did,
/// for [`log_outcome`]; `None` without the variable. Call it before the process starts
/// any thread: threads that exist keep their mask.
pub fn bind_self() -> Option<SelfBinding> {
    let value = std::env::var(ENV_CPU_SHARE).ok()?;
    Some(match Share::parse(&value) {
        Err(why) => SelfBinding::Failed(format!("{ENV_CPU_SHARE}={value:?}: {why}")),
        Ok(share) => bind_to(&share),
    })
}

fn bind_to(share: &Share) -> SelfBinding {
    let allowed = match cpus::allowed() {
        Ok(a) => a,
        Err(e) => return SelfBinding::Failed(format!("cannot read this process's CPUs: {e}")),
    };
    let Some(placement) = cpus::place_host(
        share.bind,
        &share.threads,
        &allowed,
        false,
        cpus::sysfs_core,
    ) else {
        return SelfBinding::Unbound(allowed.len());
    };
    let cpus::Binding {
        cpus: mine,
        protocol,
    } = placement.binding(share.position);
    match cpus::cpu_set(&mine).and_then(|set| nix::sched::sched_setaffinity(Pid::from_raw(0), &set))
    {
        Ok(()) => {
            if let Some(p) = &protocol {
                cpus::note_protocol_cpus(p.clone());
            }
            SelfBinding::Bound(mine, share.bind, protocol)
        }
        Err(e) => SelfBinding::Failed(format!(
            "cannot bind to CPUs {}: {e}",
            cpus::describe(&mine)
        )),
    }
}

/// Logs what [`bind_self`] did (once logging is set up): the CPUs at info level, a
/// failure as a warning (the cluster runs unbound).
pub fn log_outcome(outcome: Option<&SelfBinding>) {
    match outcome {
        Some(SelfBinding::Bound(cpus, bind, protocol)) => tracing::info!(
            "bound to CPUs {}{}: this cluster's share of the CPUs of a host shared with \
             other clusters started over ssh (launch.cpu_bind = {bind})",
            cpus::describe(cpus),
            protocol.as_ref().map_or(String::new(), |p| format!(
                ", its protocol thread to CPUs {} (theirs)",
                cpus::describe(p)
            ))
        ),
        Some(SelfBinding::Unbound(n)) => tracing::warn!(
            "not bound to a share of this host's CPUs: this process may use {n} of them"
        ),
        Some(SelfBinding::Failed(why)) => {
            tracing::warn!("cannot bind this cluster to its share of the host's CPUs: {why}")
        }
        None => {}
    }
}

/// The CPUs this process may run on, as `taskset -c` lists them (`?` if unreadable).
pub fn this_process_cpus() -> String {
    cpus::allowed().map_or_else(|_| "?".to_owned(), |c| cpus::describe(&c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: usize, host: &str, threads: usize) -> ClusterSpec {
        ClusterSpec {
            id,
            host: host.into(),
            port: 0,
            threads,
            inis: None,
        }
    }

    #[test]
    fn shares_travel_as_text_and_bad_text_is_named() {
        let s = Share {
            bind: CpuBind::Auto,
            position: 1,
            threads: vec![2, 3],
        };
        assert_eq!(s.encode(), "auto:1:2,3");
        assert_eq!(Share::parse("auto:1:2,3"), Ok(s));
        assert_eq!(
            Share::parse("split:0:1,1,1").map(|s| (s.bind, s.position, s.threads)),
            Ok((CpuBind::Split, 0, vec![1, 1, 1]))
        );
        assert_eq!(
            Share::parse("apart:1:1,1").map(|s| s.bind),
            Ok(CpuBind::Apart)
        );
        for (bad, says) in [
            ("auto:1", "not RULE:POSITION:THREADS"),
            ("none:0:1,1", "rule \"none\" is not auto, split or apart"),
            ("fast:0:1,1", "rule \"fast\""),
            ("auto:2:1,1", "position \"2\" is not one of 0..2"),
            ("auto:-1:1,1", "position \"-1\""),
            ("auto:0:1", "threads \"1\" are not two or more"),
            ("auto:0:1,0", "threads \"1,0\""),
            ("auto:0:1,x", "threads \"1,x\""),
        ] {
            let e = Share::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn clusters_sharing_a_remote_host_get_their_place_among_them() {
        // Clusters 0 and 3 on the launcher's host, 1 and 2 on node1, 4 alone on node2.
        let clusters = [
            spec(0, "127.0.0.1", 2),
            spec(1, "node1", 2),
            spec(2, "node1", 4),
            spec(3, "127.0.0.1", 2),
            spec(4, "node2", 8),
        ];
        let here = [true, false, false, true, false];
        let shares = remote_shares(CpuBind::Auto, &clusters, &here, false, same_host);
        let share = |position| Share {
            bind: CpuBind::Auto,
            position,
            threads: vec![2, 4],
        };
        assert_eq!(
            shares,
            vec![None, Some(share(0)), Some(share(1)), None, None]
        );
        let split = remote_shares(CpuBind::Split, &clusters, &here, true, same_host);
        assert_eq!(split[2].as_ref().map(|s| s.bind), Some(CpuBind::Split));
        // `none`, and `auto` with dedicated INI threads, bind nobody.
        assert!(
            remote_shares(CpuBind::None, &clusters, &here, false, same_host)
                .iter()
                .all(Option::is_none)
        );
        assert!(
            remote_shares(CpuBind::Auto, &clusters, &here, true, same_host)
                .iter()
                .all(Option::is_none)
        );
    }

    #[test]
    fn one_machine_named_two_ways_is_one_host() {
        // node1 under two spellings and by its address, node2 alone.
        let clusters = [
            spec(0, "node1", 2),
            spec(1, "NODE1.", 2),
            spec(2, "10.0.0.1", 1),
            spec(3, "node2", 1),
        ];
        let here = [false; 4];
        let same = |a: &str, b: &str| {
            let ip = |h: &str| if same_host(h, "node1") { "10.0.0.1" } else { h }.to_owned();
            same_host(a, b) || ip(a) == ip(b)
        };
        let shares = remote_shares(CpuBind::Auto, &clusters, &here, false, same);
        let share = |position| Share {
            bind: CpuBind::Auto,
            position,
            threads: vec![2, 2, 1],
        };
        assert_eq!(
            shares,
            vec![Some(share(0)), Some(share(1)), Some(share(2)), None]
        );
        // By the names alone, the address is a host of its own.
        let by_name = remote_shares(CpuBind::Auto, &clusters, &here, false, same_host);
        assert_eq!(
            by_name[1].as_ref().map(|s| s.threads.clone()),
            Some(vec![2, 2])
        );
        assert_eq!(by_name[2], None);
    }

    #[test]
    fn the_launchers_resolver_joins_two_spellings_of_an_address() {
        let same = same_machine();
        // The system's resolver reads "10.1" as 10.0.0.1 (the classic `inet_aton` forms,
        // no DNS query), which the names alone do not tell.
        assert!(!same_host("10.1", "10.0.0.1"));
        assert!(same("10.1", "10.0.0.1"));
        assert!(!same("10.2", "10.0.0.1"));
        assert!(same("Localhost.", "localhost"));
    }

    #[test]
    fn a_share_binds_by_the_launchers_rule() {
        // What the launcher's host rule gives these CPUs is what a cluster takes.
        let cpus = [0, 1, 2, 3];
        let place = |bind, threads: &[usize]| {
            cpus::place_host(bind, threads, &cpus, false, |_| None)
                .map(|p| (0..threads.len()).map(|i| p.binding(i)).collect::<Vec<_>>())
        };
        let b = |cpus: Vec<usize>, protocol: Option<Vec<usize>>| cpus::Binding { cpus, protocol };
        // 6 threads on 4 CPUs: auto splits, each protocol thread with its cluster.
        assert_eq!(
            place(CpuBind::Auto, &[2, 4]),
            Some(vec![b(vec![0], None), b(vec![1, 2, 3], None)])
        );
        // 4 threads on 4 CPUs: auto places them apart.
        assert_eq!(
            place(CpuBind::Auto, &[2, 2]),
            Some(vec![
                b(vec![0, 1], Some(vec![2, 3])),
                b(vec![2, 3], Some(vec![0, 1]))
            ])
        );
        assert_eq!(
            place(CpuBind::Split, &[1, 1]),
            Some(vec![b(vec![0, 1], None), b(vec![2, 3], None)])
        );
    }
}
