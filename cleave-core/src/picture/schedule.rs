//! The picture of a schedule: each kernel of a launch as its grid loop with the sequential
//! loops nested inside, every statement in place, and the tensors sorted by where they live
//! (global memory, shared memory, registers), each name coloured by its level wherever it
//! appears.

use std::collections::BTreeMap;

use super::svg::{text_width, Svg, LINE_H};
use crate::graph::DimTable;
use crate::plan::{Binding, BufKind, Kernel, Launch, Param, ShowKernel, TileKernel};

const MARGIN: f64 = 16.0;
const PAD: f64 = 10.0;
const INDENT: f64 = 18.0;
/// Space between the memory column and the program.
const COLUMN_GAP: f64 = 24.0;
const KERNEL_GAP: f64 = 22.0;

/// Where a named tensor lives; the names double as the SVG classes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Level {
    Gmem,
    Smem,
    Reg,
}

impl Level {
    fn class(self) -> &'static str {
        match self {
            Level::Gmem => "gmem",
            Level::Smem => "smem",
            Level::Reg => "reg",
        }
    }

    fn heading(self) -> &'static str {
        match self {
            Level::Gmem => "global memory",
            Level::Smem => "shared memory",
            Level::Reg => "registers",
        }
    }
}

/// One kernel, ready to draw.
struct Panel {
    header: String,
    /// (level, name, description) in level order.
    tensors: Vec<(Level, String, String)>,
    /// (depth from 0, text) of each program line.
    lines: Vec<(usize, String)>,
    names: BTreeMap<String, Level>,
}

/// Draws every kernel of `launch`, in launch order; `title` heads the picture.
pub fn schedule_svg(launch: &Launch, title: &str) -> String {
    let dims = launch.dims();
    let panels: Vec<Panel> = launch.kernels.iter().map(|k| panel(k, dims)).collect();

    let mem_w = panels
        .iter()
        .flat_map(|p| p.tensors.iter().map(|(_, n, d)| text_width(&format!("{n}  {d}"))))
        .chain([text_width(Level::Gmem.heading())])
        .fold(0.0, f64::max)
        + 2.0 * PAD;
    let prog_w =
        panels.iter().flat_map(|p| p.lines.iter().map(|(d, l)| *d as f64 * INDENT + text_width(l))).fold(0.0, f64::max)
            + 3.0 * PAD;
    let header_w = panels.iter().map(|p| text_width(&p.header)).fold(text_width(title), f64::max) + 2.0 * PAD;
    let inner_w = (mem_w + COLUMN_GAP + prog_w).max(header_w);

    let mut svg = Svg::new();
    svg.text(MARGIN, MARGIN + 0.8 * LINE_H, "title", false, title);
    let legend = [
        ("", "names coloured by where they live: "),
        (Level::Gmem.class(), Level::Gmem.heading()),
        ("", ", "),
        (Level::Smem.class(), Level::Smem.heading()),
        ("", ", "),
        (Level::Reg.class(), Level::Reg.heading()),
    ];
    svg.spans(MARGIN, MARGIN + 1.8 * LINE_H, "note", false, &legend);
    let mut y = MARGIN + 2.0 * LINE_H + 12.0;
    for (i, p) in panels.iter().enumerate() {
        // Each level has a heading, and a blank line separates levels.
        let mem_rows = p.tensors.len() + (2 * levels_present(p)).saturating_sub(1);
        let body_rows = p.lines.len().max(mem_rows);
        let h = (2 + body_rows) as f64 * LINE_H + 2.0 * PAD;
        svg.open("kernel", &[("data-kernel", &i.to_string())]);
        svg.rect(MARGIN, y, inner_w, h, "kernel", true);
        svg.text(MARGIN + PAD, y + PAD + 0.8 * LINE_H, "", false, &p.header);
        let top = y + PAD + 1.5 * LINE_H;

        // The memory column.
        let mut row = 0usize;
        let mut last = None;
        for (level, name, desc) in &p.tensors {
            if last != Some(*level) {
                if last.is_some() {
                    row += 1;
                }
                let ty = top + (row as f64 + 0.8) * LINE_H;
                svg.text(MARGIN + PAD, ty, "note", false, level.heading());
                row += 1;
                last = Some(*level);
            }
            let ty = top + (row as f64 + 0.8) * LINE_H;
            svg.open("tensor", &[("data-level", level.class()), ("data-name", name)]);
            svg.spans(MARGIN + PAD, ty, "", false, &[(level.class(), name), ("", &format!("  {desc}"))]);
            svg.close();
            row += 1;
        }

        // The program: loop boxes first, so that the text is drawn over them.
        let px = MARGIN + mem_w + COLUMN_GAP;
        svg.rect(px - PAD, top, prog_w + PAD, (p.lines.len() as f64 + 0.5) * LINE_H, "program", true);
        for (li, (depth, _)) in p.lines.iter().enumerate() {
            if !p.lines[li].1.starts_with("for ") {
                continue;
            }
            let end = p.lines[li + 1..].iter().take_while(|(d, _)| d > depth).count() + li;
            let x0 = px + *depth as f64 * INDENT - PAD / 2.0;
            let y0 = top + li as f64 * LINE_H + 2.0;
            let y1 = top + (end + 1) as f64 * LINE_H + 4.0;
            svg.rect(x0, y0, prog_w - (x0 - px) - PAD / 2.0, y1 - y0, "loop", true);
        }
        for (li, (depth, line)) in p.lines.iter().enumerate() {
            let ty = top + (li as f64 + 0.8) * LINE_H + 2.0;
            let spans = coloured(line, &p.names);
            let refs: Vec<(&str, &str)> = spans.iter().map(|(c, t)| (*c, t.as_str())).collect();
            svg.spans(px + *depth as f64 * INDENT, ty, "stmt", false, &refs);
        }
        svg.close();
        y += h + KERNEL_GAP;
    }
    svg.finish(inner_w + 2.0 * MARGIN, y - KERNEL_GAP + MARGIN)
}

