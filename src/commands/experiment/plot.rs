//! An experiment's figure: grouped bars (median of the rounds) with min–max whiskers,
//! or, per series, points with min–max error bars or lines through the groups (e.g. a
//! measured curve beside a model's), drawn with `plotters` as PNG and SVG. Text uses the DejaVu Sans font embedded in the
//! binary (plotters' `ab_glyph` feature), so no system font or fontconfig is needed.

use crate::measure::Summary;
use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A bar per group (median) with a min–max whisker; the bar series of a figure sit
    /// side by side in each group.
    Bar,
    /// A point per group (median) with a min–max error bar, at the group's centre.
    Points,
    /// A line through the groups' centres (median), with a small mark at each.
    Line,
}

/// One series: a bar, point or line vertex in every group where it has a value.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text, e.g. `round-robin`.
    pub name: String,
    /// How it is drawn.
    pub kind: Kind,
    /// Per group (in [`Figure::groups`] order), the value's summary over the rounds.
    pub values: Vec<Option<Summary>>,
}

/// A grouped bar chart.
#[derive(Clone, Debug)]
pub struct Figure {
    /// Title over the chart.
    pub title: String,
    /// The y axis' label, with its unit.
    pub y_label: String,
    /// The x axis' groups, left to right.
    pub groups: Vec<String>,
    /// The series; each draws one bar per group.
    pub series: Vec<Series>,
}

/// Where the legend sits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Legend {
    /// Upper left (the default: rising curves and bars leave it free).
    #[default]
    UpperLeft,
    /// Lower right (curves that saturate at the top, e.g. a fraction of a peak).
    LowerRight,
}

/// How a figure is drawn beyond its data: the y axis' scale and the legend's place.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Style {
    /// A logarithmic y axis (decades; for values spanning several orders of magnitude,
    /// e.g. latency or bandwidth against message size). Values ≤ 0 are left out.
    pub log_y: bool,
    /// The legend's place.
    pub legend: Legend,
}

/// Picture size, pixels.
const SIZE: (u32, u32) = (1100, 620);

/// Registers the embedded font as plotters' `sans-serif` (once per process).
fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // DejaVu Sans is a valid TrueType font: registering cannot fail.
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
    });
}

/// A series' colour.
fn colour(i: usize) -> RGBColor {
    const C: [RGBColor; 12] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
        RGBColor(0, 0, 0),
        RGBColor(255, 187, 120),
    ];
    C[i % C.len()]
}

