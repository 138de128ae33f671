//! An experiment's tables: typed cells (text, counts, numbers, median (min–max) of the
//! rounds), printed as aligned text and written as CSV and JSON.

use crate::measure::{Summary, num, secs};
use crate::text_table::aligned;
use serde::Serialize;
use serde_json::{Map, Value, json};
use std::fmt::Write as _;

/// How a column's numbers are printed (the CSV and JSON keep them unrounded).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fmt {
    /// Text or a count, as it is.
    Plain,
    /// Seconds, 3 significant digits.
    Secs,
    /// A number, 3 significant digits.
    Num,
    /// A count (a median of counts may be a half), rounded to a whole number.
    Count,
    /// A ratio, 2 decimals (e.g. a slowdown).
    Ratio,
    /// A fraction in [0, 1] shown as a percentage with 1 decimal.
    Pct,
    /// A relative error or change, a signed percentage with 1 decimal (`+12.5%`).
    SignedPct,
}

impl Fmt {
    fn show(self, x: f64) -> String {
        match self {
            Fmt::Plain => format!("{x}"),
            Fmt::Secs => secs(x),
            Fmt::Num => num(x),
            Fmt::Count => format!("{x:.0}"),
            Fmt::Ratio => format!("{x:.2}"),
            Fmt::Pct => format!("{:.1}%", 100.0 * x),
            Fmt::SignedPct => format!("{:+.1}%", 100.0 * x),
        }
    }
}

/// One column: `key` names it in the CSV header and the JSON rows, `head` in the
/// printed table (with its unit).
#[derive(Clone, Debug, Serialize)]
pub struct Column {
    /// Machine name, e.g. `run_s`.
    pub key: &'static str,
    /// Printed heading, e.g. `run time (s)`.
    pub head: &'static str,
    /// How its numbers are printed.
    pub fmt: Fmt,
    /// Print only the median of a [`Cell::Stat`] (the spread stays in CSV and JSON).
    pub median_only: bool,
}

impl Column {
    /// A column printed in full.
    pub const fn new(key: &'static str, head: &'static str, fmt: Fmt) -> Column {
        Column {
            key,
            head,
            fmt,
            median_only: false,
        }
    }

    /// A column whose spread is left out of the printed table.
    pub const fn median(key: &'static str, head: &'static str, fmt: Fmt) -> Column {
        Column {
            key,
            head,
            fmt,
            median_only: true,
        }
    }
}

/// One cell.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    /// Text.
    Text(String),
    /// A count.
    Int(u64),
    /// A quantity measured once per round: median (min–max) of the rounds.
    Stat(Summary),
    /// Nothing to show (not applicable, or every run failed).
    Missing,
}

impl Cell {
    /// Text from anything printable.
    pub fn text(s: impl Into<String>) -> Cell {
        Cell::Text(s.into())
    }

    /// The summary of `values` (non-finite values left out), or [`Cell::Missing`].
    pub fn stat(values: &[f64]) -> Cell {
        let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            Cell::Missing
        } else {
            Cell::Stat(Summary::of(&v))
        }
    }

    fn show(&self, col: &Column) -> String {
        match self {
            Cell::Text(s) => s.clone(),
            Cell::Int(n) => n.to_string(),
            Cell::Stat(s) if col.median_only || s.samples == 1 || s.min == s.max => {
                col.fmt.show(s.median)
            }
            Cell::Stat(s) => format!(
                "{} ({}–{})",
                col.fmt.show(s.median),
                col.fmt.show(s.min),
                col.fmt.show(s.max)
            ),
            Cell::Missing => "—".to_owned(),
        }
    }

    fn json(&self) -> Value {
        match self {
            Cell::Text(s) => json!(s),
            Cell::Int(n) => json!(n),
            Cell::Stat(s) => json!({
                "median": s.median, "min": s.min, "max": s.max, "samples": s.samples
            }),
            Cell::Missing => Value::Null,
        }
    }
}

/// A table of an experiment, shaped like the paper's.
#[derive(Clone, Debug)]
pub struct Table {
    /// File stem of its CSV, e.g. `ini-scheduling`.
    pub id: String,
    /// Its title (what it reproduces).
    pub title: String,
    /// Its columns.
    pub columns: Vec<Column>,
    /// Its rows, one cell per column.
    pub rows: Vec<Vec<Cell>>,
    /// Lines printed under it (definitions, calibration, the machine).
    pub notes: Vec<String>,
}

/// Quotes a CSV field when it needs it (RFC 4180).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