fn levels_present(p: &Panel) -> usize {
    [Level::Gmem, Level::Smem, Level::Reg].iter().filter(|l| p.tensors.iter().any(|t| t.0 == **l)).count()
}

fn panel(k: &Kernel, dims: &DimTable) -> Panel {
    let mut tensors: Vec<(Level, String, String)> =
        k.params().iter().map(|p| (Level::Gmem, p.name.clone(), param_text(p, dims))).collect();
    let (header, lines) = match k {
        Kernel::Tile(t) => {
            let show = ShowKernel { kernel: t, dims };
            tensors.extend(buffers(t));
            (format!("{}: {}", t.symbol, show.header()), show.lines().into_iter().map(|(d, l)| (d - 1, l)).collect())
        }
        Kernel::Stage(s) => {
            let text = s.show(dims);
            let (stmt, note) = text.split_once("  # ").unwrap_or((text.as_str(), ""));
            tensors.push((Level::Reg, "one value per thread".into(), "the output element it computes".into()));
            (format!("{}: parfor every output element  # {note}", s.symbol), vec![(0, stmt.to_string())])
        }
    };
    let names = tensors.iter().filter(|t| !t.1.contains(' ')).map(|(l, n, _)| (n.clone(), *l)).collect();
    Panel { header, tensors, lines, names }
}

fn param_text(p: &Param, dims: &DimTable) -> String {
    let shape: Vec<String> = p.shape.iter().map(|d| d.map_or("1".to_string(), |v| dims.get(v).name.clone())).collect();
    let role = match p.binding {
        Binding::Input(_) => "input",
        Binding::Output(_) => "output",
        Binding::Workspace(w) if p.output => {
            return format!("{}[{}] workspace {w}, written", p.dtype, shape.join(", "))
        }
        Binding::Workspace(w) => return format!("{}[{}] workspace {w}, read", p.dtype, shape.join(", ")),
    };
    format!("{}[{}] {role}", p.dtype, shape.join(", "))
}

