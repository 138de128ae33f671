//! Byte sizes written as strings: `"4096"`, `"64KiB"`, `"512 MiB"`, `"1GiB"`.

/// Why a size string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseSizeError {
    /// The string does not start with a number.
    #[error(
        "`{0}` is not a size: write a whole number of bytes, optionally with a unit: \
         B, KiB, MiB, GiB, TiB (K, M, G, T mean the same), e.g. \"512MiB\""
    )]
    NotASize(String),
    /// The unit is not one of the binary units.
    #[error(
        "`{0}` is not a size unit: use B, KiB, MiB, GiB or TiB (K, M, G, T mean the same; \
         decimal units such as MB are not accepted)"
    )]
    UnknownUnit(String),
    /// The size does not fit in 64 bits.
    #[error("`{0}` is too large: sizes must fit in 64 bits")]
    Overflow(String),
}

/// The accepted units and their multipliers (matched ignoring ASCII case).
const UNITS: [(&str, u64); 9] = [
    ("b", 1),
    ("k", 1 << 10),
    ("kib", 1 << 10),
    ("m", 1 << 20),
    ("mib", 1 << 20),
    ("g", 1 << 30),
    ("gib", 1 << 30),
    ("t", 1 << 40),
    ("tib", 1 << 40),
];

/// Parses a byte size: a whole number (underscores between digits allowed)
/// followed by an optional unit, `B`, `KiB`, `MiB`, `GiB`, `TiB`, or the
/// short forms `K`, `M`, `G`, `T`, all binary (powers of 1024), ignoring case
/// and spaces between number and unit.
///
/// ```
/// use multigrain_cluster_config::parse_byte_size;
/// assert_eq!(parse_byte_size("1GiB"), Ok(1 << 30));
/// assert_eq!(parse_byte_size("512 MiB"), Ok(512 << 20));
/// assert_eq!(parse_byte_size("4096"), Ok(4096));
/// assert!(parse_byte_size("1GB").is_err());
/// ```
pub fn parse_byte_size(text: &str) -> Result<u64, ParseSizeError> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '_'))
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let well_formed = !digits.is_empty()
        && !digits.starts_with('_')
        && !digits.ends_with('_')
        && !digits.contains("__");
    if !well_formed {
        return Err(ParseSizeError::NotASize(text.to_owned()));
    }
    let unit = unit.trim_start();
    let multiplier = if unit.is_empty() {
        1
    } else {
        UNITS
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(unit))
            .map(|(_, m)| *m)
            .ok_or_else(|| ParseSizeError::UnknownUnit(unit.to_owned()))?
    };
    digits
        .replace('_', "")
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| ParseSizeError::Overflow(text.to_owned()))
}

/// Formats a byte count with the largest binary unit that divides it
/// exactly: `1 GiB`, `1536 MiB`, `4097 bytes`.
pub fn format_bytes(bytes: u64) -> String {
    const NAMED: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    NAMED
        .iter()
        .find(|(_, m)| bytes != 0 && bytes.is_multiple_of(*m))
        .map_or_else(
            || format!("{bytes} bytes"),
            |(name, m)| format!("{} {name}", bytes / m),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_units() {
        assert_eq!(parse_byte_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_byte_size("1gib"), Ok(1 << 30));
        assert_eq!(parse_byte_size("2 T"), Ok(2 << 40));
        assert_eq!(parse_byte_size("64K"), Ok(64 << 10));
        assert_eq!(parse_byte_size("4_096 B"), Ok(4096));
        assert_eq!(parse_byte_size(" 7 "), Ok(7));
    }

    #[test]
    fn size_errors_say_what_is_allowed() {
        assert_eq!(
            parse_byte_size("1GB"),
            Err(ParseSizeError::UnknownUnit("GB".into()))
        );
        assert_eq!(
            parse_byte_size("GiB"),
            Err(ParseSizeError::NotASize("GiB".into()))
        );
        assert_eq!(
            parse_byte_size("-1MiB"),
            Err(ParseSizeError::NotASize("-1MiB".into()))
        );
        assert_eq!(
            parse_byte_size("1.5GiB"),
            Err(ParseSizeError::UnknownUnit(".5GiB".into()))
        );
        assert_eq!(
            parse_byte_size("99999999TiB"),
            Err(ParseSizeError::Overflow("99999999TiB".into()))
        );
        assert!(
            ParseSizeError::UnknownUnit("GB".into())
                .to_string()
                .contains("decimal units such as MB are not accepted")
        );
    }

    #[test]
    fn formatting_picks_exact_units() {
        assert_eq!(format_bytes(1 << 30), "1 GiB");
        assert_eq!(format_bytes(1536 << 20), "1536 MiB");
        assert_eq!(format_bytes(4097), "4097 bytes");
        assert_eq!(format_bytes(0), "0 bytes");
    }
}