impl Table {
    /// A table with no rows yet.
    pub fn new(id: impl Into<String>, title: impl Into<String>, columns: Vec<Column>) -> Table {
        Table {
            id: id.into(),
            title: title.into(),
            columns,
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Adds a row.
    ///
    /// # Panics
    /// If it has not one cell per column (a bug in the experiment).
    pub fn push(&mut self, row: Vec<Cell>) {
        assert_eq!(row.len(), self.columns.len(), "{}: row width", self.id);
        self.rows.push(row);
    }

    /// The table as aligned text: title, heading, rows, notes.
    pub fn render(&self) -> String {
        let cells: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                r.iter()
                    .zip(&self.columns)
                    .map(|(c, k)| c.show(k))
                    .collect()
            })
            .collect();
        let head: Vec<&str> = self.columns.iter().map(|c| c.head).collect();
        let mut out = format!("{}\n{}", self.title, aligned(&head, &cells, 1));
        for n in &self.notes {
            let _ = writeln!(out, "  {n}");
        }
        out
    }

    /// The table as CSV: a [`Cell::Stat`] column becomes `KEY_median,KEY_min,KEY_max`;
    /// a missing value is an empty field.
    pub fn csv(&self) -> String {
        let stat_cols: Vec<bool> = (0..self.columns.len())
            .map(|k| self.rows.iter().any(|r| matches!(r[k], Cell::Stat(_))))
            .collect();
        let mut head = Vec::new();
        for (c, &stat) in self.columns.iter().zip(&stat_cols) {
            if stat {
                head.extend(["median", "min", "max"].map(|s| format!("{}_{s}", c.key)));
            } else {
                head.push(c.key.to_owned());
            }
        }
        let mut out = head.join(",") + "\n";
        for r in &self.rows {
            let mut fields = Vec::new();
            for (cell, &stat) in r.iter().zip(&stat_cols) {
                match (cell, stat) {
                    (Cell::Stat(s), _) => {
                        fields.extend([s.median, s.min, s.max].map(|x| x.to_string()))
                    }
                    (Cell::Missing, true) => {
                        fields.extend([String::new(), String::new(), String::new()])
                    }
                    (Cell::Missing, false) => fields.push(String::new()),
                    (Cell::Int(n), true) => {
                        fields.extend([n.to_string(), n.to_string(), n.to_string()])
                    }
                    (Cell::Text(s), true) => {
                        fields.extend([csv_field(s), String::new(), String::new()])
                    }
                    (Cell::Text(s), false) => fields.push(csv_field(s)),
                    (Cell::Int(n), false) => fields.push(n.to_string()),
                }
            }
            out += &(fields.join(",") + "\n");
        }
        out
    }

    /// The table as JSON: id, title, columns, notes and one object per row keyed by the
    /// columns' keys (a [`Cell::Stat`] as `{median, min, max, samples}`).
    pub fn json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                let mut m = Map::new();
                for (c, cell) in self.columns.iter().zip(r) {
                    m.insert(c.key.to_owned(), cell.json());
                }
                Value::Object(m)
            })
            .collect();
        json!({
            "id": self.id,
            "title": self.title,
            "columns": self.columns,
            "notes": self.notes,
            "rows": rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        let mut t = Table::new(
            "t",
            "Title",
            vec![
                Column::new("name", "name", Fmt::Plain),
                Column::new("run_s", "run time (s)", Fmt::Secs),
                Column::median("util", "util", Fmt::Pct),
            ],
        );
        t.push(vec![
            Cell::text("a, b"),
            Cell::stat(&[0.5, 0.25, 1.0]),
            Cell::stat(&[0.1, 0.3]),
        ]);
        t.push(vec![Cell::text("c"), Cell::Missing, Cell::Int(1)]);
        t.notes.push("a note".into());
        t
    }

    #[test]
    fn text_shows_median_and_range() {
        let text = table().render();
        assert!(text.contains("0.500 (0.250–1.00)"), "{text}");
        assert!(text.contains("20.0%"), "median only: {text}");
        assert!(!text.contains("10.0%"), "{text}");
        assert!(text.contains("—"), "{text}");
        assert!(text.ends_with("  a note\n"), "{text}");
    }

    #[test]
    fn csv_splits_summaries_and_quotes_text() {
        let csv = table().csv();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines[0],
            "name,run_s_median,run_s_min,run_s_max,util_median,util_min,util_max"
        );
        assert_eq!(lines[1], "\"a, b\",0.5,0.25,1,0.2,0.1,0.3");
        assert_eq!(lines[2], "c,,,,1,1,1");
    }

    #[test]
    fn json_rows_are_keyed_by_column() {
        let j = table().json();
        assert_eq!(j["rows"][0]["run_s"]["median"], 0.5);
        assert_eq!(j["rows"][0]["run_s"]["samples"], 3);
        assert!(j["rows"][1]["run_s"].is_null());
        assert_eq!(j["columns"][1]["fmt"], "secs");
    }
}
