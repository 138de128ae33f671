//! SPLASH-2 Water input deck: ten whitespace-separated fields, read like SPLASH's
//! `scanf("%lf%ld%ld%ld%ld%ld%ld%ld%ld%lf")`:
//!
//! ```text
//! TSTEP NMOL NSTEP NORDER
//! NSAVE NRST NPRINT NFMC
//! NumProcs CUTOFF
//! ```
//!
//! Line breaks carry no meaning (SPLASH's `scanf` ignores them); they are only used to
//! name the line of a bad field. Anything after the tenth field is an error.

use std::path::{Path, PathBuf};

use super::{Params, VelocitySource};

/// Field names in file order.
const FIELDS: [&str; 10] = [
    "TSTEP", "NMOL", "NSTEP", "NORDER", "NSAVE", "NRST", "NPRINT", "NFMC", "NumProcs", "CUTOFF",
];

/// A parsed SPLASH Water input deck.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct InputDeck {
    /// The simulation parameters (velocities default to [`VelocitySource::default`]; set
    /// them from the command line).
    pub params: Params,
    /// NSAVE: SPLASH's data-saving period in steps (it saves nothing; parsed and kept).
    pub nsave: i64,
    /// NRST: restart-file period in steps (unused by SPLASH too).
    pub nrst: i64,
    /// NFMC: historical, unused.
    pub nfmc: i64,
    /// NumProcs: the processor count the deck asks for (≥ 1).
    pub num_procs: usize,
}

impl InputDeck {
    /// A deck for `params` on `num_procs` processors, with the other fields as in
    /// SPLASH's supplied decks (NSAVE = -1, NRST = 3000, NFMC = 0).
    #[must_use]
    pub fn from_params(params: Params, num_procs: usize) -> Self {
        Self {
            params,
            nsave: -1,
            nrst: 3000,
            nfmc: 0,
            num_procs,
        }
    }
}

/// What is wrong with an input deck.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The file could not be read.
    #[error("{}: cannot read input deck", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The deck ended before all ten fields.
    #[error(
        "{source_name}:{line}: missing field {field} (the deck has only {found} of 10 fields: TSTEP NMOL NSTEP NORDER / NSAVE NRST NPRINT NFMC / NumProcs CUTOFF)"
    )]
    MissingField {
        /// File name (or other label) of the deck.
        source_name: String,
        /// Last line of the deck (1-based).
        line: usize,
        /// The first missing field.
        field: &'static str,
        /// How many fields were present.
        found: usize,
    },
    /// A field does not parse or is out of range.
    #[error("{source_name}:{line}: field {field} = {text:?}: {problem}")]
    BadField {
        /// File name (or other label) of the deck.
        source_name: String,
        /// Line of the field (1-based).
        line: usize,
        /// Field name, e.g. `NMOL`.
        field: &'static str,
        /// The text found.
        text: String,
        /// What is wrong.
        problem: String,
    },
    /// Text after the tenth field.
    #[error("{source_name}:{line}: unexpected text {text:?} after the 10 fields")]
    Trailing {
        /// File name (or other label) of the deck.
        source_name: String,
        /// Line of the extra text (1-based).
        line: usize,
        /// The first extra token.
        text: String,
    },
}

