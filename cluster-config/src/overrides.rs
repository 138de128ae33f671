//! `--set KEY=VALUE`: one configuration value changed from the command line, validated
//! exactly like the file, with errors that name the flag instead of a file position.
//!
//! The file is parsed into TOML's span-keeping tree; each override's value is parsed as a
//! TOML value (a bare word such as `round-robin` is taken as a string) from a region
//! appended after the file's text, and put at its key, creating tables on the way. The
//! schema then sees one document: ranges, unknown keys and the rules across keys apply
//! as for a file, and any error whose position lies in an override's region is reported
//! as `--set KEY=VALUE: …`.

use std::ops::Range;
use std::str::FromStr;

use toml::Spanned;
use toml::de::{DeString, DeTable, DeValue};

use crate::error::{ConfigError, Location};

/// One `--set KEY=VALUE`: a dotted key (`ini.policy`, `local.clusters`, `cluster.1.threads`
/// for the second `[[cluster]]`) and a TOML value, or a bare word taken as a string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    /// Key segments; a segment of digits indexes an array of tables.
    pub key: Vec<String>,
    /// The value as written after `=`.
    pub value: String,
}

/// A `--set` argument that is not `KEY=VALUE`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not KEY=VALUE (e.g. ini.policy=round-robin, local.clusters=4, cluster.0.threads=2)"
)]
pub struct BadOverride(pub String);

impl FromStr for Override {
    type Err = BadOverride;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadOverride(s.to_owned());
        let (key, value) = s.split_once('=').ok_or_else(bad)?;
        let key: Vec<String> = key.trim().split('.').map(str::to_owned).collect();
        let ok_segment = |k: &String| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        if !key.iter().all(ok_segment) {
            return Err(bad());
        }
        Ok(Override {
            key,
            value: value.trim().to_owned(),
        })
    }
}

impl Override {
    /// The flag as the user wrote it, for errors.
    pub fn flag(&self) -> String {
        format!("--set {}", self.assignment())
    }

    /// `KEY=VALUE` as the user wrote it (dotted key, value unparsed): the argument of
    /// a `--set` that passes this override on to another command.
    pub fn assignment(&self) -> String {
        format!("{}={}", self.key.join("."), self.value)
    }

    /// The key as errors of the schema write it: `cluster[1].threads`.
    fn display_key(&self) -> String {
        let mut out = String::new();
        for seg in &self.key {
            if seg.bytes().all(|b| b.is_ascii_digit()) {
                out.push_str(&format!("[{seg}]"));
            } else {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(seg);
            }
        }
        out
    }

    /// The value as TOML: itself if it parses as a TOML value, else a TOML string.
    fn toml_text(&self) -> String {
        if DeValue::parse(&self.value).is_ok() {
            self.value.clone()
        } else {
            toml::Value::String(self.value.clone()).to_string()
        }
    }
}

/// The file's text with the overrides' values appended, and where each value lies.
pub(crate) struct Combined {
    pub text: String,
    /// Per override: its region of `text`, its flag and its key as errors write it.
    pub regions: Vec<(Range<usize>, String, String)>,
    /// Per override: the value as the user wrote it.
    pub values: Vec<String>,
}

impl Combined {
    pub(crate) fn new(file: &str, overrides: &[Override]) -> Combined {
        let mut text = file.to_owned();
        let mut regions = Vec::with_capacity(overrides.len());
        let values = overrides.iter().map(|o| o.value.clone()).collect();
        for o in overrides {
            text.push('\n');
            let start = text.len();
            text.push_str(&o.toml_text());
            regions.push((start..text.len(), o.flag(), o.display_key()));
        }
        Combined {
            text,
            regions,
            values,
        }
    }

    /// The value as written of the override whose region holds byte `offset`.
    pub(crate) fn value_at(&self, offset: usize) -> Option<&str> {
        self.regions
            .iter()
            .position(|(r, _, _)| r.contains(&offset))
            .map(|i| self.values[i].as_str())
    }

