//! Configuration errors and how they are located in the source text.
//!
//! Every error that comes from a configuration text carries a [`Location`]
//! (origin, line, column) and, where one applies, the dotted key path such as
//! `ini.window` or `cluster[1].port`, the offending value as written in the
//! file, and what would have been allowed.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// A position in a configuration text.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Location {
    /// Where the text came from: a file path, or the label given to
    /// [`JobConfig::from_str_named`](crate::JobConfig::from_str_named).
    pub origin: String,
    /// Line number, counted from 1; 0 when `origin` is a command-line flag
    /// (`--set KEY=VALUE`) rather than a text.
    pub line: usize,
    /// Column number in characters, counted from 1.
    pub column: usize,
}

impl Location {
    /// The location of byte `offset` in `text` (clamped to the text).
    pub(crate) fn of_offset(origin: &str, text: &str, offset: usize) -> Self {
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &text[..offset];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        Self {
            origin: origin.to_owned(),
            line: before.matches('\n').count() + 1,
            column: before[line_start..].chars().count() + 1,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            // A command-line flag (`--set KEY=VALUE`), not a position in a text.
            return f.write_str(&self.origin);
        }
        write!(f, "{}:{}:{}", self.origin, self.line, self.column)
    }
}

/// Why a job configuration was rejected.
///
/// The `Display` form is one line, `origin:line:column: key = value: what is
/// allowed`, ready to print as is.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration file could not be read.
    #[error("{}: cannot read the cluster config: {error}", path.display())]
    Read {
        /// The path that was opened.
        path: PathBuf,
        /// What the operating system reported.
        error: std::io::Error,
    },
    /// The text is not valid TOML.
    #[error("{at}: {}TOML syntax error: {message}", key_prefix(key))]
    Syntax {
        /// Where the parser stopped.
        at: Location,
        /// The key being parsed there, when it could be told from the text.
        key: Option<String>,
        /// The parser's description.
        message: String,
    },
    /// A key that the schema does not have (every table rejects unknown keys).
    #[error("{at}: {key}: unknown key; allowed here: {allowed}")]
    UnknownKey {
        /// Where the key is written.
        at: Location,
        /// Full key path, e.g. `ini.windw`.
        key: String,
        /// The keys allowed in that table, with a suggestion when one is close.
        allowed: String,
    },
    /// A required key is absent.
    #[error("{at}: {key}: missing: {allowed}")]
    Missing {
        /// The table that lacks the key (line 1, column 1 for the whole file).
        at: Location,
        /// Full key path of the missing key, e.g. `cluster[0].host`.
        key: String,
        /// What is required.
        allowed: String,
    },
    /// Two parts of the file that cannot be used together, e.g. `[local]`
    /// and `[[cluster]]`.
    #[error("{at}: {key}: {allowed}")]
    Conflict {
        /// Where the later of the two parts is written.
        at: Location,
        /// Key path of the later part.
        key: String,
        /// What is in conflict and how to resolve it.
        allowed: String,
    },
    /// A value of the wrong type, out of range, or in conflict with another
    /// value.
    #[error("{at}: {key} = {value}: {allowed}")]
    Invalid {
        /// Where the value is written.
        at: Location,
        /// Full key path, e.g. `ini.window`.
        key: String,
        /// The value as written in the file (or `… (default)`).
        value: String,
        /// What would have been allowed.
        allowed: String,
    },
}

fn key_prefix(key: &Option<String>) -> String {
    key.as_ref().map(|k| format!("{k}: ")).unwrap_or_default()
}

impl ConfigError {
    /// Where in the text the error is, if it came from a text.
    pub fn location(&self) -> Option<&Location> {
        match self {
            Self::Read { .. } => None,
            Self::Syntax { at, .. }
            | Self::UnknownKey { at, .. }
            | Self::Missing { at, .. }
            | Self::Conflict { at, .. }
            | Self::Invalid { at, .. } => Some(at),
        }
    }

    /// The dotted key path the error is about, if known.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Read { .. } => None,
            Self::Syntax { key, .. } => key.as_deref(),
            Self::UnknownKey { key, .. }
            | Self::Missing { key, .. }
            | Self::Conflict { key, .. }
            | Self::Invalid { key, .. } => Some(key),
        }
    }
}

/// The configuration text being resolved, for turning spans into errors.
pub(crate) struct Source<'a> {
    pub origin: &'a str,
    pub text: &'a str,
    /// `--set` values appended after the file's text, located at their flags.
    pub overrides: Option<&'a crate::overrides::Combined>,
}

/// Longest value excerpt quoted in an error, in characters.
const MAX_VALUE_CHARS: usize = 60;

