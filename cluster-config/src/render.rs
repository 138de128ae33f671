//! Human-readable and TOML renderings of a [`JobConfig`].

use std::fmt::Write as _;

use crate::model::{CpuBind, JobConfig, Link, Substrate};
use crate::size::format_bytes;

/// Column alignment in [`render_rows`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Align {
    Left,
    Right,
}

/// Renders rows as columns separated by two spaces, each column as wide as
/// its widest cell, with no trailing spaces.
fn render_rows(align: &[Align], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..align.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = widths[i] - cell.chars().count();
            match align[i] {
                Align::Left => {
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', pad));
                }
                Align::Right => {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(cell);
                }
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A number without a needless fractional part: `0.5`, `2`, `1e-7`.
fn num(v: f64) -> String {
    format!("{v}")
}

impl JobConfig {
    /// The configuration as aligned plain text, as printed by
    /// `multigrain config show FILE`: one row per cluster with columns
    /// cluster, host, port, threads, INIs, policy and substrate, followed by
    /// summary lines for the job, the DSM region and protocol, the INI
    /// protocol parameters, and — only when they are in use — emulation,
    /// fault injection and the ssh prefix for remote hosts.
    ///
    /// The port column shows `auto` for port 0 and the INI port range when
    /// there is more than one INI per cluster. With `substrate = "auto"` the
    /// substrate column adds what the cluster's links to the other clusters
    /// resolve to, e.g. `auto (shm+udp)`.
    pub fn render_table(&self) -> String {
        let ini = &self.ini;
        let mut rows = vec![
            [
                "cluster",
                "host",
                "port",
                "threads",
                "INIs",
                "policy",
                "substrate",
            ]
            .map(str::to_owned)
            .to_vec(),
        ];
        for c in &self.clusters {
            let port = match c.ini_ports(self.inis_of(c.id)) {
                None => "auto".to_owned(),
                Some(r) if r.start() == r.end() => r.start().to_string(),
                Some(r) => format!("{}-{}", r.start(), r.end()),
            };
            rows.push(vec![
                c.id.to_string(),
                c.host.clone(),
                port,
                c.threads.to_string(),
                self.inis_of(c.id).to_string(),
                ini.policy.to_string(),
                self.substrate_cell(c.id),
            ]);
        }
        use Align::{Left, Right};
        let mut out = render_rows(&[Right, Left, Left, Right, Right, Left, Left], &rows);

        let mut lines: Vec<(&str, String)> = Vec::new();
        let job = &self.job;
        lines.push((
            "job",
            format!(
                "{}, key {:#018x}, start-up timeout {} ms, peer timeout {} ms, progress timeout {}",
                job.name.as_deref().unwrap_or("(unnamed)"),
                job.key,
                job.startup_timeout_ms,
                job.peer_timeout_ms,
                match job.progress_timeout_ms {
                    0 => "off".to_owned(),
                    ms => format!("{ms} ms"),
                }
            ),
        ));
        lines.push((
            "total",
            format!(
                "{} clusters, {} compute threads, {} INIs",
                self.clusters.len(),
                self.total_threads(),
                self.total_inis()
            ),
        ));
        let dsm = &self.dsm;
        lines.push((
            "dsm",
            format!("protocol {}, home policy {}", dsm.protocol, dsm.home),
        ));
        lines.push((
            "region",
            format!(
                "{} at {:#x}..{:#x} ({} pages of {} bytes)",
                format_bytes(dsm.region_size),
                dsm.region_base,
                dsm.region_end(),
                dsm.pages(),
                dsm.page_size
            ),
        ));
        lines.push((
            "ini",
            format!(
                "window {} frames, SEND timeout {} µs, ACK timeout {} µs, MTU {} bytes, \
                 queue {} messages, network polled {}",
                ini.window,
                ini.send_timeout_us,
                ini.ack_timeout_us,
                ini.mtu,
                ini.queue_capacity,
                poll_fraction(ini.poll_interval_min, ini.poll_interval_max)
            ),
        ));
        if !ini.inline
            || !ini.coalesce
            || !ini.offload
            || !ini.connected_sends
            || !ini.trace_dir.is_empty()
        {
            lines.push((
                "",
                format!(
                    "{}; {}; {}; {}; {}",
                    if ini.inline {
                        "compute threads run free INIs' passes (inline)"
                    } else {
                        "dedicated INI threads (inline = false)"
                    },
                    if ini.coalesce {
                        "messages that fit share a datagram"
                    } else {
                        "one message per datagram (coalesce = false)"
                    },
                    if ini.offload {
                        "segmentation offload"
                    } else {
                        "one system call per datagram (offload = false)"
                    },
                    if ini.connected_sends {
                        "a connected sending socket per peer INI"
                    } else {
                        "datagrams leave from the receive port (connected_sends = false)"
                    },
                    if ini.trace_dir.is_empty() {
                        "no message trace".to_owned()
                    } else {
                        format!(
                            "message trace into {} (up to {} records per INI)",
                            ini.trace_dir, ini.trace_records
                        )
                    }
                ),
            ));
        }
        let e = &self.emulation;
        if e.is_enabled() {
            lines.push((
                "emulation",
                format!(
                    "send o {} µs, recv o {} µs, g {} µs, L {} µs, G {} ns/byte",
                    num(e.send_overhead_us),
                    num(e.recv_overhead_us),
                    num(e.gap_us),
                    num(e.latency_us),
                    num(e.per_byte_gap_ns)
                ),
            ));
        }
        let f = &self.faults;
        if f.is_enabled() {
            lines.push((
                "faults",
                format!(
                    "drop {}, duplicate {}, reorder {}, corrupt {} (seed {})",
                    num(f.drop),
                    num(f.duplicate),
                    num(f.reorder),
                    num(f.corrupt),
                    f.seed
                ),
            ));
        }
        let n = self.clusters.len();
        let shared_host = (0..n).any(|a| (a + 1..n).any(|b| self.clusters_on_same_host(a, b)));
        match self.launch.cpu_bind {
            CpuBind::Auto if shared_host && ini.inline => lines.push((
                "cpus",
                "clusters started together on one host each bound to their own share of its \
                 CPUs, with their protocol threads on the others' shares while every compute \
                 thread has a CPU (cpu_bind = auto)"
                    .to_owned(),
            )),
            CpuBind::Split if shared_host => lines.push((
                "cpus",
                "clusters started together on one host each bound to their own share of its \
                 CPUs (cpu_bind = split)"
                    .to_owned(),
            )),
            CpuBind::Apart if shared_host => lines.push((
                "cpus",
                "clusters started together on one host each bound to their own share of its \
                 CPUs, their protocol threads to the others' shares (cpu_bind = apart)"
                    .to_owned(),
            )),
            CpuBind::Auto | CpuBind::Split | CpuBind::Apart => {}
            CpuBind::None => {
                lines.push(("cpus", "no CPU binding (cpu_bind = none)".to_owned()));
            }
        }
        if self.clusters.iter().any(|c| !c.is_loopback()) {
            lines.push((
                "launch",
                format!(
                    "{} HOST COMMAND for clusters not on loopback",
                    self.launch.ssh.join(" ")
                ),
            ));
        }
        out.push('\n');
        let width = lines.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
        for (label, text) in lines {
            // Writing to a String cannot fail.
            let _ = writeln!(out, "{label:<width$}  {text}");
        }
        out
    }

    /// The substrate column: the configured value, and for `auto` what this
    /// cluster's links resolve to.
    fn substrate_cell(&self, id: usize) -> String {
        if self.ini.substrate != Substrate::Auto {
            return self.ini.substrate.to_string();
        }
        let links: Vec<Link> = (0..self.clusters.len())
            .filter(|&other| other != id)
            .map(|other| self.link_between(id, other))
            .collect();
        let resolved = match (links.contains(&Link::Shm), links.contains(&Link::Udp)) {
            (true, true) => "shm+udp",
            (true, false) => "shm",
            (false, true) => "udp",
            (false, false) => "no peers",
        };
        format!("auto ({resolved})")
    }

    /// The configuration as a complete TOML file in the schema of this crate,
    /// with every key written out and the clusters as explicit `[[cluster]]`
    /// tables. Parsing the result gives back an equal `JobConfig`.
    pub fn to_toml_string(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail, so the results below are ignored.
        let job = &self.job;
        out.push_str("[job]\n");
        if let Some(name) = &job.name {
            let _ = writeln!(out, "name = {}", toml_str(name));
        }
        let _ = writeln!(out, "key = {}", toml_u64(job.key, true));
        let _ = writeln!(out, "startup_timeout_ms = {}", job.startup_timeout_ms);
        let _ = writeln!(out, "peer_timeout_ms = {}", job.peer_timeout_ms);
        let _ = writeln!(out, "progress_timeout_ms = {}", job.progress_timeout_ms);
        for c in &self.clusters {
            let _ = writeln!(
                out,
                "\n[[cluster]]\nhost = {}\nport = {}\nthreads = {}",
                toml_str(&c.host),
                c.port,
                c.threads
            );
            if let Some(k) = c.inis {
                let _ = writeln!(out, "inis = {k}");
            }
        }
        let ini = &self.ini;
        let _ = writeln!(
            out,
            "\n[ini]\nper_cluster = {}\npolicy = \"{}\"\nsubstrate = \"{}\"\nwindow = {}\n\
             send_timeout_us = {}\nack_timeout_us = {}\nmtu = {}\nqueue_capacity = {}\n\
             inline = {}\ncoalesce = {}\noffload = {}\nconnected_sends = {}\ntrace_dir = {}\n\
             trace_records = {}\n\
             poll_interval_min = {}\npoll_interval_max = {}",
            ini.per_cluster,
            ini.policy,
            ini.substrate,
            ini.window,
            ini.send_timeout_us,
            ini.ack_timeout_us,
            ini.mtu,
            ini.queue_capacity,
            ini.inline,
            ini.coalesce,
            ini.offload,
            ini.connected_sends,
            toml_str(&ini.trace_dir),
            ini.trace_records,
            ini.poll_interval_min,
            ini.poll_interval_max
        );
        let dsm = &self.dsm;
        let _ = writeln!(
            out,
            "\n[dsm]\nprotocol = \"{}\"\nhome = \"{}\"\nregion_base = {:#x}\nregion_size = {}\n\
             page_size = {}\nprefetch = {}\nwrite_ahead = {}\nidle_flushes = {}\nrelease_batch = {}\nbarrier_updates = \"{}\"\nflush_ahead = {}\npopulate = {}\nprotocol_priority = \"{}\"\nthread_policy = \"{}\"\nevent_profile = {}\nwait_spin_us = {}",
            dsm.protocol,
            dsm.home,
            dsm.region_base,
            dsm.region_size,
            dsm.page_size,
            dsm.prefetch,
            dsm.write_ahead,
            dsm.idle_flushes,
            dsm.release_batch,
            dsm.barrier_updates,
            dsm.flush_ahead,
            dsm.populate,
            dsm.protocol_priority,
            dsm.thread_policy,
            dsm.event_profile,
            dsm.wait_spin_us
        );
        let e = &self.emulation;
        let _ = writeln!(
            out,
            "\n[emulation]\nsend_overhead_us = {:?}\nrecv_overhead_us = {:?}\ngap_us = {:?}\n\
             latency_us = {:?}\nper_byte_gap_ns = {:?}",
            e.send_overhead_us, e.recv_overhead_us, e.gap_us, e.latency_us, e.per_byte_gap_ns
        );
        let f = &self.faults;
        let _ = writeln!(
            out,
            "\n[faults]\ndrop = {:?}\nduplicate = {:?}\nreorder = {:?}\ncorrupt = {:?}\nseed = {}",
            f.drop,
            f.duplicate,
            f.reorder,
            f.corrupt,
            toml_u64(f.seed, false)
        );
        let ssh: Vec<String> = self.launch.ssh.iter().map(|w| toml_str(w)).collect();
        let _ = writeln!(
            out,
            "\n[launch]\nssh = [{}]\ncpu_bind = \"{}\"",
            ssh.join(", "),
            self.launch.cpu_bind
        );
        out
    }
}

/// A TOML string literal for `s`, escaped as the `toml` crate does.
fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// A 64-bit value as a TOML integer (in hex when `hex`) when it fits in
/// `i64`, else as a hex string, which the schema accepts for the 64-bit job
/// key and fault seed.
fn toml_u64(v: u64, hex: bool) -> String {
    match i64::try_from(v) {
        Ok(_) if hex => format!("{v:#x}"),
        Ok(_) => v.to_string(),
        Err(_) => format!("\"{v:#x}\""),
    }
}

/// How often a receive loop polls the network, in words: "every poll", "1 in 8 polls",
/// "1 in 8–32 polls (adaptive)".
fn poll_fraction(min: u32, max: u32) -> String {
    match (min, max) {
        (1, 1) => "every poll".to_owned(),
        (a, b) if a == b => format!("1 in {a} polls"),
        (a, b) => format!("1 in {a}–{b} polls (adaptive)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_aligned_without_trailing_spaces() {
        let rows = vec![
            vec!["a".to_owned(), "long".to_owned()],
            vec!["bbb".to_owned(), "x".to_owned()],
        ];
        assert_eq!(
            render_rows(&[Align::Right, Align::Left], &rows),
            "  a  long\nbbb  x\n"
        );
    }

    #[test]
    fn large_u64_values_become_hex_strings() {
        assert_eq!(toml_u64(7, false), "7");
        assert_eq!(toml_u64(255, true), "0xff");
        assert_eq!(toml_u64(u64::MAX, false), "\"0xffffffffffffffff\"");
    }
}