    /// The override whose region holds byte `offset`: (flag, display key).
    pub(crate) fn region_of(&self, offset: usize) -> Option<(&str, &str)> {
        self.regions
            .iter()
            .find(|(r, _, _)| r.contains(&offset) || (r.is_empty() && r.start == offset))
            .map(|(_, flag, key)| (flag.as_str(), key.as_str()))
    }
}

/// A location that is a flag, not a file position (prints as the flag alone).
pub(crate) fn flag_location(flag: &str) -> Location {
    Location {
        origin: flag.to_owned(),
        line: 0,
        column: 0,
    }
}

/// Moves every span of `v` (parsed from a slice starting at `by`) to the whole text.
fn shifted<'i>(v: Spanned<DeValue<'i>>, by: usize) -> Spanned<DeValue<'i>> {
    let span = v.span();
    let span = span.start + by..span.end + by;
    let inner = match v.into_inner() {
        DeValue::Array(items) => {
            let mut out = toml::de::DeArray::new();
            for item in items.iter().cloned() {
                out.push(shifted(item, by));
            }
            DeValue::Array(out)
        }
        DeValue::Table(t) => {
            let mut out = DeTable::new();
            for (k, val) in t {
                let ks = k.span();
                out.insert(
                    Spanned::new(ks.start + by..ks.end + by, k.into_inner()),
                    shifted(val, by),
                );
            }
            DeValue::Table(out)
        }
        other => other,
    };
    Spanned::new(span, inner)
}

/// Puts each override's value into `root` (parsed from `c.text`'s file part).
///
/// # Errors
/// [`ConfigError::Invalid`] located at the flag when a key walks into a value that is not
/// a table, or indexes past the end of an array of tables; a value that is not TOML
/// cannot happen (it is quoted as a string then).
pub(crate) fn apply<'i>(
    root: &mut DeTable<'i>,
    c: &'i Combined,
    overrides: &[Override],
) -> Result<(), ConfigError> {
    for (o, (region, flag, _)) in overrides.iter().zip(&c.regions) {
        let value = DeValue::parse(&c.text[region.clone()]).map_err(|e| ConfigError::Invalid {
            at: flag_location(flag),
            key: o.display_key(),
            value: o.value.clone(),
            allowed: format!("not a TOML value: {}", e.message().trim()),
        })?;
        let value = shifted(value, region.start);
        let fail = |what: String| ConfigError::Invalid {
            at: flag_location(flag),
            key: o.display_key(),
            value: o.value.clone(),
            allowed: what,
        };
        let key_span = || region.clone();
        let mut table: &mut DeTable<'i> = root;
        let (last, path) = o
            .key
            .split_last()
            .expect("FromStr makes at least one segment");
        let mut i = 0;
        while i < path.len() {
            let seg = &path[i];
            let name: DeString<'i> = seg.clone().into();
            if !table.contains_key(seg.as_str()) {
                table.insert(
                    Spanned::new(key_span(), name),
                    Spanned::new(key_span(), DeValue::Table(DeTable::new())),
                );
            }
            let entry = table.get_mut(seg.as_str()).expect("inserted above");
            table = match entry.get_mut() {
                DeValue::Table(t) => t,
                DeValue::Array(items) => {
                    let Some(index) = path.get(i + 1).and_then(|s| s.parse::<usize>().ok()) else {
                        return Err(fail(format!(
                            "`{seg}` is a list of tables; name one by its index, e.g. {seg}.0.{}",
                            o.key[i + 1..].join(".")
                        )));
                    };
                    let n = items.len();
                    match items.get_mut(index).map(Spanned::get_mut) {
                        Some(DeValue::Table(t)) => {
                            i += 1;
                            t
                        }
                        _ => {
                            return Err(fail(format!(
                                "`{seg}` has {n} entries (indexes 0..{n}); {index} is not one"
                            )));
                        }
                    }
                }
                _ => {
                    return Err(fail(format!(
                        "`{}` is a value, not a table",
                        o.key[..=i].join(".")
                    )));
                }
            };
            i += 1;
        }
        table.insert(Spanned::new(key_span(), last.clone().into()), value);
    }
    Ok(())
}