/// `fig` with every value replaced by its log10 (values ≤ 0 dropped), and the y range
/// to draw it in (whole decades around the data).
fn log_figure(fig: &Figure) -> (Figure, f64, f64) {
    let log = |v: &Summary| -> Option<Summary> {
        (v.min > 0.0 && v.median > 0.0).then(|| Summary {
            median: v.median.log10(),
            p25: v.p25.max(v.min).log10(),
            p75: v.p75.max(v.min).log10(),
            min: v.min.log10(),
            max: v.max.log10(),
            samples: v.samples,
        })
    };
    let mut out = fig.clone();
    for s in &mut out.series {
        s.values = s.values.iter().map(|v| v.as_ref().and_then(log)).collect();
    }
    let all = || out.series.iter().flat_map(|s| s.values.iter().flatten());
    let lo = all().map(|v| v.min).fold(f64::INFINITY, f64::min);
    let hi = all().map(|v| v.max).fold(f64::NEG_INFINITY, f64::max);
    if lo.is_finite() && hi.is_finite() {
        let (lo, hi) = (lo.floor(), hi.ceil().max(lo.floor() + 1.0));
        // Room for the legend over the data.
        (out, lo, hi + 0.25 * (hi - lo))
    } else {
        (out, 0.0, 1.0)
    }
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, fig: &Figure, style: Style) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing the figure: {e}");
    root.fill(&WHITE).map_err(err)?;
    let logged;
    let (fig, bottom, top) = if style.log_y {
        let (f, lo, hi) = log_figure(fig);
        logged = f;
        (&logged, lo, hi)
    } else {
        let top = fig
            .series
            .iter()
            .flat_map(|s| s.values.iter().flatten())
            .map(|s| s.max.max(s.median))
            .fold(0.0f64, f64::max);
        let top = if top > 0.0 && top.is_finite() {
            top * 1.12
        } else {
            1.0
        };
        (fig, 0.0, top)
    };
    let y_tick = |y: &f64| {
        if style.log_y {
            crate::measure::num(10f64.powf(*y))
        } else {
            format!("{y}")
        }
    };
    let n = fig.groups.len().max(1) as f64;
    let mut chart = ChartBuilder::on(root)
        .caption(&fig.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(70)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..n, bottom..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .disable_x_axis()
        .y_labels(if style.log_y {
            (top - bottom).ceil() as usize + 1
        } else {
            10
        })
        .y_label_formatter(&y_tick)
        .y_desc(fig.y_label.as_str())
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(err)?;
    let bar_series = fig.series.iter().filter(|s| s.kind == Kind::Bar).count();
    let k = bar_series.max(1) as f64;
    let width = 0.8 / k;
    let mut bar_index = 0usize;
    for (si, s) in fig.series.iter().enumerate() {
        let c = colour(si);
        let at: Vec<(usize, Summary)> = s
            .values
            .iter()
            .enumerate()
            .filter_map(|(g, v)| v.map(|v| (g, v)))
            .collect();
        match s.kind {
            Kind::Bar => {
                let bi = bar_index as f64;
                bar_index += 1;
                let bars: Vec<(f64, Summary)> = at
                    .iter()
                    .map(|&(g, v)| (g as f64 + 0.1 + bi * width, v))
                    .collect();
                chart
                    .draw_series(bars.iter().map(|&(x0, v)| {
                        Rectangle::new([(x0, bottom), (x0 + width * 0.9, v.median)], c.filled())
                    }))
                    .map_err(err)?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled())
                    });
                chart
                    .draw_series(bars.iter().map(|&(x0, v)| {
                        let xm = x0 + width * 0.45;
                        PathElement::new(vec![(xm, v.min), (xm, v.max)], BLACK.stroke_width(2))
                    }))
                    .map_err(err)?;
            }
            Kind::Points => {
                let cap = 0.06;
                chart
                    .draw_series(
                        at.iter()
                            .map(|&(g, v)| Circle::new((g as f64 + 0.5, v.median), 6, c.filled())),
                    )
                    .map_err(err)?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| Circle::new((x + 7, y), 6, c.filled()));
                for &(g, v) in &at {
                    let x = g as f64 + 0.5;
                    let bar = [
                        vec![(x, v.min), (x, v.max)],
                        vec![(x - cap, v.min), (x + cap, v.min)],
                        vec![(x - cap, v.max), (x + cap, v.max)],
                    ];
                    chart
                        .draw_series(
                            bar.into_iter()
                                .map(|p| PathElement::new(p, c.stroke_width(2))),
                        )
                        .map_err(err)?;
                }
            }
            Kind::Line => {
                let pts: Vec<(f64, f64)> = at
                    .iter()
                    .map(|&(g, v)| (g as f64 + 0.5, v.median))
                    .collect();
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(3)))
                    .map_err(err)?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 14, y)], c.stroke_width(3))
                    });
                chart
                    .draw_series(pts.iter().map(|&p| Cross::new(p, 5, c.stroke_width(2))))
                    .map_err(err)?;
            }
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .position(match style.legend {
            Legend::UpperLeft => SeriesLabelPosition::UpperLeft,
            Legend::LowerRight => SeriesLabelPosition::LowerRight,
        })
        .draw()
        .map_err(err)?;
    // Group names under the bars (the x axis has no numeric meaning).
    let style = TextStyle::from(("sans-serif", 14).into_font()).pos(
        plotters::style::text_anchor::Pos::new(
            plotters::style::text_anchor::HPos::Center,
            plotters::style::text_anchor::VPos::Top,
        ),
    );
    for (g, name) in fig.groups.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(g as f64 + 0.5, bottom));
        for (line, text) in name.split('\n').enumerate() {
            root.draw_text(text, &style, (px, py + 8 + 17 * line as i32))
                .map_err(err)?;
        }
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Draws `fig` into `stem.png` and `stem.svg`.
///
/// # Errors
/// A file that cannot be written, naming it.
pub fn write(fig: &Figure, stem: &Path) -> Result<()> {
    write_styled(fig, stem, Style::default())
}

/// [`write()`] with a y scale and legend place other than the default.
///
/// # Errors
/// A file that cannot be written, naming it.
pub fn write_styled(fig: &Figure, stem: &Path, style: Style) -> Result<()> {
    register_font();
    let png = stem.with_extension("png");
    {
        let root = BitMapBackend::new(&png, SIZE).into_drawing_area();
        draw(&root, fig, style).map_err(|e| anyhow!("{}: {e}", png.display()))?;
    }
    let svg = stem.with_extension("svg");
    {
        let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
        draw(&root, fig, style).map_err(|e| anyhow!("{}: {e}", svg.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_and_svg_are_written_with_text() {
        let dir = std::env::temp_dir().join(format!("multigrain-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fig = Figure {
            title: "A figure".into(),
            y_label: "run time (s)".into(),
            groups: vec!["4×1\n1 INI".into(), "2×2\n2 INIs".into()],
            series: vec![
                Series {
                    name: "static".into(),
                    kind: Kind::Bar,
                    values: vec![Some(Summary::of(&[1.0, 1.2])), None],
                },
                Series {
                    name: "round-robin".into(),
                    kind: Kind::Points,
                    values: vec![Some(Summary::of(&[0.9])), Some(Summary::of(&[0.5, 0.7]))],
                },
            ],
        };
        write(&fig, &dir.join("fig")).unwrap();
        let png = std::fs::read(dir.join("fig.png")).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let svg = std::fs::read_to_string(dir.join("fig.svg")).unwrap();
        assert!(
            svg.contains("round-robin") && svg.contains("A figure"),
            "{svg}"
        );
        let log = Style {
            log_y: true,
            legend: Legend::LowerRight,
        };
        write_styled(&fig, &dir.join("log"), log).unwrap();
        let svg = std::fs::read_to_string(dir.join("log.svg")).unwrap();
        assert!(svg.contains("static"), "{svg}");
        let (logged, lo, hi) = log_figure(&fig);
        assert!(lo <= 0.5f64.log10() && hi >= 1.2f64.log10(), "{lo}..{hi}");
        let v = logged.series[0].values[0].expect("value");
        assert!((v.median - 1.1f64.log10()).abs() < 1e-12, "{v:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
