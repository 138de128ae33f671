//! A cluster's trace file: its INIs' buffers written one after the other.
//!
//! | offset | bytes | field |
//! |-------:|------:|-------|
//! | 0 | 8 | magic `MGTRACE1` |
//! | 8 | 4 | format version (1) |
//! | 12 | 2 | cluster |
//! | 14 | 2 | INIs in the cluster (K) |
//! | 16 | 48 | zero |
//! | 64 | 32 × K | per INI: records (u64), dropped (u64), span start and end (u64 ns each) |
//! | 64 + 32K | 64 × records | INI 0's records, then INI 1's, … ([`TraceRecord`]) |
//!
//! Little-endian. A file is read whole and checked: magic, version, a size that matches
//! its record counts exactly, every record's own checks, and every record naming the
//! file's cluster and the INI whose part of the file holds it.

use super::TraceError;
use super::record::{RECORD_BYTES, TraceBuffer, TraceRecord};
use std::io::Write;

const MAGIC: &[u8; 8] = b"MGTRACE1";
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 64;
const INI_ENTRY_BYTES: usize = 32;

/// One INI's part of a trace file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IniTrace {
    /// Its records in the order they were completed.
    pub records: Vec<TraceRecord>,
    /// Records its buffer had no room for.
    pub dropped: u64,
    /// The span the INI was traced over, `(from, to)` in ns.
    pub span: (u64, u64),
}

/// One cluster's trace: what each of its INIs recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterTrace {
    /// The cluster.
    pub cluster: u16,
    /// Per INI, index = INI.
    pub inis: Vec<IniTrace>,
}

impl ClusterTrace {
    /// Takes a snapshot of `buffers` (index = INI) of `cluster`.
    pub fn from_buffers<'a>(
        cluster: u16,
        buffers: impl IntoIterator<Item = &'a TraceBuffer>,
    ) -> ClusterTrace {
        ClusterTrace {
            cluster,
            inis: buffers
                .into_iter()
                .map(|b| IniTrace {
                    records: b.records().to_vec(),
                    dropped: b.dropped(),
                    span: b.span(),
                })
                .collect(),
        }
    }

    /// Writes the file format described in the module documentation.
    ///
    /// # Errors
    /// The writer's I/O errors; [`TraceError::TooManyInis`] above 65,535 INIs.
    pub fn write(&self, mut w: impl Write) -> Result<(), TraceError> {
        let inis = u16::try_from(self.inis.len()).map_err(|_| TraceError::TooManyInis)?;
        let mut header = [0u8; HEADER_BYTES];
        header[..8].copy_from_slice(MAGIC);
        header[8..12].copy_from_slice(&VERSION.to_le_bytes());
        header[12..14].copy_from_slice(&self.cluster.to_le_bytes());
        header[14..16].copy_from_slice(&inis.to_le_bytes());
        w.write_all(&header)?;
        for ini in &self.inis {
            let mut e = [0u8; INI_ENTRY_BYTES];
            e[..8].copy_from_slice(&(ini.records.len() as u64).to_le_bytes());
            e[8..16].copy_from_slice(&ini.dropped.to_le_bytes());
            e[16..24].copy_from_slice(&ini.span.0.to_le_bytes());
            e[24..32].copy_from_slice(&ini.span.1.to_le_bytes());
            w.write_all(&e)?;
        }
        let mut buf = [0u8; RECORD_BYTES];
        for r in self.inis.iter().flat_map(|i| &i.records) {
            r.encode(&mut buf);
            w.write_all(&buf)?;
        }
        w.flush()?;
        Ok(())
    }

    /// Parses a whole trace file.
    ///
    /// # Errors
    /// [`TraceError`] naming what is wrong: not a trace file, another version, a size that
    /// does not match the header, or a bad record (with its index).
    pub fn parse(bytes: &[u8]) -> Result<ClusterTrace, TraceError> {
        if bytes.len() < HEADER_BYTES || &bytes[..8] != MAGIC {
            return Err(TraceError::NotATrace);
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(TraceError::Version(version));
        }
        if bytes[16..HEADER_BYTES].iter().any(|&b| b != 0) {
            return Err(TraceError::Size(
                "header's reserved bytes are not zero".into(),
            ));
        }
        let cluster = u16::from_le_bytes([bytes[12], bytes[13]]);
        let inis = usize::from(u16::from_le_bytes([bytes[14], bytes[15]]));
        let table_end = HEADER_BYTES + inis * INI_ENTRY_BYTES;
        if bytes.len() < table_end {
            return Err(TraceError::Size(format!(
                "{} bytes cannot hold the table of {inis} INIs ({table_end} bytes)",
                bytes.len()
            )));
        }
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
        let mut entries = Vec::with_capacity(inis);
        let mut total: u64 = 0;
        for i in 0..inis {
            let o = HEADER_BYTES + i * INI_ENTRY_BYTES;
            let (count, dropped, from, to) =
                (u64_at(o), u64_at(o + 8), u64_at(o + 16), u64_at(o + 24));
            if from > to {
                return Err(TraceError::Size(format!(
                    "INI {i}'s span ends ({to} ns) before it starts ({from} ns)"
                )));
            }
            total = total.saturating_add(count);
            entries.push((count, dropped, (from, to)));
        }
        let expected = (table_end as u64)
            .checked_add(total.saturating_mul(RECORD_BYTES as u64))
            .filter(|&n| n == bytes.len() as u64);
        if expected.is_none() {
            return Err(TraceError::Size(format!(
                "the table announces {total} records, but {} bytes follow it ({} records)",
                bytes.len() - table_end,
                (bytes.len() - table_end) as f64 / RECORD_BYTES as f64
            )));
        }
        let mut at = table_end;
        let mut index = 0u64;
        let mut out = Vec::with_capacity(inis);
        for (ini, (count, dropped, span)) in entries.into_iter().enumerate() {
            let mut records = Vec::with_capacity(count as usize);
            for _ in 0..count {
                let rec: &[u8; RECORD_BYTES] = bytes[at..at + RECORD_BYTES]
                    .try_into()
                    .expect("length checked above");
                let r = TraceRecord::decode(rec, index)?;
                if r.cluster != cluster || usize::from(r.ini) != ini {
                    return Err(TraceError::BadRecord {
                        index,
                        why: "names another cluster or INI than the part of the file holding it",
                    });
                }
                records.push(r);
                at += RECORD_BYTES;
                index += 1;
            }
            out.push(IniTrace {
                records,
                dropped,
                span,
            });
        }
        Ok(ClusterTrace { cluster, inis: out })
    }
}
