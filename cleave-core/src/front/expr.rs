//! The expression language of kernel bodies: a lexer and a recursive-descent parser.
//!
//! ```text
//! body   := (stmt (NEWLINE | ';')*)*      -- a statement also ends where `name =` begins
//! stmt   := NAME '=' expr
//! expr   := term (('+' | '-') term)*
//! term   := unary (('*' | '/') unary)*
//! unary  := '-' unary | atom
//! atom   := NUMBER | NAME | NAME '(' [arg (',' arg)*] ')' | '(' expr ')'
//! arg    := NAME '=' expr | expr
//! ```
//! Every node keeps the byte offset of the token that names it, so errors point at the
//! operator or call that failed.

use std::fmt;

/// A token kind.
#[derive(Clone, PartialEq, Debug)]
pub enum Tok {
    /// A name.
    Name(String),
    /// A numeric literal.
    Num(f64),
    /// `=`
    Assign,
    /// `+`
    Plus,
    /// `-`
    Minus,
    /// `*`
    Star,
    /// `/`
    Slash,
    /// `(`
    LParen,
    /// `)`
    RParen,
    /// `,`
    Comma,
    /// A line break or `;`.
    End,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Name(n) => write!(f, "`{n}`"),
            Tok::Num(x) => write!(f, "`{x}`"),
            Tok::Assign => f.write_str("`=`"),
            Tok::Plus => f.write_str("`+`"),
            Tok::Minus => f.write_str("`-`"),
            Tok::Star => f.write_str("`*`"),
            Tok::Slash => f.write_str("`/`"),
            Tok::LParen => f.write_str("`(`"),
            Tok::RParen => f.write_str("`)`"),
            Tok::Comma => f.write_str("`,`"),
            Tok::End => f.write_str("the end of the line"),
        }
    }
}

/// A parse error at a byte offset.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ParseError {
    /// Byte offset in the body.
    pub offset: usize,
    /// What went wrong.
    pub message: String,
}

fn err<T>(offset: usize, message: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError { offset, message: message.into() })
}

/// Splits a body into tokens with their byte offsets. Comments run from `#` to the end of the
/// line.
pub fn lex(text: &str) -> Result<Vec<(Tok, usize)>, ParseError> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b' ' | b'\t' | b'\r' => i += 1,
            b'\n' | b';' => {
                out.push((Tok::End, i));
                i += 1;
            }
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'=' => {
                if bytes.get(i + 1) == Some(&b'=') {
                    return err(i, "`==` is not an operator here; assignments use a single `=`");
                }
                out.push((Tok::Assign, i));
                i += 1;
            }
            b'+' | b'-' | b'*' | b'/' | b'(' | b')' | b',' => {
                let t = match c {
                    b'+' => Tok::Plus,
                    b'-' => Tok::Minus,
                    b'*' => Tok::Star,
                    b'/' => Tok::Slash,
                    b'(' => Tok::LParen,
                    b')' => Tok::RParen,
                    _ => Tok::Comma,
                };
                if c == b'*' && bytes.get(i + 1) == Some(&b'*') {
                    return err(i, "`**` is not supported; use `square(x)` or `exp`/`log`");
                }
                out.push((t, i));
                i += 1;
            }
            b'0'..=b'9' | b'.' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
                    i += 1;
                }
                if i < bytes.len() && (bytes[i] == b'e' || bytes[i] == b'E') {
                    let mut j = i + 1;
                    if j < bytes.len() && (bytes[j] == b'+' || bytes[j] == b'-') {
                        j += 1;
                    }
                    if j < bytes.len() && bytes[j].is_ascii_digit() {
                        i = j;
                        while i < bytes.len() && bytes[i].is_ascii_digit() {
                            i += 1;
                        }
                    }
                }
                let lit = &text[start..i];
                if i < bytes.len() && (bytes[i].is_ascii_alphabetic() || bytes[i] == b'_') {
                    return err(start, format!("malformed number `{}`", &text[start..=i]));
                }
                // Kernels compute in f32: a literal must be an f32 of its own magnitude, not
                // infinity and not a zero or subnormal that a nonzero literal rounds to.
                match lit.parse::<f64>() {
                    Ok(x) if x.is_finite() && x > f64::from(f32::MAX) => {
                        return err(start, format!("number `{lit}` is outside f32's range (largest 3.4e38)"))
                    }
                    Ok(x)
                        if x < f64::from(f32::MIN_POSITIVE)
                            && lit
                                .bytes()
                                .take_while(|b| *b != b'e' && *b != b'E')
                                .any(|b| (b'1'..=b'9').contains(&b)) =>
                    {
                        return err(
                            start,
                            format!("number `{lit}` is too small for f32 (smallest normal 1.2e-38); write 0 for zero"),
                        )
                    }
                    Ok(x) if x.is_finite() => out.push((Tok::Num(x), start)),
                    Ok(_) => return err(start, format!("number `{lit}` is out of range")),
                    Err(_) => return err(start, format!("malformed number `{lit}`")),
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                out.push((Tok::Name(text[start..i].to_string()), start));
            }
            _ => {
                let ch = text[i..].chars().next().unwrap_or('?');
                return err(i, format!("unexpected character `{}`", ch.escape_debug()));
            }
        }
    }
    Ok(out)
}

