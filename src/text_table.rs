//! Aligned plain-text tables, as the commands print them (`bench apps`, `experiment`).

/// `head` and `rows` as aligned text, one line each ending in a newline: two spaces of
/// indent, each column padded to its widest cell (counted in characters, so `×` and `–`
/// count one), `gap` spaces between columns, no trailing spaces.
///
/// # Panics
/// If a row has not one cell per heading (a bug in the caller).
pub fn aligned<R, S>(head: &[&str], rows: &[R], gap: usize) -> String
where
    R: AsRef<[S]>,
    S: AsRef<str>,
{
    for r in rows {
        assert_eq!(r.as_ref().len(), head.len(), "a row of {head:?}");
    }
    let widths: Vec<usize> = (0..head.len())
        .map(|k| {
            rows.iter()
                .map(|r| r.as_ref()[k].as_ref().chars().count())
                .chain([head[k].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::from("  ");
        for (k, (s, w)) in cells.zip(&widths).enumerate() {
            if k > 0 {
                l.push_str(&" ".repeat(gap));
            }
            l.push_str(s);
            l.push_str(&" ".repeat(w.saturating_sub(s.chars().count())));
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut head.iter().copied());
    for r in rows {
        line(&mut r.as_ref().iter().map(AsRef::as_ref));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::aligned;

    #[test]
    fn columns_align_on_characters_with_the_gap_asked_for() {
        let rows = [["2×1 shm", "1.41 (1.31–1.73)", "met"], ["x", "1", ""]];
        assert_eq!(
            aligned(&["configuration", "ratio", "verdict"], &rows, 2),
            "  configuration  ratio             verdict\n\
             \x20 2×1 shm        1.41 (1.31–1.73)  met\n\
             \x20 x              1\n"
        );
        let rows = vec![vec!["a".to_owned(), "b".to_owned()]];
        assert_eq!(aligned(&["h", "hh"], &rows, 1), "  h hh\n  a b\n");
    }

    #[test]
    #[should_panic(expected = "a row of")]
    fn a_row_of_the_wrong_width_is_a_bug() {
        aligned(&["one", "two"], &[["only"]], 2);
    }
}
