//! A minimal SVG writer: the handful of elements the pictures use, with escaping and a fixed
//! number format so that the same picture is always the same bytes.

use std::fmt::Write;

/// Width of one character of the pictures' monospace font, in user units. Boxes are sized
/// from it, so labels fit without measuring text.
pub(crate) const CHAR_W: f64 = 7.4;
/// Height of one line of text.
pub(crate) const LINE_H: f64 = 15.0;

/// The style sheet shared by every picture: classes name what an element is (`op`, `input`,
/// `smem`, `rewritten`, ..) and the sheet decides how it looks.
const STYLE: &str = "\
text { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; fill: #1f2328; }
text.title { font-size: 15px; font-weight: bold; }
text.note { fill: #57606a; }
rect { stroke: #57606a; stroke-width: 1; fill: #ffffff; }
.input rect { fill: #ddf4ff; }
.output rect { fill: #dafbe1; }
.op rect { fill: #f6f8fa; }
.rewritten rect { fill: #fff1e5; stroke: #bc4c00; stroke-width: 2; }
.split rect { fill: #fbefff; stroke: #8250df; stroke-width: 2; }
path.edge { fill: none; stroke: #6e7781; stroke-width: 1.2; marker-end: url(#arrow); }
rect.kernel { fill: #ffffff; stroke: #24292f; stroke-width: 1.5; }
rect.program { fill: #f6f8fa; stroke: none; }
rect.loop { fill: #eaeef2; fill-opacity: 0.5; stroke: #8c959f; stroke-dasharray: 4 2; }
rect.level { fill: #ffffff; }
tspan.gmem, text.gmem { fill: #cf222e; font-weight: bold; }
tspan.smem, text.smem { fill: #0550ae; font-weight: bold; }
tspan.reg, text.reg { fill: #116329; font-weight: bold; }
";

/// An SVG document under construction.
pub(crate) struct Svg {
    body: String,
}

impl Svg {
    pub(crate) fn new() -> Svg {
        Svg { body: String::new() }
    }

    /// Opens a group; `attrs` are extra attributes (name, value), escaped here.
    pub(crate) fn open(&mut self, class: &str, attrs: &[(&str, &str)]) {
        let _ = write!(self.body, "<g class=\"{}\"", escape(class));
        for (k, v) in attrs {
            let _ = write!(self.body, " {k}=\"{}\"", escape(v));
        }
        self.body.push_str(">\n");
    }

    pub(crate) fn close(&mut self) {
        self.body.push_str("</g>\n");
    }

    /// A tooltip for the enclosing group.
    pub(crate) fn title(&mut self, text: &str) {
        let _ = writeln!(self.body, "<title>{}</title>", escape(text));
    }

    pub(crate) fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, class: &str, rounded: bool) {
        let r = if rounded { " rx=\"6\"" } else { "" };
        let class = if class.is_empty() { String::new() } else { format!(" class=\"{}\"", escape(class)) };
        let _ = writeln!(
            self.body,
            "<rect{class} x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"{r}/>",
            num(x),
            num(y),
            num(w),
            num(h)
        );
    }

    /// One line of text whose baseline starts at `(x, y)`; `middle` centres it on `x`.
    pub(crate) fn text(&mut self, x: f64, y: f64, class: &str, middle: bool, content: &str) {
        self.spans(x, y, class, middle, &[("", content)]);
    }

    /// One line of text made of spans, each with its own class (empty for none).
    pub(crate) fn spans(&mut self, x: f64, y: f64, class: &str, middle: bool, spans: &[(&str, &str)]) {
        let anchor = if middle { " text-anchor=\"middle\"" } else { "" };
        let class = if class.is_empty() { String::new() } else { format!(" class=\"{}\"", escape(class)) };
        let _ = write!(self.body, "<text{class} x=\"{}\" y=\"{}\"{anchor} xml:space=\"preserve\">", num(x), num(y));
        for (c, t) in spans {
            if c.is_empty() {
                self.body.push_str(&escape(t));
            } else {
                let _ = write!(self.body, "<tspan class=\"{}\">{}</tspan>", escape(c), escape(t));
            }
        }
        self.body.push_str("</text>\n");
    }

    /// A curve through `points`, vertical at each point, ending in an arrow.
    pub(crate) fn edge(&mut self, points: &[(f64, f64)], attrs: &[(&str, &str)]) {
        let Some(&(x0, y0)) = points.first() else { return };
        let mut d = format!("M{},{}", num(x0), num(y0));
        for w in points.windows(2) {
            let ((ax, ay), (bx, by)) = (w[0], w[1]);
            let my = (ay + by) / 2.0;
            let _ = write!(d, " C{},{} {},{} {},{}", num(ax), num(my), num(bx), num(my), num(bx), num(by));
        }
        self.body.push_str("<path class=\"edge\"");
        for (k, v) in attrs {
            let _ = write!(self.body, " {k}=\"{}\"", escape(v));
        }
        let _ = writeln!(self.body, " d=\"{d}\"/>");
    }

    /// The finished document, `width × height` user units.
    pub(crate) fn finish(self, width: f64, height: f64) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\">",
            w = num(width.ceil()),
            h = num(height.ceil())
        );
        let _ = writeln!(out, "<style>\n{STYLE}</style>");
        out.push_str(
            "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"7\" \
             markerHeight=\"7\" orient=\"auto-start-reverse\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"#6e7781\"/>\
             </marker></defs>\n",
        );
        let _ = writeln!(
            out,
            "<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" style=\"fill: #ffffff; stroke: none\"/>"
        );
        out.push_str(&self.body);
        out.push_str("</svg>\n");
        out
    }
}

/// The width of a line of `chars` characters.
pub(crate) fn text_width(text: &str) -> f64 {
    text.chars().count() as f64 * CHAR_W
}

/// A coordinate with at most one decimal, without a trailing `.0`.
fn num(v: f64) -> String {
    let r = (v * 10.0).round() / 10.0;
    if r == r.trunc() {
        format!("{}", r as i64)
    } else {
        format!("{r:.1}")
    }
}

/// Escapes text for an XML attribute or element.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_short_and_fixed() {
        assert_eq!(num(12.0), "12");
        assert_eq!(num(12.04), "12");
        assert_eq!(num(12.25), "12.3");
        assert_eq!(num(-0.04), "0");
    }

    #[test]
    fn text_is_escaped() {
        let mut s = Svg::new();
        s.text(0.0, 0.0, "a<b", false, "x < y & \"z\"");
        let out = s.finish(10.0, 10.0);
        assert!(out.contains("class=\"a&lt;b\""), "{out}");
        assert!(out.contains(">x &lt; y &amp; &quot;z&quot;</text>"), "{out}");
    }
}