impl Source<'_> {
    pub fn location(&self, offset: usize) -> Location {
        match self.overrides.and_then(|c| c.region_of(offset)) {
            Some((flag, _)) => crate::overrides::flag_location(flag),
            None => Location::of_offset(self.origin, self.text, offset),
        }
    }

    /// The text of `span`, trimmed and shortened to one line for quoting.
    pub fn excerpt(&self, span: Range<usize>) -> String {
        if let Some(v) = self.overrides.and_then(|c| c.value_at(span.start)) {
            return v.to_owned();
        }
        let raw = self.text.get(span).unwrap_or("").trim();
        let first_line = raw.lines().next().unwrap_or("");
        let mut out: String = first_line.chars().take(MAX_VALUE_CHARS).collect();
        if out.len() < raw.len() {
            out.push('…');
        }
        out
    }

    /// An [`ConfigError::Invalid`] for the value at `span`.
    pub fn invalid(
        &self,
        span: Range<usize>,
        key: &str,
        allowed: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Invalid {
            at: self.location(span.start),
            value: self.excerpt(span),
            key: key.to_owned(),
            allowed: allowed.into(),
        }
    }

    /// Converts a TOML parse or deserialization error.
    pub fn toml_error(&self, err: &toml::de::Error, syntax: bool) -> ConfigError {
        let span = err.span().unwrap_or(0..0);
        let at = self.location(span.start);
        let message = err.message().trim().to_owned();
        if syntax {
            return ConfigError::Syntax {
                at,
                key: guess_key_at(self.text, span.start),
                message,
            };
        }
        let mut path = match self.overrides.and_then(|c| c.region_of(span.start)) {
            Some((_, key)) => vec![Segment::Key(key.to_owned())],
            None => key_segments_at(self.text, span.start),
        };
        if let Some(rest) = message.strip_prefix("unknown field `")
            && let Some((name, expected)) = rest.split_once('`')
        {
            // The span is the key's; drop what the search found below it
            // (the elements of a mistyped `[[array]]`).
            if let Some(i) = path
                .iter()
                .rposition(|s| matches!(s, Segment::Key(k) if k == name))
            {
                path.truncate(i + 1);
            }
            let key = join_path(&path);
            let names = expected_names(expected);
            let mut allowed = names.join(", ");
            if let Some(close) = names.iter().find(|n| edit_distance(n, name) <= 2) {
                allowed.push_str(&format!(" (did you mean `{close}`?)"));
            }
            return ConfigError::UnknownKey { at, key, allowed };
        }
        let key = join_path(&path);
        if let Some(rest) = message.strip_prefix("missing field `")
            && let Some((name, _)) = rest.split_once('`')
        {
            let key = if key.is_empty() {
                name.to_owned()
            } else {
                format!("{key}.{name}")
            };
            return ConfigError::Missing {
                at,
                key,
                allowed: "this key is required".to_owned(),
            };
        }
        let allowed = match message
            .strip_prefix("invalid type: ")
            .and_then(|rest| rest.rsplit_once(", expected "))
        {
            Some((found, expected)) => format!("wrong type: expected {expected}, found {found}"),
            None => message,
        };
        ConfigError::Invalid {
            at,
            key,
            value: self.excerpt(span),
            allowed,
        }
    }
}

/// The names in serde's "expected one of `a`, `b`" / "expected `a` or `b`" text.
fn expected_names(expected: &str) -> Vec<String> {
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Levenshtein distance between two short strings.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The dotted key path (`cluster[1].port`) of the key or value that covers
/// byte `offset` of a syntactically valid document.
#[cfg(test)]
fn key_path_at(text: &str, offset: usize) -> Option<String> {
    let path = key_segments_at(text, offset);
    (!path.is_empty()).then(|| join_path(&path))
}

/// [`key_path_at`] as segments; empty when nothing covers `offset`.
fn key_segments_at(text: &str, offset: usize) -> Vec<Segment> {
    let mut path = Vec::new();
    if let Ok(doc) = DeTable::parse(text)
        && !find_in_table(doc.get_ref(), offset, &mut path)
    {
        path.clear();
    }
    path
}

enum Segment {
    Key(String),
    Index(usize),
}

fn join_path(path: &[Segment]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Segment::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

fn covers(span: &Range<usize>, offset: usize) -> bool {
    span.contains(&offset) || (span.is_empty() && span.start == offset)
}

/// Depth-first search: the deepest entry whose key or value covers `offset`.
/// Tables declared by `[header]` have the header's span, not their body's, so
/// children are always searched before the entry itself is tested.
fn find_in_table(table: &DeTable<'_>, offset: usize, path: &mut Vec<Segment>) -> bool {
    for (key, value) in table.iter() {
        path.push(Segment::Key(key.get_ref().to_string()));
        if find_in_value(value, offset, path)
            || covers(&key.span(), offset)
            || covers(&value.span(), offset)
        {
            return true;
        }
        path.pop();
    }
    false
}

fn find_in_value(value: &Spanned<DeValue<'_>>, offset: usize, path: &mut Vec<Segment>) -> bool {
    match value.get_ref() {
        DeValue::Table(table) => find_in_table(table, offset, path),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(Segment::Index(i));
                if find_in_value(item, offset, path) || covers(&item.span(), offset) {
                    return true;
                }
                path.pop();
            }
            false
        }
        _ => false,
    }
}

