//! Plots of a `memfs bench all` results folder, drawn from `results.json`'s
//! figures alone (so a folder can be re-plotted without re-measuring). Every
//! plot is written as SVG and PNG.

use std::path::Path;

use anyhow::Context;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::results::{Results, RunFigure};

/// (label, colour index, emphasis 0 = subject, 1.. = baselines, points)
type Series = (String, usize, usize, Vec<(f64, f64)>);

/// Lines on log-log axes.
struct LineChart {
    title: String,
    x_desc: String,
    y_desc: String,
    series: Vec<Series>,
}

/// Grouped vertical bars.
struct BarChart {
    title: String,
    y_desc: String,
    categories: Vec<String>,
    /// (label, one value per category)
    groups: Vec<(String, Vec<Option<f64>>)>,
}

/// A grid of cells coloured by log value.
pub struct HeatMap {
    pub title: String,
    /// (column = waiters, row = entities, value)
    pub cells: Vec<(u32, u32, f64)>,
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plot: {e:?}")
}

fn draw_lines<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, c: &LineChart) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let Some(((x0, x1), (y0, y1))) = log_ranges(c) else {
        return Ok(());
    };
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&c.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(100)
        .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(c.x_desc.as_str())
        .y_desc(c.y_desc.as_str())
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| crate::common::fmt_num(*y))
        .draw()
        .map_err(err)?;
    for (label, color, emphasis, points) in &c.series {
        let col = PALETTE[color % PALETTE.len()];
        let style = match emphasis {
            0 => col.stroke_width(3),
            1 => col.mix(0.6).stroke_width(1),
            _ => col.mix(0.35).stroke_width(1),
        };
        let mut pts = points.clone();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(pts.clone(), style))
            .map_err(err)?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        match emphasis {
            0 => chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 4, col.filled())))
                .map(|_| ()),
            1 => chart
                .draw_series(pts.iter().map(|&p| TriangleMarker::new(p, 5, col.mix(0.6))))
                .map(|_| ()),
            _ => chart
                .draw_series(pts.iter().map(|&p| Cross::new(p, 4, col.mix(0.5))))
                .map(|_| ()),
        }
        .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// The axes' ranges of a line chart, with margins (none without points).
fn log_ranges(c: &LineChart) -> Option<((f64, f64), (f64, f64))> {
    let pts = c.series.iter().flat_map(|s| s.3.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return None;
    }
    let (x0, x1) = (x0.max(1e-9) * 0.8, x1.max(x0 * 2.0) * 1.25);
    // Headroom above the curves for the legend.
    let (y0, y1) = (y0.max(1e-9) / 2.0, y1.max(y0 * 2.0) * 30.0);
    Some(((x0, x1), (y0, y1)))
}

