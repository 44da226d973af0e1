//! Pictures of a profile (feature `plots`): how hot each layer's neurons are, and the hit rate
//! a neuron cache of each size gets. SVG, drawn with plotters (no system libraries).

use crate::{Profile, SparseError};
use plotters::prelude::*;
use std::path::Path;

/// Activation frequency of each layer's neurons, sorted hottest first: one line per layer.
pub fn hotness_svg(p: &Profile, path: &Path) -> Result<(), SparseError> {
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let n = p.model.n_ff;
    let mut chart = frame(
        &root,
        format!(
            "Neuron hotness per layer ({}; active = top {:.0}% of scores)",
            p.model.file_name,
            (1.0 - p.reference_sparsity) * 100.0
        ),
        "neurons, hottest first (% of the layer)",
        "fraction of tokens active",
    )?;
    let layers = p.layers.len().max(2);
    for (li, l) in p.layers.iter().enumerate() {
        let mut f = l.frequency.clone();
        f.sort_by(|a, b| b.total_cmp(a));
        let color = HSLColor(0.7 * li as f64 / (layers - 1) as f64, 0.8, 0.45);
        chart
            .draw_series(LineSeries::new(
                f.iter()
                    .enumerate()
                    .map(|(i, &v)| (i as f32 * 100.0 / n as f32, v)),
                color,
            ))
            .map_err(plot_err)?
            .label(format!("layer {li}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

/// Mean hit rate over layers against cache size, for the three cache layouts.
pub fn hit_rate_svg(p: &Profile, path: &Path) -> Result<(), SparseError> {
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let curve = p.mean_hit_rate();
    let mut chart = frame(
        &root,
        format!(
            "Neuron cache hit rate vs size ({}, {} calibration tokens)",
            p.model.file_name, p.calibration.tokens
        ),
        "cache size (% of each layer's neurons)",
        "hit rate (mean over layers)",
    )?;
    type Pick = fn(&crate::HitPoint) -> f32;
    let series: [(&str, RGBColor, Pick); 3] = [
        ("LRU", RED, |h| h.lru),
        ("pinned hottest", BLUE, |h| h.pinned),
        ("pinned + LRU (best split)", GREEN, |h| h.best),
    ];
    for (name, color, pick) in series {
        chart
            .draw_series(LineSeries::new(
                curve.iter().map(|h| (h.cache_fraction * 100.0, pick(h))),
                color.stroke_width(2),
            ))
            .map_err(plot_err)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}

type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf32, plotters::coord::types::RangedCoordf32>,
>;

/// A percent-by-fraction chart (x 0..100, y 0..1) with a caption and axis names.
fn frame<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    caption: String,
    x_desc: &str,
    y_desc: &str,
) -> Result<Chart<'a, 'b>, SparseError> {
    let mut chart = ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f32..100f32, 0f32..1f32)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(plot_err)?;
    Ok(chart)
}

fn plot_err<E: std::fmt::Debug>(e: E) -> SparseError {
    SparseError::Picture(format!("{e:?}"))
}