fn buffers(t: &TileKernel) -> Vec<(Level, String, String)> {
    let mut smem = Vec::new();
    let mut regs = Vec::new();
    for b in &t.bufs {
        match b.kind {
            BufKind::Smem { dtype, rows, cols } => {
                let stages = if b.stages > 1 { format!(" x{} stages", b.stages) } else { String::new() };
                let bytes = b.smem_stage_bytes() * u64::from(b.stages);
                smem.push((Level::Smem, b.name.clone(), format!("{dtype}[{rows}, {cols}]{stages}, {bytes} B")));
            }
            BufKind::Frag { cols, whole: false } => {
                regs.push((Level::Reg, b.name.clone(), format!("f32[{}, {cols}] tile", t.rows)))
            }
            BufKind::Frag { cols, whole: true } => {
                regs.push((Level::Reg, b.name.clone(), format!("f32[{}, {cols}] per warp", t.rows)))
            }
            BufKind::Rows => regs.push((Level::Reg, b.name.clone(), format!("f32[{}] per row", t.rows))),
        }
    }
    smem.extend(regs);
    smem
}

/// Splits a program line into spans, giving each known tensor name its level's class. A
/// global tensor is recognised only where it is indexed (`q[...]`), so a dim that shares its
/// name stays plain.
fn coloured(line: &str, names: &BTreeMap<String, Level>) -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, String)> = Vec::new();
    let mut plain = String::new();
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_alphanumeric() || chars[i] == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let indexed = chars.get(i) == Some(&'[');
            match names.get(&word) {
                Some(level) if (*level == Level::Gmem) == indexed => {
                    if !plain.is_empty() {
                        out.push(("", std::mem::take(&mut plain)));
                    }
                    out.push((level.class(), word));
                }
                _ => plain.push_str(&word),
            }
        } else {
            plain.push(chars[i]);
            i += 1;
        }
    }
    if !plain.is_empty() {
        out.push(("", plain));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::check_source;
    use crate::plan::fallback;

    #[test]
    fn a_fallback_launch_draws_one_panel_per_stage_with_its_workspaces_in_global_memory() {
        let src = "kernels:\n  - name: t\n    dims: {s: 40, l: 24}\n    inputs:\n      x: f32[s, l]\n    outputs:\n      y: f32[s, l]\n    body: |\n      y = x / sum(exp(x), axis=-1)\n";
        let module = check_source(src.as_bytes()).unwrap_or_else(|d| panic!("{d:?}"));
        let launch = fallback(&module.kernels[0].1, "cleave_t", &crate::arch::SM90).unwrap_or_else(|e| panic!("{e}"));
        let svg = schedule_svg(&launch, "t");
        assert_eq!(svg, schedule_svg(&launch, "t"));
        assert_eq!(svg.matches("<g class=\"kernel\"").count(), launch.kernels.len());
        assert!(launch.kernels.len() >= 2, "a workspace between stages");
        for k in &launch.kernels {
            assert!(svg.contains(k.symbol()), "{svg}");
            for p in k.params() {
                let listed = format!("data-level=\"gmem\" data-name=\"{}\"", p.name);
                assert!(svg.contains(&listed), "{} missing:\n{svg}", p.name);
            }
        }
        assert!(svg.contains("workspace 0, written") && svg.contains("workspace 0, read"), "{svg}");
    }

    #[test]
    fn names_are_coloured_by_level_and_a_dim_with_a_tensors_name_is_not() {
        let names: BTreeMap<String, Level> = [("q", Level::Gmem), ("t_q", Level::Smem), ("t9", Level::Reg)]
            .into_iter()
            .map(|(n, l)| (n.to_string(), l))
            .collect();
        let spans = coloured("t9 += MMA(t_q, q[i0, 0:+q])", &names);
        let classed: Vec<(&str, &str)> =
            spans.iter().filter(|s| !s.0.is_empty()).map(|(c, t)| (*c, t.as_str())).collect();
        assert_eq!(classed, vec![("reg", "t9"), ("smem", "t_q"), ("gmem", "q")]);
        let text: String = spans.iter().map(|s| s.1.as_str()).collect();
        assert_eq!(text, "t9 += MMA(t_q, q[i0, 0:+q])");
    }
}
