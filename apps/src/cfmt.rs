//! C `printf` conversions (`%W.Pf`, `%W.Pe`, `%g`) as glibc prints them, for output that
//! must match SPLASH's byte for byte. Rust's float formatting is exact (correctly rounded,
//! ties to even on exact ties), as glibc's is; only the spelling of exponents and
//! non-finite values differs, which these helpers fix.

/// C spelling of a non-finite value (`inf`, `-inf`, `nan`, `-nan`), or `None` if finite.
fn non_finite(x: f64) -> Option<&'static str> {
    if x.is_nan() {
        Some(if x.is_sign_negative() { "-nan" } else { "nan" })
    } else if x.is_infinite() {
        Some(if x < 0.0 { "-inf" } else { "inf" })
    } else {
        None
    }
}

/// `%{width}.{prec}f`.
pub(crate) fn fixed(x: f64, width: usize, prec: usize) -> String {
    match non_finite(x) {
        Some(s) => format!("{s:>width$}"),
        None => format!("{x:>width$.prec$}"),
    }
}

/// Unpadded `%.{prec}e`.
fn exp_body(x: f64, prec: usize) -> String {
    if let Some(s) = non_finite(x) {
        return s.to_owned();
    }
    let rust = format!("{x:.prec$e}");
    let (mantissa, exponent) = rust
        .split_once('e')
        .expect("Rust's {:e} output always has an exponent");
    let exponent: i32 = exponent
        .parse()
        .expect("Rust's {:e} exponent is an integer");
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
}

/// `%{width}.{prec}e`.
pub(crate) fn exp(x: f64, width: usize, prec: usize) -> String {
    format!("{:>width$}", exp_body(x, prec))
}

/// `%g` (precision 6, no width).
pub(crate) fn general(x: f64) -> String {
    const P: i32 = 6;
    if let Some(s) = non_finite(x) {
        return s.to_owned();
    }
    // Exponent of x after rounding to P significant digits.
    let e_form = format!("{x:.*e}", (P - 1) as usize);
    let exponent: i32 = e_form
        .split_once('e')
        .and_then(|(_, e)| e.parse().ok())
        .expect("Rust's {:e} output has an integer exponent");
    let mut s = if (-4..P).contains(&exponent) {
        format!("{x:.*}", (P - 1 - exponent) as usize)
    } else {
        exp_body(x, (P - 1) as usize)
    };
    // Remove trailing zeros of the fraction (and a bare point).
    let (body, tail) = match s.find('e') {
        Some(i) => (s[..i].to_owned(), s[i..].to_owned()),
        None => (s.clone(), String::new()),
    };
    if body.contains('.') {
        let trimmed = body.trim_end_matches('0').trim_end_matches('.');
        s = format!("{trimmed}{tail}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected strings are what glibc's printf prints for the same conversions.
    #[test]
    fn fixed_matches_c() {
        assert_eq!(fixed(1.509_396, 14, 5), "       1.50940");
        assert_eq!(fixed(-2.124_514, 12, 5), "    -2.12451");
        assert_eq!(fixed(10.0255, 16, 3), "          10.025");
        assert_eq!(fixed(10.02551, 16, 3), "          10.026");
        assert_eq!(fixed(0.25, 0, 1), "0.2");
        assert_eq!(fixed(-0.0, 8, 2), "   -0.00");
        assert_eq!(fixed(f64::NAN, 6, 2), "   nan");
        assert_eq!(fixed(f64::NEG_INFINITY, 6, 2), "  -inf");
        assert_eq!(fixed(6.212_752, 10, 6), "  6.212752");
    }

    #[test]
    fn exp_matches_c() {
        assert_eq!(exp(1.5e-16, 8, 2), "1.50e-16");
        assert_eq!(exp(0.15, 8, 2), "1.50e-01");
        assert_eq!(exp(1.0, 0, 3), "1.000e+00");
        assert_eq!(exp(-12345.0, 12, 2), "   -1.23e+04");
        assert_eq!(exp(1e300, 0, 1), "1.0e+300");
    }

    #[test]
    fn general_matches_c() {
        assert_eq!(general(1.553_190_4), "1.55319");
        assert_eq!(general(10.025_49), "10.0255");
        assert_eq!(general(100_000.0), "100000");
        assert_eq!(general(1_000_000.0), "1e+06");
        assert_eq!(general(999_999.5), "1e+06");
        assert_eq!(general(0.0001), "0.0001");
        assert_eq!(general(0.000_012_345_67), "1.23457e-05");
        assert_eq!(general(0.0), "0");
        assert_eq!(general(-2.5), "-2.5");
        assert_eq!(general(f64::NAN), "nan");
        assert_eq!(general(-f64::NAN), "-nan");
    }
}
