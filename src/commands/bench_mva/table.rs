//! The text table of `multigrain bench mva` (paper 002 Figure 6-3 as numbers).

use super::Report;
use crate::synthetic::Work;
use std::fmt::Write as _;

fn pct(x: f64) -> String {
    format!("{:+.1}%", x * 100.0)
}

/// The report as text: a header with the machine and the calibrated inputs, one row per
/// N, a legend, and the model's curve for the thesis's Figure 6-3 inputs.
pub fn render(r: &Report) -> String {
    let o = &r.options;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "multigrain bench mva: N client threads in cluster 0 → 1 server thread in cluster 1, one dedicated INI per cluster, UDP on loopback; \
         W = {} µs ({}), {} timed requests per client, {} run(s) per N; this machine: {} core(s); wall time {:.1} s",
        o.work_us,
        match o.work {
            Work::Spin => "spin",
            Work::Sleep => "sleep",
        },
        o.requests,
        o.samples,
        r.cores,
        r.wall_s
    );
    let _ = writeln!(s, "{}", inputs_line(r));
    let _ = writeln!(
        s,
        "\n{:>3} {:>9} │ {:>22} {:>7} {:>7} {:>7} {:>7} │ {:>26} {:>8} {:>7} {:>8} │ {:>9} {:>9} {:>5} │ {:>4}",
        "N",
        "threads",
        "Q measured (min–max)",
        "Q eq.6",
        "err",
        "Q MVA",
        "Q seen",
        "R measured µs (min–max)",
        "R eq.6",
        "err",
        "R MVA",
        "R_o meas",
        "R_o eq.6",
        "util",
        "Q≤N"
    );
    for row in &r.rows {
        let q = &row.q_measured;
        let rr = &row.r_measured;
        let _ = writeln!(
            s,
            "{:>3} {:>4}{:>5} │ {:>22} {:>7.3} {:>7} {:>7.3} {:>7.3} │ {:>26} {:>8.1} {:>7} {:>8.1} │ {:>9.2} {:>9.2} {:>4.0}% │ {:>4}",
            row.n,
            row.threads,
            if row.oversubscribed { " over" } else { "" },
            format!("{:.3} ({:.3}–{:.3})", q.median, q.min, q.max),
            row.q_model,
            pct(row.q_error),
            row.q_exact,
            row.q_seen_measured,
            format!("{:.1} ({:.1}–{:.1})", rr.median, rr.min, rr.max),
            row.r_model,
            pct(row.r_error),
            row.r_exact,
            row.ini_time_measured,
            row.ini_time_model,
            row.ini_utilization * 100.0,
            if row.q_within_n { "yes" } else { "NO" }
        );
    }
    let _ = writeln!(
        s,
        "\n{} threads = N clients + 1 server + 2 INIs, \"over\" = more than the {} core(s); \
         Q≤N: measured maximum and all three predictions ≤ N (eq. 6.11).",
        LEGEND, r.cores
    );
    let _ = writeln!(s, "{}", schweitzer_line(r));
    let _ = writeln!(s, "{}", figure_6_3_line(r));
    s
}

/// The model's inputs as calibrated, one line.
pub fn inputs_line(r: &Report) -> String {
    let c = &r.calibration;
    format!(
        "model inputs from the median N = 1 run (µs): W = {:.1}, o = {:.2}, O = {:.2}, l = {:.2}, L = {:.2} (lone cycle {:.1})",
        c.w, c.o, c.big_o, c.l, c.big_l, c.solo_cycle
    )
}

/// What the columns mean (Q, eq.6, MVA, Q seen, R, R_o, err).
pub const LEGEND: &str = "Q: messages in one INI (queued or in processing), time average (Little: messages × time in the INI ÷ time, from the INI traces, central 90 % of each run), mean of the two INIs; \
     eq.6: paper 002 equations 6.1–6.10 as printed, for this client–server pattern (6.3′ Q_q = NλR_q, 6.5′ Q_o = 2NλR_o, 6.6′/6.7′ no replies at the server, 6.9′ R_w = W); \
     MVA: exact mean value analysis of the same network; Q seen: messages an arriving message finds in the INI (trace summary, itself excluded); \
     R: cycle time (compute start → reply received); R_o: a message's time in one INI; err = (eq.6 − measured) / measured;";

/// The model's `Q_o` with Schweitzer's arrivals for every N, one line.
pub fn schweitzer_line(r: &Report) -> String {
    let sw: Vec<String> = r
        .rows
        .iter()
        .map(|x| format!("{:.3}", x.q_model_schweitzer))
        .collect();
    format!(
        "Q with Schweitzer's arrivals (an arrival does not see itself), N = 1…: {}",
        sw.join(" ")
    )
}

/// The model's `Q_o` for the thesis's own Figure 6-3 inputs, one line.
pub fn figure_6_3_line(r: &Report) -> String {
    let fig: Vec<String> = r
        .figure_6_3_model
        .iter()
        .map(|q| format!("{q:.3}"))
        .collect();
    format!(
        "Figure 6-3's inputs (W = 41789, o = 742, O = 2336, l = L = 0 Alewife cycles, homogeneous pattern): model Q, N = 1…: {}",
        fig.join(" ")
    )
}