/// Best-effort key path for a syntax error at `offset`: the last `[table]` or
/// `[[array]]` header before it, plus the key on the line, if the line is a
/// `key = value` line.
pub(crate) fn guess_key_at(text: &str, offset: usize) -> Option<String> {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let line_start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let mut header: Option<String> = None;
    let mut array_counts: Vec<(String, usize)> = Vec::new();
    for line in text[..line_start].lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("[[").and_then(|l| l.split_once("]]")) {
            let name = name.0.trim().to_owned();
            let n = match array_counts.iter_mut().find(|(k, _)| *k == name) {
                Some((_, n)) => {
                    *n += 1;
                    *n
                }
                None => {
                    array_counts.push((name.clone(), 0));
                    0
                }
            };
            header = Some(format!("{name}[{n}]"));
        } else if let Some(name) = line.strip_prefix('[').and_then(|l| l.split_once(']')) {
            header = Some(name.0.trim().to_owned());
        }
    }
    let line = text[line_start..].lines().next().unwrap_or("");
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim())
        .filter(|k| !k.is_empty() && !k.starts_with('[') && !k.starts_with('#'));
    match (header, key) {
        (Some(h), Some(k)) => Some(format!("{h}.{k}")),
        (None, Some(k)) => Some(k.to_owned()),
        (h, None) => h.filter(|_| !line.trim_start().starts_with('[')),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_counts_lines_and_characters() {
        let text = "a = 1\nµµ = 2\n";
        let at = Location::of_offset("f.toml", text, text.find('=').unwrap());
        assert_eq!(at.to_string(), "f.toml:1:3");
        let at = Location::of_offset("f.toml", text, text.rfind('=').unwrap());
        assert_eq!(at.to_string(), "f.toml:2:4");
        let at = Location::of_offset("f.toml", text, 10_000);
        assert_eq!((at.line, at.column), (3, 1));
    }

    #[test]
    fn key_path_finds_nested_and_array_entries() {
        let text = "[ini]\nwindow = 3\n[[cluster]]\nhost = 'a'\n[[cluster]]\nport = 7\n";
        assert_eq!(
            key_path_at(text, text.find('3').unwrap()).as_deref(),
            Some("ini.window")
        );
        assert_eq!(
            key_path_at(text, text.find('7').unwrap()).as_deref(),
            Some("cluster[1].port")
        );
        assert_eq!(
            key_path_at(text, text.rfind("[[").unwrap()).as_deref(),
            Some("cluster[1]")
        );
        assert_eq!(
            key_path_at(text, text.find("host").unwrap()).as_deref(),
            Some("cluster[0].host")
        );
    }

    #[test]
    fn key_path_handles_dotted_and_inline_tables() {
        let text = "ini.window = 3\ndsm = { page_size = 9 }\n";
        assert_eq!(
            key_path_at(text, text.find('3').unwrap()).as_deref(),
            Some("ini.window")
        );
        assert_eq!(
            key_path_at(text, text.find('9').unwrap()).as_deref(),
            Some("dsm.page_size")
        );
    }

    #[test]
    fn guessed_key_uses_the_last_header() {
        let text = "[[cluster]]\nhost='a'\n[[cluster]]\nport = 0x\n";
        assert_eq!(
            guess_key_at(text, text.find("0x").unwrap()).as_deref(),
            Some("cluster[1].port")
        );
        let text = "[ini]\nwindow = = 3\n";
        assert_eq!(
            guess_key_at(text, text.rfind('=').unwrap()).as_deref(),
            Some("ini.window")
        );
        assert_eq!(guess_key_at("[ini\n", 4), None);
    }

    #[test]
    fn edit_distance_is_levenshtein() {
        assert_eq!(edit_distance("cluster", "clusters"), 1);
        assert_eq!(edit_distance("windw", "window"), 1);
        assert_eq!(edit_distance("abc", "xyz"), 3);
        assert_eq!(edit_distance("", "ab"), 2);
    }
}
