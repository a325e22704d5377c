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
    fn block_bodies_map_lines_and_columns() {
        let text = "a = b\n  c = d\n";
        let map = PosMap::block(text, Pos::new(10, 7));
        assert_eq!(map.pos(text, 0), Pos::new(10, 7));
        assert_eq!(map.pos(text, 4), Pos::new(10, 11));
        assert_eq!(map.pos(text, 8), Pos::new(11, 9));
        assert_eq!(PosMap::single(Pos::new(3, 4)).pos(text, 8), Pos::new(3, 4));
    }
}
