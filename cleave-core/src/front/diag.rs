//! Located diagnostics: `FILE:LINE:COL: message`.

use std::fmt;

/// A 1-based line and column (columns count characters).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Pos {
    /// Line, from 1.
    pub line: u32,
    /// Column, from 1.
    pub col: u32,
}

impl Pos {
    /// A position.
    pub fn new(line: u32, col: u32) -> Pos {
        Pos { line, col }
    }

    /// The start of a file.
    pub fn start() -> Pos {
        Pos { line: 1, col: 1 }
    }
}

/// One error in a declaration, with where it is.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Diagnostic {
    /// Where the problem is.
    pub pos: Pos,
    /// What is wrong, as a sentence fragment naming the offending item.
    pub message: String,
}

impl Diagnostic {
    /// A diagnostic at `pos`.
    pub fn new(pos: Pos, message: impl Into<String>) -> Self {
        Diagnostic { pos, message: message.into() }
    }

    /// The contract form: `FILE:LINE:COL: message`.
    pub fn render(&self, file: &str) -> String {
        format!("{file}:{}:{}: {}", self.pos.line, self.pos.col, self.message)
    }
}

impl Diagnostic {
    /// The contract line, then the source line it points at with a caret under the offending
    /// item, as codespan-reporting draws it. `source` is the text of `file`; a position past
    /// its end points at the end.
    pub fn render_with_source(&self, file: &str, source: &str) -> String {
        use codespan_reporting::diagnostic::{Diagnostic as Report, Label};
        use codespan_reporting::files::SimpleFile;
        use codespan_reporting::term::{emit_into_string, Config};

        let start = byte_offset(source, self.pos);
        let len = source[start..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .map(char::len_utf8)
            .sum::<usize>()
            .max(source[start..].chars().next().filter(|c| *c != '\n').map_or(0, char::len_utf8));
        let files = SimpleFile::new(file, source);
        let report = Report::error().with_message(&self.message).with_label(Label::primary((), start..start + len));
        let contract = self.render(file);
        match emit_into_string(&Config::default(), &files, &report) {
            // The first line repeats the message as `error: ..`; the contract line replaces it.
            Ok(text) => {
                let snippet: Vec<&str> = text.lines().skip(1).collect();
                format!("{contract}\n{}", snippet.join("\n").trim_end())
            }
            Err(_) => contract,
        }
    }
}

/// The byte offset of a 1-based line and character column in `source`, clamped to its end.
fn byte_offset(source: &str, pos: Pos) -> usize {
    let mut offset = 0;
    for (i, line) in source.split_inclusive('\n').enumerate() {
        if i + 1 == pos.line as usize {
            let col = pos.col.saturating_sub(1) as usize;
            let within: usize = line.trim_end_matches(['\n', '\r']).chars().take(col).map(char::len_utf8).sum();
            return offset + within;
        }
        offset += line.len();
    }
    source.len()
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.pos.line, self.pos.col, self.message)
    }
}

/// Maps byte offsets in a body text to positions in the file it came from.
///
/// Each entry is the byte offset where a body line starts and the file position of that
/// character; positions inside a line advance by characters. A map that is not `exact` sends
/// every offset to its first position.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PosMap {
    lines: Vec<(usize, Pos)>,
    exact: bool,
}

impl PosMap {
    /// A body that sits on the file starting at `start`, one body line per file line, each
    /// body line starting at column `start.col` (a YAML literal block).
    pub fn block(text: &str, start: Pos) -> PosMap {
        let mut lines = vec![(0, start)];
        for (i, (off, _)) in text.match_indices('\n').enumerate() {
            lines.push((off + 1, Pos::new(start.line + 1 + i as u32, start.col)));
        }
        PosMap { lines, exact: true }
    }

    /// A body whose every character maps to one position (a fallback for scalar styles whose
    /// characters do not map one-to-one onto the file).
    pub fn single(at: Pos) -> PosMap {
        PosMap { lines: vec![(0, at)], exact: false }
    }

    /// Explicit line starts, which must be sorted and begin at offset 0.
    pub fn from_lines(lines: Vec<(usize, Pos)>) -> PosMap {
        assert!(lines.first().is_some_and(|l| l.0 == 0), "a position map starts at offset 0");
        PosMap { lines, exact: true }
    }

    /// The file position of byte `offset` of `text`.
    pub fn pos(&self, text: &str, offset: usize) -> Pos {
        if !self.exact {
            return self.lines[0].1;
        }
        let i = match self.lines.binary_search_by(|(o, _)| o.cmp(&offset)) {
            Ok(i) => i,
            Err(i) => i.saturating_sub(1),
        };
        let (start, pos) = self.lines[i];
        let end = offset.min(text.len());
        let chars = text.get(start..end).map_or(0, |s| s.chars().count()) as u32;
        Pos::new(pos.line, pos.col + chars)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snippet_shows_the_line_and_underlines_the_item() {
        let src = "kernels:\n  - name: k\n    body: |\n      y = softmx(x)\n";
        let d = Diagnostic::new(Pos::new(4, 11), "unknown function `softmx`");
        let text = d.render_with_source("k.yaml", src);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "k.yaml:4:11: unknown function `softmx`");
        let source = lines.iter().position(|l| l.contains("y = softmx(x)")).unwrap_or_else(|| panic!("{text}"));
        let caret = lines[source + 1];
        // The carets sit under `softmx`, in the same column as in the source line.
        let at = lines[source].find("softmx").unwrap_or(0);
        assert_eq!(caret.find('^'), Some(at), "{text}");
        assert_eq!(caret.matches('^').count(), "softmx".len(), "{text}");
        // Past the end of the file, and on a multi-byte line, it still renders.
        let end = Diagnostic::new(Pos::new(9, 1), "unexpected end").render_with_source("k.yaml", src);
        assert!(end.starts_with("k.yaml:9:1: unexpected end\n"), "{end}");
        let wide = Diagnostic::new(Pos::new(1, 3), "here").render_with_source("k.yaml", "é é zz\n");
        assert!(wide.lines().any(|l| l.trim_end().ends_with('^')), "{wide}");
    }

    #[test]
    fn block_bodies_map_lines_and_columns() {
        let text = "a = b\n  c = d\n";
        let map = PosMap::block(text, Pos::new(10, 7));
        assert_eq!(map.pos(text, 0), Pos::new(10, 7));
        assert_eq!(map.pos(text, 4), Pos::new(10, 11));
        assert_eq!(map.pos(text, 8), Pos::new(11, 9));
        assert_eq!(PosMap::single(Pos::new(3, 4)).pos(text, 8), Pos::new(3, 4));
    }
}
