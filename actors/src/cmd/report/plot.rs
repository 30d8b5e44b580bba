//! Drawing a [`Chart`] as a PNG: plotters' bitmap backend into an RGB buffer, then [`super::png`].
//!
//! Text is drawn with a font embedded in the binary (`assets/fonts/DejaVuSansMono-ascii.ttf`, the
//! printable ASCII subset of DejaVu Sans Mono, 8 KB; its licence is beside it) through plotters'
//! `ab_glyph` feature, so a report looks the same on every machine and needs no system fonts.
//! Labels are therefore ASCII only.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use super::series::Chart;
use super::ReportError;

/// Width of every plot, in pixels.
pub const WIDTH: u32 = 960;
/// Height of every plot, in pixels.
pub const HEIGHT: u32 = 540;
/// The font family plotters looks text up by; the embedded font is registered under it.
const FONT: &str = "sans-serif";
/// The embedded font (see the module docs).
static FONT_BYTES: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSansMono-ascii.ttf");
/// Distinct line colours; a chart with more lines reuses them.
pub const LINE_COLOURS: usize = 8;
/// Line colours (Tableau 10), distinguishable for the common forms of colour blindness.
const PALETTE: [RGBColor; LINE_COLOURS] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];
/// The colour of a chart's `i`-th line, as RGB bytes (a comparison gives run `i` this colour in
/// every plot; tests find the lines drawn by it). The palette repeats after [`LINE_COLOURS`].
pub fn line_colour(i: usize) -> [u8; 3] {
    let RGBColor(r, g, b) = PALETTE[i % PALETTE.len()];
    [r, g, b]
}

/// Share of the y range added on top of a chart with several lines, where the legend sits, so
/// it rarely covers data.
const LEGEND_HEADROOM: f64 = 0.3;

/// Registers the embedded font with plotters once per process.
fn font_ready() -> Result<(), String> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| register_font(FONT, FontStyle::Normal, FONT_BYTES).is_ok());
    if ok {
        Ok(())
    } else {
        Err("the embedded font does not parse".into())
    }
}

/// Draws `chart` and writes it to `path` as an 8-bit RGB PNG of [`WIDTH`] x [`HEIGHT`].
pub fn draw_png(path: &Path, chart: &Chart) -> Result<(), ReportError> {
    let rgb = render(chart).map_err(|message| ReportError::Draw {
        path: path.to_path_buf(),
        message,
    })?;
    let write_err = |e: std::io::Error| ReportError::Write {
        path: path.to_path_buf(),
        source: e,
    };
    let bytes = super::png::encode_rgb(WIDTH, HEIGHT, &rgb)
        .map_err(|e| write_err(std::io::Error::other(e)))?;
    std::fs::write(path, bytes).map_err(write_err)
}

/// The chart as RGB bytes, row-major, [`WIDTH`] x [`HEIGHT`].
pub fn render(chart: &Chart) -> Result<Vec<u8>, String> {
    font_ready()?;
    let s = |e: &dyn std::fmt::Display| e.to_string();
    let mut buf = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| s(&e))?;
        let (x0, x1) = x_range(&chart.steps);
        let (y0, y1) = y_range(chart);
        let mut c = ChartBuilder::on(&root)
            .caption(chart.title, (FONT, 24))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| s(&e))?;
        c.configure_mesh()
            .x_desc("learner step")
            .y_desc(chart.y_label)
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .light_line_style(RGBColor(238, 238, 238))
            .draw()
            .map_err(|e| s(&e))?;

        for (i, line) in chart.lines.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            if let Some(spread) = &line.spread {
                let band: Vec<Option<(f64, f64)>> = line
                    .series
                    .values
                    .iter()
                    .zip(&spread.values)
                    .map(|(v, d)| Some((v.as_ref()? - d.as_ref()?, v.as_ref()? + d.as_ref()?)))
                    .collect();
                for seg in segments(&chart.steps, &band) {
                    let mut outline: Vec<(u64, f64)> =
                        seg.iter().map(|(x, (_, hi))| (*x, *hi)).collect();
                    outline.extend(seg.iter().rev().map(|(x, (lo, _))| (*x, *lo)));
                    c.draw_series(std::iter::once(Polygon::new(
                        outline,
                        color.mix(0.18).filled(),
                    )))
                    .map_err(|e| s(&e))?;
                }
            }
            let mut labelled = false;
            for seg in segments(&chart.steps, &line.series.values) {
                let drawn = c
                    .draw_series(LineSeries::new(seg, color.stroke_width(2)).point_size(2))
                    .map_err(|e| s(&e))?;
                if !labelled {
                    drawn
                        .label(line.series.label.as_str())
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2))
                        });
                    labelled = true;
                }
            }
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()
            .map_err(|e| s(&e))?;
        root.present().map_err(|e| s(&e))?;
    }
    Ok(buf)
}

/// Runs of consecutive recorded values: a line is broken where a step did not record one.
fn segments<T: Copy>(steps: &[u64], values: &[Option<T>]) -> Vec<Vec<(u64, T)>> {
    let mut out: Vec<Vec<(u64, T)>> = Vec::new();
    let mut open = false;
    for (x, v) in steps.iter().zip(values) {
        match v {
            Some(v) if open => out.last_mut().expect("open segment").push((*x, *v)),
            Some(v) => {
                out.push(vec![(*x, *v)]);
                open = true;
            }
            None => open = false,
        }
    }
    out
}

/// The x axis: first to last step (one step wide at least).
fn x_range(steps: &[u64]) -> (u64, u64) {
    let lo = steps.iter().copied().min().unwrap_or(0);
    let hi = steps.iter().copied().max().unwrap_or(0);
    (lo, hi.max(lo + 1))
}

/// The y axis: every value and band edge, `[0, y_at_least]`, 5% margin, legend headroom.
fn y_range(chart: &Chart) -> (f64, f64) {
    let (mut lo, mut hi) = (0.0f64, chart.y_at_least);
    for line in &chart.lines {
        let spread = line.spread.as_ref();
        for (i, v) in line.series.values.iter().enumerate() {
            let Some(v) = v.filter(|v| v.is_finite()) else {
                continue;
            };
            let d = spread
                .and_then(|s| s.values[i])
                .filter(|d| d.is_finite())
                .unwrap_or(0.0)
                .abs();
            lo = lo.min(v - d);
            hi = hi.max(v + d);
        }
    }
    if hi - lo < 1e-9 {
        hi = lo + 1.0;
    }
    let span = hi - lo;
    let headroom = if chart.lines.len() > 1 {
        LEGEND_HEADROOM
    } else {
        0.1
    };
    (
        if lo < 0.0 { lo - 0.05 * span } else { lo },
        hi + (0.05 + headroom) * span,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_break_where_a_step_recorded_nothing() {
        let steps = [1, 2, 3, 4, 5, 6];
        let values = [Some(1.0), Some(2.0), None, Some(4.0), None, Some(6.0)];
        assert_eq!(
            segments(&steps, &values),
            vec![vec![(1, 1.0), (2, 2.0)], vec![(4, 4.0)], vec![(6, 6.0)]]
        );
        assert!(segments::<f64>(&steps, &[None; 6]).is_empty());
    }

    #[test]
    fn a_single_step_still_gets_a_nonempty_x_axis() {
        assert_eq!(x_range(&[7]), (7, 8));
        assert_eq!(x_range(&[3, 9]), (3, 9));
    }
}