/// Reads and parses an input deck file.
///
/// # Errors
/// [`InputError`] naming the file, line and field of the first problem.
pub fn parse_input_file(path: &Path) -> Result<InputDeck, InputError> {
    let text = std::fs::read_to_string(path).map_err(|source| InputError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse_input_str(&text, &path.display().to_string())
}

/// Parses the text of an input deck; `source_name` labels errors (usually the path).
///
/// # Errors
/// [`InputError`] naming the source, line and field of the first problem.
pub fn parse_input_str(text: &str, source_name: &str) -> Result<InputDeck, InputError> {
    let mut tokens = text
        .lines()
        .enumerate()
        .flat_map(|(i, l)| l.split_whitespace().map(move |t| (i + 1, t)));
    let last_line = text.lines().count().max(1);
    let mut fields: Vec<(usize, &str)> = Vec::with_capacity(10);
    for (k, field) in FIELDS.iter().enumerate() {
        match tokens.next() {
            Some(tok) => fields.push(tok),
            None => {
                return Err(InputError::MissingField {
                    source_name: source_name.to_owned(),
                    line: last_line,
                    field,
                    found: k,
                });
            }
        }
    }
    if let Some((line, text)) = tokens.next() {
        return Err(InputError::Trailing {
            source_name: source_name.to_owned(),
            line,
            text: text.to_owned(),
        });
    }
    let bad = |k: usize, problem: String| InputError::BadField {
        source_name: source_name.to_owned(),
        line: fields[k].0,
        field: FIELDS[k],
        text: fields[k].1.to_owned(),
        problem,
    };
    let float = |k: usize| -> Result<f64, InputError> {
        let v: f64 = fields[k]
            .1
            .parse()
            .map_err(|_| bad(k, "not a floating-point number".to_owned()))?;
        if v.is_finite() {
            Ok(v)
        } else {
            Err(bad(k, "must be finite".to_owned()))
        }
    };
    let int = |k: usize| -> Result<i64, InputError> {
        fields[k]
            .1
            .parse()
            .map_err(|_| bad(k, "not an integer".to_owned()))
    };
    let at_least = |k: usize, min: i64| -> Result<usize, InputError> {
        let v = int(k)?;
        if v < min {
            return Err(bad(k, format!("must be at least {min}")));
        }
        usize::try_from(v).map_err(|_| bad(k, "too large".to_owned()))
    };

    let timestep_s = float(0)?;
    if timestep_s <= 0.0 {
        return Err(bad(
            0,
            "the time step must be positive (seconds)".to_owned(),
        ));
    }
    let molecules = at_least(1, 1)?;
    let steps = at_least(2, 0)?;
    let order = at_least(3, 3)?;
    if order > super::MAX_ORDER {
        return Err(bad(
            3,
            format!(
                "the predictor-corrector order must be 3..={}",
                super::MAX_ORDER
            ),
        ));
    }
    let nsave = int(4)?;
    let nrst = int(5)?;
    let print_every = at_least(6, 1)?;
    let nfmc = int(7)?;
    let num_procs = at_least(8, 1)?;
    let cutoff_angstrom = float(9)?;
    if cutoff_angstrom < 0.0 {
        return Err(bad(
            9,
            "must be 0 (half the box) or positive (Angstrom)".to_owned(),
        ));
    }
    Ok(InputDeck {
        params: Params {
            molecules,
            steps,
            timestep_s,
            order,
            print_every,
            cutoff_angstrom,
            velocities: VelocitySource::default(),
        },
        nsave,
        nrst,
        nfmc,
        num_procs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const N512: &str = "  1.5e-16   512  3   6\n -1      3000     3  0\n1 6.212752\n";

    #[test]
    fn parses_splash_deck() {
        let d = parse_input_str(N512, "n512-p1").unwrap();
        assert_eq!(d.params.molecules, 512);
        assert_eq!(d.params.steps, 3);
        assert_eq!(d.params.order, 6);
        assert_eq!(d.params.print_every, 3);
        assert_eq!(d.params.timestep_s, 1.5e-16);
        assert_eq!(d.params.cutoff_angstrom, 6.212752);
        assert_eq!((d.nsave, d.nrst, d.nfmc, d.num_procs), (-1, 3000, 0, 1));
    }

    #[test]
    fn line_breaks_do_not_matter() {
        let d = parse_input_str("1.5e-16 343 2 6 -1 3000 1 0 4 0", "x").unwrap();
        assert_eq!(d.params.molecules, 343);
        assert_eq!(d.num_procs, 4);
        assert_eq!(d.params.cutoff_angstrom, 0.0);
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let e = parse_input_str("1.5e-16 512 3 6\n-1 3000 x 0\n1 6.2\n", "deck").unwrap_err();
        assert_eq!(
            e.to_string(),
            "deck:2: field NPRINT = \"x\": not an integer"
        );
        let e = parse_input_str("1.5e-16 512 3 6\n-1 3000 0 0\n1 6.2\n", "deck").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("deck:2: field NPRINT = \"0\": must be at least 1"),
            "{e}"
        );
        let e = parse_input_str("1.5e-16 512 3\n", "deck").unwrap_err();
        assert!(
            e.to_string().starts_with("deck:1: missing field NORDER"),
            "{e}"
        );
        let e = parse_input_str(&format!("{N512}\n7\n"), "deck").unwrap_err();
        assert_eq!(
            e.to_string(),
            "deck:5: unexpected text \"7\" after the 10 fields"
        );
        let e = parse_input_str("1.5e-16 512 3 9 -1 3000 1 0 1 6.2", "deck").unwrap_err();
        assert!(e.to_string().contains("field NORDER"), "{e}");
        let e = parse_input_str("-1 512 3 6 -1 3000 1 0 1 6.2", "deck").unwrap_err();
        assert!(e.to_string().contains("field TSTEP"), "{e}");
        let e = parse_input_str("1e-16 512 3 6 -1 3000 1 0 1 nan", "deck").unwrap_err();
        assert!(e.to_string().contains("field CUTOFF"), "{e}");
    }

    #[test]
    fn missing_file_is_reported_with_its_path() {
        let e = parse_input_file(Path::new("/nonexistent/deck.in")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/deck.in"), "{e}");
    }

    proptest::proptest! {
        /// The parser never panics; it either parses or names a line within the text.
        #[test]
        fn parser_never_panics(text in "[ \t\n0-9eE.+-]{0,80}") {
            match parse_input_str(&text, "p") {
                Ok(d) => proptest::prop_assert!(d.params.molecules >= 1),
                Err(e) => proptest::prop_assert!(e.to_string().starts_with("p:")),
            }
        }
    }
}
