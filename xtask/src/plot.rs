//! The PNG of a benchmark run: time against sequence length (or top-k size) per implementation,
//! one panel per case series and pass, log-log.
use crate::report::Run;
use dmattn_bench::cases::{Case, Mask};
use dmattn_bench::results::Pass;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// Where common systems keep a sans-serif TrueType font (plotters draws text with it).
const FONTS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

fn register_font(explicit: Option<&Path>) -> Result<(), String> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => FONTS.iter().map(PathBuf::from).find(|p| p.exists()).ok_or("no TrueType font found for the plot: pass --font FILE.ttf")?,
    };
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    // plotters keeps registered fonts for the process's lifetime.
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(bytes.into_boxed_slice()))
        .map_err(|_| format!("{}: not a usable TrueType font", path.display()))
}

/// Line colours of the implementations in `report::ORDER`, one each.
const COLORS: [RGBColor; crate::report::ORDER.len()] = [
    RGBColor(220, 20, 60),
    RGBColor(34, 139, 34),
    RGBColor(30, 90, 200),
    RGBColor(140, 60, 170),
    RGBColor(240, 140, 0),
    RGBColor(0, 170, 170),
    RGBColor(110, 110, 110),
    RGBColor(160, 110, 60),
    RGBColor(200, 120, 180),
    RGBColor(90, 160, 230),
    RGBColor(0, 0, 0),
];

/// What varies along a series: the top-k size in window groups, else the key length.
fn x_of(c: &Case) -> usize {
    match c.mask {
        Some(Mask::Topk { keep }) if c.group.contains("window") => keep,
        _ => c.seqlen_k,
    }
}

/// Panels: (title, x label, the cases of the series, pass); only series of two or more points.
fn panels(run: &Run) -> Vec<(String, &'static str, Vec<&Case>, Pass)> {
    let mut out = Vec::new();
    for group in run.groups() {
        // A series is one variant (and one head dim, where the group mixes them); decoding
        // apart from prefill where a group has both (`gather`).
        let in_group = || run.set.cases.iter().filter(|c| c.group == group);
        let mixed_dims = in_group().any(|c| c.head_dim != in_group().next().map_or(0, |f| f.head_dim));
        let mixed_decode = in_group().any(|c| c.is_decode()) && in_group().any(|c| !c.is_decode());
        let key = |c: &Case| {
            let decode = if mixed_decode && c.is_decode() { "decode " } else { "" };
            match (group.contains("window"), mixed_dims) {
                (true, _) => String::new(),
                (false, true) => format!("{decode}d{} {}", c.head_dim, c.variant()),
                (false, false) => format!("{decode}{}", c.variant()),
            }
        };
        let mut variants: Vec<String> = Vec::new();
        for c in in_group() {
            if !variants.contains(&key(c)) {
                variants.push(key(c));
            }
        }
        for v in variants {
            let series: Vec<&Case> = in_group().filter(|c| key(c) == v).collect();
            if series.len() < 2 {
                continue;
            }
            let xlabel = if group.contains("window") { "top-k keys kept" } else { "key length" };
            for pass in [Pass::Fwd, Pass::Bwd] {
                if pass == Pass::Fwd || series.iter().any(|c| c.backward) {
                    out.push((format!("{group} {v} {pass:?}"), xlabel, series.clone(), pass));
                }
            }
        }
    }
    out
}

pub fn draw(run: &Run, path: &Path, font: Option<&Path>) -> Result<(), String> {
    register_font(font)?;
    let panels = panels(run);
    let cols = 3usize;
    let rows = panels.len().div_ceil(cols).max(1);
    let root = BitMapBackend::new(path, (600 * cols as u32, 420 * rows as u32 + 60)).into_drawing_area();
    let err = |e: DrawingAreaErrorKind<_>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    let dm = &run.tools[0];
    let (title, body) = root.split_vertically(60);
    title.titled(&format!("dmattn vs peers, bf16, {} ({})", dm.gpu, &dm.date[..10.min(dm.date.len())]), ("sans-serif", 28)).map_err(err)?;
    let impls = run.impls();
    for ((name, xlabel, cases, pass), area) in panels.iter().zip(body.split_evenly((rows, cols))) {
        let points = |imp: &str| -> Vec<(f64, f64)> {
            cases.iter().filter_map(|c| run.ms(&c.id, imp, *pass).map(|ms| (x_of(c) as f64, ms))).collect()
        };
        let all: Vec<(f64, f64)> = impls.iter().flat_map(|i| points(i)).collect();
        if all.is_empty() {
            continue;
        }
        let (x0, x1) = all.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
        let (y0, y1) = all.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
        // At least a decade of time, so that the log axis has labels.
        let (mid, half) = ((y0 * y1).sqrt(), (y1 / y0 * 2.25).max(10.0).sqrt());
        let mut chart = ChartBuilder::on(&area)
            .caption(name, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d((x0 / 1.2..x1 * 1.2).log_scale(), (mid / half..mid * half).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .light_line_style(TRANSPARENT)
            .x_desc(*xlabel)
            .y_desc("ms")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_labels(6)
            .y_label_formatter(&|y| format!("{y:.3}"))
            .draw()
            .map_err(err)?;
        for imp in &impls {
            let pts = points(imp);
            if pts.is_empty() {
                continue;
            }
            let color = crate::report::ORDER.iter().position(|o| o == imp).map_or(BLACK, |i| COLORS[i]).to_rgba();
            let width = if imp == "dmattn" { 3 } else { 1 };
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(width)))
                .map_err(err)?
                .label(imp.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(width)));
            chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)
}
