//! Pictures of plans: an SVG of the arena over the schedule (each value a rectangle from the
//! step that writes it to the step that last reads it, at its byte offset), so buffer reuse
//! and the peak can be seen; the memory limit, if any, is a red line.

use fusegraph::crates::passes::{MemoryPlan, Region};
use std::fmt::Write;

/// Colours cycled through values; adjacent values differ.
const PALETTE: [&str; 8] = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The arena of `plan` over its kernel steps as an SVG document. `limit` (bytes of arena
/// allowed), if given, is drawn as a horizontal line.
pub fn memory_timeline_svg(plan: &MemoryPlan, title: &str, limit: Option<u64>) -> String {
    let (w, h, left, top, bottom) = (900.0, 420.0, 70.0, 40.0, 40.0);
    let steps = plan.intervals.values().flatten().map(|i| i.end + 1).max().unwrap_or(1).max(1) as f64;
    let top_bytes = plan.arena_bytes.max(plan.lower_bound_bytes).max(limit.unwrap_or(0)).max(1) as f64;
    let x = |s: f64| left + s / steps * (w - left - 20.0);
    let y = |b: f64| top + (1.0 - b / top_bytes) * (h - top - bottom);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{left}" y="20" font-size="14">{}: arena {} bytes, lower bound {} bytes, naive {} bytes</text>"#,
        esc(title),
        plan.arena_bytes,
        plan.lower_bound_bytes,
        plan.naive_bytes
    );
    for (k, (node, ivs)) in plan.intervals.iter().enumerate() {
        let Some(loc) = plan.locations.get(node).filter(|l| l.region == Region::Arena) else { continue };
        for iv in ivs {
            let (x0, x1) = (x(iv.start as f64), x((iv.end + 1) as f64));
            let (y0, y1) = (y((loc.offset + loc.size) as f64), y(loc.offset as f64));
            let _ = writeln!(
                svg,
                r#"<rect x="{x0:.1}" y="{y0:.1}" width="{:.1}" height="{:.1}" fill="{}" fill-opacity="0.75" stroke="black" stroke-width="0.3"><title>{node}: {} bytes at offset {}, steps {}..={}</title></rect>"#,
                (x1 - x0).max(0.5),
                (y1 - y0).max(0.5),
                PALETTE[k % PALETTE.len()],
                loc.size,
                loc.offset,
                iv.start,
                iv.end
            );
        }
    }
    let axis_y = y(0.0);
    let _ = writeln!(svg, r#"<line x1="{left}" y1="{axis_y}" x2="{}" y2="{axis_y}" stroke="black"/>"#, w - 20.0);
    let _ = writeln!(svg, r#"<line x1="{left}" y1="{top}" x2="{left}" y2="{axis_y}" stroke="black"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">kernel step (0..{})</text>"#,
        (left + w) / 2.0,
        h - 10.0,
        steps as u64
    );
    let _ = writeln!(svg, r#"<text x="5" y="{top}">{} B</text>"#, top_bytes as u64);
    let _ = writeln!(svg, r#"<text x="5" y="{axis_y}">0</text>"#);
    for (label, bytes, colour) in [("arena", Some(plan.arena_bytes), "black"), ("limit", limit, "red")] {
        if let Some(b) = bytes {
            let yy = y(b as f64);
            let _ = writeln!(
                svg,
                r#"<line x1="{left}" y1="{yy:.1}" x2="{}" y2="{yy:.1}" stroke="{colour}" stroke-dasharray="6,3"/>"#,
                w - 20.0
            );
            let _ = writeln!(
                svg,
                r#"<text x="{}" y="{:.1}" fill="{colour}" text-anchor="end">{label}</text>"#,
                w - 22.0,
                yy - 3.0
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}
