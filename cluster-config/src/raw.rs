//! The TOML file as written: every key optional where the schema allows it,
//! every value with its span, no range checks yet (see `resolve`).

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Visitor};
use toml::Spanned;

use crate::model::{
    BarrierUpdates, CpuBind, HomePolicy, IniPolicy, Protocol, ProtocolPriority, Substrate,
    ThreadPolicy,
};
use crate::size::parse_byte_size;

/// A whole file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawFile {
    pub job: Option<RawJob>,
    pub local: Option<Spanned<RawLocal>>,
    pub cluster: Option<Spanned<Vec<Spanned<RawCluster>>>>,
    pub ini: Option<RawIni>,
    pub dsm: Option<RawDsm>,
    pub emulation: Option<RawEmulation>,
    pub faults: Option<RawFaults>,
    pub launch: Option<RawLaunch>,
}

pub(crate) type Field<T> = Option<Spanned<T>>;

/// `[job]`
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawJob {
    pub name: Field<Text>,
    pub key: Field<U64>,
    pub startup_timeout_ms: Field<Int>,
    pub peer_timeout_ms: Field<Int>,
    pub progress_timeout_ms: Field<Int>,
}

/// `[local]`
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawLocal {
    pub clusters: Spanned<Int>,
    pub threads: Field<Int>,
}

/// One `[[cluster]]`
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawCluster {
    pub host: Spanned<Text>,
    pub port: Field<Int>,
    pub threads: Field<Int>,
    pub inis: Field<Int>,
}

/// `[ini]`
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawIni {
    pub per_cluster: Field<Int>,
    pub policy: Field<IniPolicy>,
    pub substrate: Field<Substrate>,
    pub window: Field<Int>,
    pub send_timeout_us: Field<Int>,
    pub ack_timeout_us: Field<Int>,
    pub mtu: Field<Int>,
    pub queue_capacity: Field<Int>,
    pub inline: Field<bool>,
    pub coalesce: Field<bool>,
    pub offload: Field<bool>,
    pub connected_sends: Field<bool>,
    pub trace_dir: Field<Text>,
    pub trace_records: Field<Int>,
    pub poll_interval_min: Field<Int>,
    pub poll_interval_max: Field<Int>,
}

/// `[dsm]`
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawDsm {
    pub protocol: Field<Protocol>,
    pub home: Field<HomePolicy>,
    pub region_base: Field<Int>,
    pub region_size: Field<Size>,
    pub page_size: Field<Int>,
    pub prefetch: Field<Int>,
    pub write_ahead: Field<Int>,
    pub idle_flushes: Field<Int>,
    pub release_batch: Field<Int>,
    pub barrier_updates: Field<BarrierUpdates>,
    pub flush_ahead: Field<bool>,
    pub populate: Field<bool>,
    pub protocol_priority: Field<ProtocolPriority>,
    pub thread_policy: Field<ThreadPolicy>,
    pub event_profile: Field<bool>,
    pub wait_spin_us: Field<Int>,
}

/// `[emulation]`
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawEmulation {
    pub send_overhead_us: Field<Number>,
    pub recv_overhead_us: Field<Number>,
    pub gap_us: Field<Number>,
    pub latency_us: Field<Number>,
    pub per_byte_gap_ns: Field<Number>,
}

/// `[faults]`
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawFaults {
    pub drop: Field<Number>,
    pub duplicate: Field<Number>,
    pub reorder: Field<Number>,
    pub corrupt: Field<Number>,
    pub seed: Field<U64>,
}

/// `[launch]`
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawLaunch {
    pub ssh: Field<Vec<Spanned<Text>>>,
    pub cpu_bind: Field<CpuBind>,
}

/// Implements `Deserialize` for `$ty` through `deserialize_any` with a
/// visitor named `$visitor`, whose methods the caller writes.
macro_rules! deserialize_with {
    ($ty:ident, $visitor:ident) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any($visitor)
            }
        }
    };
}

/// Forwards `visit_i64` and `visit_u64` to the visitor's `visit_i128`.
macro_rules! ints_via_i128 {
    ($value:ty) => {
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<$value, E> {
            self.visit_i128(v.into())
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<$value, E> {
            self.visit_i128(v.into())
        }
    };
}

/// A TOML string.
pub(crate) struct Text(pub String);
struct TextVisitor;
impl Visitor<'_> for TextVisitor {
    type Value = Text;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
        Ok(Text(v.to_owned()))
    }
}
deserialize_with!(Text, TextVisitor);