fn draw_bars<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, c: &BarChart) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let n = c.categories.len();
    let ymax = c
        .groups
        .iter()
        .flat_map(|(_, v)| v.iter().flatten())
        .fold(0.0f64, |a, &b| a.max(b));
    if n == 0 || ymax <= 0.0 {
        return Ok(());
    }
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&c.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(20)
        .y_label_area_size(100)
        .build_cartesian_2d(0f64..n as f64, 0f64..ymax * 1.3)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .disable_x_axis()
        .y_desc(c.y_desc.as_str())
        .y_label_formatter(&|y| crate::common::fmt_num(*y))
        .draw()
        .map_err(err)?;
    for (gi, (label, values)) in c.groups.iter().enumerate() {
        let col = PALETTE[gi % PALETTE.len()];
        chart
            .draw_series(values.iter().enumerate().filter_map(|(ci, v)| {
                let v = (*v)?;
                let (x0, x1) = bar_slot(c, ci, gi);
                Some(Rectangle::new([(x0, 0.0), (x1, v)], col.filled()))
            }))
            .map_err(err)?
            .label(label.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], col.filled()));
    }
    // Category names above each group (long names would not fit below).
    for (ci, name) in c.categories.iter().enumerate() {
        let top = c
            .groups
            .iter()
            .filter_map(|(_, v)| v.get(ci).copied().flatten())
            .fold(0.0f64, f64::max);
        chart
            .draw_series(std::iter::once(Text::new(
                name.clone(),
                (ci as f64 + 0.05, top + ymax * 0.06),
                ("sans-serif", 12).into_font().color(&BLACK),
            )))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Where group `gi`'s bar of category `ci` stands (left and right x).
/// Each category's bars side by side, centred: only the groups that have
/// a value there take room.
fn bar_slot(c: &BarChart, ci: usize, gi: usize) -> (f64, f64) {
    let present: Vec<usize> = (0..c.groups.len())
        .filter(|&k| c.groups[k].1.get(ci).copied().flatten().is_some())
        .collect();
    let n = present.len().max(1);
    let width = 0.8 / n.max(2) as f64;
    let k = present.iter().position(|&p| p == gi).unwrap_or(0);
    let x = ci as f64 + 0.5 - width * n as f64 / 2.0 + k as f64 * width;
    (x, x + width * 0.95)
}

pub fn draw_heat<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    h: &HeatMap,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let max_w = h.cells.iter().map(|c| c.0).max().unwrap_or(1) as i32;
    let max_e = h.cells.iter().map(|c| c.1).max().unwrap_or(1) as i32;
    let ln = |v: f64| v.max(1.0).ln();
    let lo = h
        .cells
        .iter()
        .map(|c| ln(c.2))
        .fold(f64::INFINITY, f64::min);
    let hi = h
        .cells
        .iter()
        .map(|c| ln(c.2))
        .fold(f64::NEG_INFINITY, f64::max);
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&h.title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(1i32..max_w + 1, 1i32..max_e + 1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("waiters (processes)")
        .y_desc("entities per lock")
        .x_labels(max_w as usize)
        .y_labels(max_e as usize)
        .draw()
        .map_err(err)?;
    // The same colour scale as `memfs bench lock --matrix`: log ops/s, blue
    // (slowest cell) to red (fastest).
    chart
        .draw_series(h.cells.iter().map(|&(w, e, v)| {
            let t = if hi > lo {
                (ln(v) - lo) / (hi - lo)
            } else {
                1.0
            };
            let c = HSLColor((1.0 - t) * 0.7, 0.85, 0.5);
            let (x, y) = (w as i32, e as i32);
            Rectangle::new([(x, y), (x + 1, y + 1)], c.filled())
        }))
        .map_err(err)?;
    chart
        .draw_series(h.cells.iter().map(|&(w, e, v)| {
            Text::new(
                crate::common::human(v),
                (w as i32, e as i32 + 1),
                ("sans-serif", 13).into_font().color(&BLACK),
            )
        }))
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Draws with `$f` into `$dir/$stem.svg` and `.png`; pushes `$stem`.
macro_rules! both {
    ($dir:expr, $out:expr, $stem:expr, $size:expr, $f:ident, $data:expr) => {{
        let stem: String = $stem;
        let svg = $dir.join(format!("{stem}.svg"));
        let png = $dir.join(format!("{stem}.png"));
        $f(SVGBackend::new(&svg, $size).into_drawing_area(), $data)
            .with_context(|| format!("drawing {}", svg.display()))?;
        $f(BitMapBackend::new(&png, $size).into_drawing_area(), $data)
            .with_context(|| format!("drawing {}", png.display()))?;
        $out.push(format!("plots/{stem}"));
    }};
}

fn of_kind<'a>(r: &'a Results, kind: &'a str) -> impl Iterator<Item = &'a RunFigure> {
    r.figures.iter().filter(move |f| f.kind == kind)
}

/// `metadata.t4.shared.create` -> (4, true, "create").
fn parse_metadata(name: &str) -> Option<(u32, bool, &str)> {
    let rest = name.strip_prefix("metadata.t")?;
    let mut parts = rest.split('.');
    let threads = parts.next()?.parse().ok()?;
    let mut shared = false;
    let mut phase = None;
    for p in parts {
        match p {
            "shared" => shared = true,
            "sync" => return None,
            other => phase = Some(other),
        }
    }
    Some((threads, shared, phase?))
}

/// `workload.engine.n1000.t4.create` -> ("engine", 1000, 4, "create").
fn parse_workload(name: &str) -> Option<(&str, usize, u32, &str)> {
    let mut p = name.strip_prefix("workload.")?.split('.');
    let kind = p.next()?;
    let ops = p.next()?.strip_prefix('n')?.parse().ok()?;
    let threads = p.next()?.strip_prefix('t')?.parse().ok()?;
    let phase = p.next()?;
    p.next().is_none().then_some((kind, ops, threads, phase))
}

/// `lock.memfs.byte_ranges.e2.w3` -> ("memfs", "byte_ranges", 2, 3).
fn parse_lock(name: &str) -> Option<(&str, &str, u32, u32)> {
    let mut p = name.strip_prefix("lock.")?.split('.');
    let fs = p.next()?;
    let alg = p.next()?;
    let e = p.next()?.strip_prefix('e')?.parse().ok()?;
    let w = p.next()?.strip_prefix('w')?.parse().ok()?;
    p.next().is_none().then_some((fs, alg, e, w))
}

fn metadata_chart(r: &Results, shared: bool) -> Option<LineChart> {
    const PHASES: [&str; 4] = ["create", "open", "stat", "unlink"];
    let mut series: Vec<Series> = Vec::new();
    let mut add = |label: String, color: usize, emph: usize, pt: (f64, f64)| match series
        .iter_mut()
        .find(|s| s.0 == label)
    {
        Some(s) => {
            if !s.3.iter().any(|p| p.0 == pt.0) {
                s.3.push(pt);
            }
        }
        None => series.push((label, color, emph, vec![pt])),
    };
    for f in of_kind(r, "metadata") {
        let Some((t, sh, phase)) = parse_metadata(&f.figure.figure) else {
            continue;
        };
        let Some(pi) = PHASES.iter().position(|p| *p == phase) else {
            continue;
        };
        if sh != shared {
            continue;
        }
        add(format!("memfs {phase}"), pi, 0, (t as f64, f.figure.value));
        if let (Some(b), Some(name)) = (f.figure.baseline, f.figure.baseline_name.as_deref()) {
            let (fs, emph) = if name.contains("disk") {
                ("disk", 2)
            } else {
                ("tmpfs", 1)
            };
            add(format!("{fs} {phase}"), pi, emph, (t as f64, b));
        }
    }
    (!series.is_empty()).then(|| LineChart {
        title: format!(
            "metadata: ops/s against threads ({})",
            if shared {
                "one shared directory"
            } else {
                "a directory per thread"
            }
        ),
        x_desc: "threads (log)".into(),
        y_desc: "operations per second (log)".into(),
        series,
    })
}

fn workload_chart(r: &Results, kind: &str) -> Option<LineChart> {
    const PHASES: [&str; 4] = ["create", "write", "read", "delete"];
    let figs: Vec<(usize, u32, usize, &RunFigure)> = of_kind(r, "workload")
        .filter_map(|f| {
            let (k, ops, t, phase) = parse_workload(&f.figure.figure)?;
            let pi = PHASES.iter().position(|p| *p == phase)?;
            (k == kind).then_some((ops, t, pi, f))
        })
        .collect();
    let ops = figs.iter().map(|f| f.0).max()?;
    let mut series: Vec<Series> = Vec::new();
    let subject = if kind == "engine" {
        "memfs engine"
    } else {
        "memfs mount"
    };
    for (pi, phase) in PHASES.iter().enumerate() {
        let rows: Vec<&(usize, u32, usize, &RunFigure)> =
            figs.iter().filter(|f| f.0 == ops && f.2 == pi).collect();
        series.push((
            format!("{subject} {phase}"),
            pi,
            0,
            rows.iter()
                .map(|f| (f.1 as f64, f.3.figure.value))
                .collect(),
        ));
        let base: Vec<(f64, f64)> = rows
            .iter()
            .filter_map(|f| Some((f.1 as f64, f.3.figure.baseline?)))
            .collect();
        if !base.is_empty() {
            series.push((format!("tmpfs {phase}"), pi, 1, base));
        }
    }
    Some(LineChart {
        title: format!("workload ({subject}): time per phase, {ops} operations"),
        x_desc: "threads (log)".into(),
        y_desc: "time per phase, ms (log)".into(),
        series,
    })
}

fn fio_chart(r: &Results) -> Option<BarChart> {
    let figs: Vec<&RunFigure> = of_kind(r, "fio")
        .filter(|f| f.figure.unit == "MiB/s")
        .collect();
    if figs.is_empty() {
        return None;
    }
    let base = figs
        .iter()
        .find_map(|f| f.figure.baseline_name.clone())
        .unwrap_or_else(|| "baseline".into());
    Some(BarChart {
        title: "fio randrw bandwidth (MiB/s)".into(),
        y_desc: "MiB/s".into(),
        categories: figs
            .iter()
            .map(|f| f.figure.figure.trim_start_matches("fio.").to_string())
            .collect(),
        groups: vec![
            (
                "memfs".into(),
                figs.iter().map(|f| Some(f.figure.value)).collect(),
            ),
            (base, figs.iter().map(|f| f.figure.baseline).collect()),
        ],
    })
}

fn block_chart(r: &Results) -> Option<BarChart> {
    let figs: Vec<&RunFigure> = of_kind(r, "block")
        .filter(|f| f.figure.figure.ends_with(".ops_per_sec"))
        .collect();
    if figs.is_empty() {
        return None;
    }
    let name = |f: &RunFigure| {
        f.figure
            .figure
            .trim_start_matches("block.")
            .trim_end_matches(".ops_per_sec")
            .replace('_', " ")
    };
    let is_lmdb = |f: &RunFigure| f.figure.figure.starts_with("block.lmdb");
    Some(BarChart {
        title: "block store: ops/s per scenario (memfs modes and LMDB)".into(),
        y_desc: "operations per second".into(),
        categories: figs.iter().map(|f| name(f)).collect(),
        groups: vec![
            (
                "memfs".into(),
                figs.iter()
                    .map(|f| (!is_lmdb(f)).then_some(f.figure.value))
                    .collect(),
            ),
            (
                "LMDB".into(),
                figs.iter()
                    .map(|f| is_lmdb(f).then_some(f.figure.value))
                    .collect(),
            ),
        ],
    })
}

fn lock_maps(r: &Results) -> Vec<(String, HeatMap)> {
    let mut maps: Vec<(String, HeatMap)> = Vec::new();
    for f in of_kind(r, "lock") {
        let Some((fs, alg, e, w)) = parse_lock(&f.figure.figure) else {
            continue;
        };
        let stem = format!("lock-{alg}-{fs}");
        let cell = (w, e, f.figure.value);
        match maps.iter_mut().find(|m| m.0 == stem) {
            Some(m) => m.1.cells.push(cell),
            None => maps.push((
                stem,
                HeatMap {
                    title: format!("{alg} on {fs}: ops/s (log colour)"),
                    cells: vec![cell],
                },
            )),
        }
    }
    maps
}

/// Writes every plot into `dir`; returns their stems relative to the
/// results folder (`plots/<name>`).
pub fn plot_all(r: &Results, dir: &Path) -> anyhow::Result<Vec<String>> {
    crate::common::register_plot_font()?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut out = Vec::new();
    for shared in [false, true] {
        if let Some(c) = metadata_chart(r, shared) {
            let stem = if shared {
                "metadata-shared"
            } else {
                "metadata"
            };
            both!(dir, out, stem.into(), (960, 600), draw_lines, &c);
        }
    }
    if let Some(c) = fio_chart(r) {
        both!(dir, out, "fio".into(), (960, 520), draw_bars, &c);
    }
    for kind in ["engine", "files"] {
        if let Some(c) = workload_chart(r, kind) {
            both!(
                dir,
                out,
                format!("workload-{kind}"),
                (960, 600),
                draw_lines,
                &c
            );
        }
    }
    if let Some(c) = block_chart(r) {
        both!(dir, out, "block".into(), (1100, 520), draw_bars, &c);
    }
    for (stem, m) in lock_maps(r) {
        both!(dir, out, stem, (600, 540), draw_heat, &m);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_figure_names() {
        assert_eq!(
            parse_metadata("metadata.t4.shared.create"),
            Some((4, true, "create"))
        );
        assert_eq!(parse_metadata("metadata.t1.stat"), Some((1, false, "stat")));
        assert_eq!(parse_metadata("metadata.t1.sync.stat"), None);
        assert_eq!(
            parse_workload("workload.engine.n1000.t4.read"),
            Some(("engine", 1000, 4, "read"))
        );
        assert_eq!(
            parse_workload("workload.engine.files10000.rss_growth"),
            None
        );
        assert_eq!(
            parse_lock("lock.memfs.byte_ranges.e2.w3"),
            Some(("memfs", "byte_ranges", 2, 3))
        );
        assert_eq!(parse_lock("lock.tmpfs.flock.w3"), None);
    }
}