/// A binary operator as written.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BinTok {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
}

/// An expression with the offset of its defining token.
#[derive(Clone, PartialEq, Debug)]
pub struct Expr {
    /// What it is.
    pub kind: ExprKind,
    /// Byte offset of the operator, call name, literal or name.
    pub offset: usize,
}

/// The forms of an expression.
#[derive(Clone, PartialEq, Debug)]
pub enum ExprKind {
    /// A literal.
    Num(f64),
    /// A tensor name.
    Name(String),
    /// Unary minus.
    Neg(Box<Expr>),
    /// An infix operation.
    Bin(BinTok, Box<Expr>, Box<Expr>),
    /// A function call.
    Call {
        /// Function name.
        func: String,
        /// Arguments in order.
        args: Vec<Arg>,
    },
}

/// A call argument, positional or keyword.
#[derive(Clone, PartialEq, Debug)]
pub struct Arg {
    /// `name=` and the name's offset, for keyword arguments.
    pub keyword: Option<(String, usize)>,
    /// The value.
    pub value: Expr,
}

/// `target = value`.
#[derive(Clone, PartialEq, Debug)]
pub struct Stmt {
    /// Assigned name.
    pub target: String,
    /// Offset of the name.
    pub offset: usize,
    /// The expression.
    pub value: Expr,
}

/// Parses a whole body.
pub fn parse(text: &str) -> Result<Vec<Stmt>, ParseError> {
    let toks = lex(text)?;
    let mut p = Parser { toks, pos: 0, end: text.len(), depth: 0 };
    let mut stmts = Vec::new();
    loop {
        while p.peek() == Some(&Tok::End) {
            p.pos += 1;
        }
        if p.peek().is_none() {
            break;
        }
        stmts.push(p.stmt()?);
        match p.peek() {
            None | Some(Tok::End) => {}
            Some(Tok::Name(_)) if p.peek_at(1) == Some(&Tok::Assign) => {}
            Some(t) => {
                let t = t.clone();
                return err(p.offset(), format!("expected an operator or the end of the statement, found {t}"));
            }
        }
    }
    Ok(stmts)
}

/// Nesting limit, so hostile input cannot overflow the stack.
const MAX_DEPTH: usize = 200;