/// A TOML integer, kept wide so that a range error can quote any value the
/// parser accepts.
#[derive(Clone, Copy)]
pub(crate) struct Int(pub i128);
struct IntVisitor;
impl Visitor<'_> for IntVisitor {
    type Value = Int;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer")
    }
    ints_via_i128!(Int);
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Int, E> {
        Ok(Int(v))
    }
}
deserialize_with!(Int, IntVisitor);

/// A TOML float or integer.
#[derive(Clone, Copy)]
pub(crate) struct Number(pub f64);
struct NumberVisitor;
impl Visitor<'_> for NumberVisitor {
    type Value = Number;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number")
    }
    ints_via_i128!(Number);
    #[allow(clippy::cast_precision_loss)] // an integer written for a float
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Number, E> {
        Ok(Number(v as f64))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Number, E> {
        Ok(Number(v))
    }
}
deserialize_with!(Number, NumberVisitor);

/// What a [`U64`] may be, for its error message.
pub(crate) const U64_ALLOWED: &str = "must be an integer from 0 to 18446744073709551615 \
     (write values above 9223372036854775807 as a string such as \"0xffff_ffff_ffff_ffff\")";

/// A 64-bit unsigned integer, written as an integer or, since TOML integers
/// stop at `i64::MAX`, as a string such as `"0xffff_ffff_ffff_ffff"`.
#[derive(Clone, Copy)]
pub(crate) struct U64(pub u64);
struct U64Visitor;
impl Visitor<'_> for U64Visitor {
    type Value = U64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer, or a string holding one")
    }
    ints_via_i128!(U64);
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<U64, E> {
        u64::try_from(v)
            .map(U64)
            .map_err(|_| E::custom(U64_ALLOWED))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<U64, E> {
        parse_u64_literal(v)
            .map(U64)
            .ok_or_else(|| E::custom(U64_ALLOWED))
    }
}
deserialize_with!(U64, U64Visitor);

/// A byte count: an integer, or a string like `"512MiB"` (see
/// [`parse_byte_size`]). Kept wide so that a range error can quote it.
#[derive(Clone, Copy)]
pub(crate) struct Size(pub i128);
struct SizeVisitor;
impl Visitor<'_> for SizeVisitor {
    type Value = Size;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a byte count, or a string such as \"1GiB\"")
    }
    ints_via_i128!(Size);
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Size, E> {
        Ok(Size(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Size, E> {
        parse_byte_size(v)
            .map(|n| Size(n.into()))
            .map_err(|e| E::custom(e.to_string()))
    }
}
deserialize_with!(Size, SizeVisitor);

/// Parses `123`, `0x7b`, `0o173` or `0b1111011` (underscores between digits
/// allowed) into a `u64`.
pub(crate) fn parse_u64_literal(s: &str) -> Option<u64> {
    let (digits, radix) = match s.get(..2) {
        Some("0x") => (&s[2..], 16),
        Some("0o") => (&s[2..], 8),
        Some("0b") => (&s[2..], 2),
        _ => (s, 10),
    };
    let well_formed = !digits.is_empty()
        && !digits.starts_with('_')
        && !digits.ends_with('_')
        && !digits.contains("__")
        && digits.chars().all(|c| c == '_' || c.is_digit(radix));
    if !well_formed {
        return None;
    }
    u64::from_str_radix(&digits.replace('_', ""), radix).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u64_literals() {
        assert_eq!(parse_u64_literal("0xffff_ffff_ffff_ffff"), Some(u64::MAX));
        assert_eq!(parse_u64_literal("1_000"), Some(1000));
        assert_eq!(parse_u64_literal("0o17"), Some(15));
        assert_eq!(parse_u64_literal("0b101"), Some(5));
        for bad in [
            "",
            "0x",
            "_1",
            "1_",
            "1__0",
            "+1",
            "-1",
            "0x1g",
            " 1",
            "18446744073709551616",
        ] {
            assert_eq!(parse_u64_literal(bad), None, "{bad:?}");
        }
    }
}