struct Parser {
    toks: Vec<(Tok, usize)>,
    pos: usize,
    end: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.0)
    }

    fn peek_at(&self, k: usize) -> Option<&Tok> {
        self.toks.get(self.pos + k).map(|t| &t.0)
    }

    fn offset(&self) -> usize {
        self.toks.get(self.pos).map_or(self.end, |t| t.1)
    }

    fn found(&self) -> String {
        self.peek().map_or_else(|| "the end of the body".to_string(), |t| t.to_string())
    }

    fn stmt(&mut self) -> Result<Stmt, ParseError> {
        let offset = self.offset();
        let Some(Tok::Name(target)) = self.peek().cloned() else {
            return err(offset, format!("expected `name = expression`, found {}", self.found()));
        };
        self.pos += 1;
        if self.peek() != Some(&Tok::Assign) {
            return err(self.offset(), format!("expected `=` after `{target}`, found {}", self.found()));
        }
        self.pos += 1;
        let value = self.expr()?;
        Ok(Stmt { target, offset, value })
    }

    fn enter(&mut self) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return err(self.offset(), "expression nested too deeply");
        }
        Ok(())
    }

    fn expr(&mut self) -> Result<Expr, ParseError> {
        self.enter()?;
        let mut lhs = self.term()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Plus) => BinTok::Add,
                Some(Tok::Minus) => BinTok::Sub,
                _ => break,
            };
            let offset = self.offset();
            self.pos += 1;
            let rhs = self.term()?;
            lhs = Expr { kind: ExprKind::Bin(op, Box::new(lhs), Box::new(rhs)), offset };
        }
        self.depth -= 1;
        Ok(lhs)
    }

    fn term(&mut self) -> Result<Expr, ParseError> {
        let mut lhs = self.unary()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Star) => BinTok::Mul,
                Some(Tok::Slash) => BinTok::Div,
                _ => break,
            };
            let offset = self.offset();
            self.pos += 1;
            let rhs = self.unary()?;
            lhs = Expr { kind: ExprKind::Bin(op, Box::new(lhs), Box::new(rhs)), offset };
        }
        Ok(lhs)
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        if self.peek() == Some(&Tok::Minus) {
            let offset = self.offset();
            self.pos += 1;
            self.enter()?;
            let inner = self.unary()?;
            self.depth -= 1;
            return Ok(Expr { kind: ExprKind::Neg(Box::new(inner)), offset });
        }
        self.atom()
    }

    fn atom(&mut self) -> Result<Expr, ParseError> {
        let offset = self.offset();
        match self.peek().cloned() {
            Some(Tok::Num(x)) => {
                self.pos += 1;
                Ok(Expr { kind: ExprKind::Num(x), offset })
            }
            Some(Tok::Name(name)) => {
                self.pos += 1;
                if self.peek() != Some(&Tok::LParen) {
                    return Ok(Expr { kind: ExprKind::Name(name), offset });
                }
                self.pos += 1;
                let mut args = Vec::new();
                if self.peek() == Some(&Tok::RParen) {
                    self.pos += 1;
                    return Ok(Expr { kind: ExprKind::Call { func: name, args }, offset });
                }
                loop {
                    let keyword = match (self.peek(), self.peek_at(1)) {
                        (Some(Tok::Name(k)), Some(Tok::Assign)) => {
                            let k = (k.clone(), self.offset());
                            self.pos += 2;
                            Some(k)
                        }
                        _ => None,
                    };
                    let value = self.expr()?;
                    args.push(Arg { keyword, value });
                    match self.peek() {
                        Some(Tok::Comma) => self.pos += 1,
                        Some(Tok::RParen) => {
                            self.pos += 1;
                            break;
                        }
                        _ => {
                            return err(
                                self.offset(),
                                format!("expected `,` or `)` in the arguments of `{name}`, found {}", self.found()),
                            )
                        }
                    }
                }
                Ok(Expr { kind: ExprKind::Call { func: name, args }, offset })
            }
            Some(Tok::LParen) => {
                self.pos += 1;
                let inner = self.expr()?;
                if self.peek() != Some(&Tok::RParen) {
                    return err(self.offset(), format!("expected `)`, found {}", self.found()));
                }
                self.pos += 1;
                Ok(inner)
            }
            _ => err(offset, format!("expected an expression, found {}", self.found())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(e: &Expr) -> String {
        match &e.kind {
            ExprKind::Num(x) => format!("{x}"),
            ExprKind::Name(n) => n.clone(),
            ExprKind::Neg(x) => format!("(-{})", show(x)),
            ExprKind::Bin(op, a, b) => format!("({} {op:?} {})", show(a), show(b)),
            ExprKind::Call { func, args } => {
                let a: Vec<String> = args
                    .iter()
                    .map(|a| match &a.keyword {
                        Some((k, _)) => format!("{k}={}", show(&a.value)),
                        None => show(&a.value),
                    })
                    .collect();
                format!("{func}({})", a.join(", "))
            }
        }
    }

    #[test]
    fn precedence_and_associativity() {
        let s = parse("o = a - b - c * -d / e\n").unwrap();
        assert_eq!(show(&s[0].value), "((a Sub b) Sub ((c Mul (-d)) Div e))");
    }

    #[test]
    fn calls_keywords_and_statements() {
        let s = parse(
            "# header\ns = matmul(q, transpose(k)) * 0.125  # scale\no = softmax(s, axis=-1); p = sum(o, axis=1e0)",
        )
        .unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(show(&s[0].value), "(matmul(q, transpose(k)) Mul 0.125)");
        assert_eq!(show(&s[1].value), "softmax(s, axis=(-1))");
        assert_eq!(s[1].offset, 54);
    }

    #[test]
    fn statements_may_follow_without_a_separator() {
        // The macro front end sees no line breaks.
        let s = parse("a = exp(x) b = a * a").unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].target, "b");
    }

    #[test]
    fn errors_point_at_the_offending_token() {
        let e = parse("o = a +\n").unwrap_err();
        assert_eq!(e.offset, 7);
        assert!(e.message.contains("expected an expression"), "{}", e.message);
        let e = parse("o = f(a b)").unwrap_err();
        assert_eq!(e.offset, 8);
        let e = parse("o = a b").unwrap_err();
        assert!(e.message.contains("expected an operator"));
        let e = parse("o = 1.2.3").unwrap_err();
        assert!(e.message.contains("malformed number"));
        let e = parse("o = 3x").unwrap_err();
        assert!(e.message.contains("malformed number `3x`"));
        assert!(parse("o = a $ b").unwrap_err().message.contains("unexpected character `$`"));
        assert!(parse("= a").unwrap_err().message.contains("expected `name = expression`"));
        let deep = format!("o = {}a{}", "(".repeat(1000), ")".repeat(1000));
        assert!(parse(&deep).unwrap_err().message.contains("nested too deeply"));
        let deep = format!("o = {}a", "-".repeat(1000));
        assert!(parse(&deep).unwrap_err().message.contains("nested too deeply"));
    }
}
