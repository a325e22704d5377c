//! The Rust-token front end: the inline form of `cleave::kernel!` to a [`KernelDecl`].
//!
//! ```text
//! name: swiglu,
//! dims: { t: dyn 256, k: 4096, f: 14336 },
//! inputs: { x: f16[t, k], w1: f16[k, f], w2: f16[k, f] },
//! outputs: { y: f16[t, f] },
//! body: { y = silu(matmul(x, w1)) * matmul(x, w2) }
//! ```
//!
//! The fields mirror `kernels.yaml` and may come in any order. `dyn N` marks a runtime axis
//! whose representative extent is `N`; `ragged(indptr) N` and `paged(indices = .., indptr = ..,
//! page_size = .., last_page_len = ..) N` mark a per-request one. A tensor's buffer axes follow
//! its type as in the YAML form: `q: bf16[b, g, r, d] as [b, (g r), d]`. The body is the expression language of the YAML form:
//! its tokens are written out as text and go through the same parser, so both front ends accept
//! exactly the same bodies. Statements are separated by `;` or simply follow each other
//! (`a = .. b = ..`), because token streams carry no line breaks.
//!
//! Token streams have no file positions on stable Rust, so every part of the declaration gets a
//! synthetic [`Pos`]: the fields on line 1 (one column per recorded token) and the body on line
//! 2 (one column per character of its text). The [`SpanMap`] sends any position a
//! [`Diagnostic`](super::Diagnostic) carries back to the span of the token it points into, so
//! the macro reports every error of [`lower`](super::lower) at the right token. The same parser
//! serves the proc macro and the build script's source scan.

use proc_macro2::{Delimiter, Spacing, Span, TokenStream, TokenTree};

use super::decl::{AxisDecl, Body, DimDecl, KernelDecl, PerRequestDecl, StorageAxisDecl, TensorSrc};
use super::diag::{Pos, PosMap};

/// The line of the synthetic positions given to the fields of a declaration.
const HEADER_LINE: u32 = 1;
/// The line of the synthetic positions given to the characters of the body.
const BODY_LINE: u32 = 2;

/// A declaration parsed from tokens, with the way back from positions to spans.
#[derive(Clone, Debug)]
pub struct Parsed {
    /// The declaration, with synthetic positions.
    pub decl: KernelDecl,
    /// Positions to token spans.
    pub spans: SpanMap,
}

/// Maps the synthetic positions of a [`Parsed`] declaration to token spans.
#[derive(Clone, Debug)]
pub struct SpanMap {
    /// The span of header column `i + 1`.
    header: Vec<Span>,
    /// Body tokens: first column, one past the last column, span.
    body: Columns,
    /// Where an error about the body as a whole points (its braces).
    body_span: Span,
    /// Where an error about the declaration as a whole points.
    whole: Span,
}

impl SpanMap {
    /// The span of the token a position points into. Positions past the last body token map to
    /// that token; positions that name no token map to the declaration as a whole.
    pub fn span(&self, pos: Pos) -> Span {
        match pos.line {
            HEADER_LINE => {
                pos.col.checked_sub(1).and_then(|i| self.header.get(i as usize)).copied().unwrap_or(self.whole)
            }
            BODY_LINE => {
                // The last token starting at or before the column: an offset between two tokens
                // (or past the end) belongs to the token before it.
                match self.body.iter().rev().find(|(start, _, _)| *start <= pos.col) {
                    Some((_, _, span)) => *span,
                    None => self.body.first().map_or(self.body_span, |t| t.2),
                }
            }
            _ => self.whole,
        }
    }

    /// The span of the declaration as a whole.
    pub fn whole(&self) -> Span {
        self.whole
    }
}

/// The one-identifier form `kernel!(name)`: the name, if that is what the tokens are.
pub fn reference(tokens: &TokenStream) -> Option<proc_macro2::Ident> {
    let mut iter = flatten(tokens.clone()).into_iter();
    match (iter.next(), iter.next()) {
        (Some(TokenTree::Ident(name)), None) => Some(name),
        _ => None,
    }
}

/// Parses the inline form. The error points at the offending token; checking the declaration
/// itself (names, shapes, the body) is [`lower`](super::lower)'s job, whose positions
/// [`Parsed::spans`] maps back.
pub fn parse(tokens: TokenStream) -> syn::Result<Parsed> {
    let tokens = flatten(tokens);
    // In a proc macro the call site is the whole invocation: where "the declaration is missing
    // `body`" belongs.
    let whole = Span::call_site();
    let mut p = Parser { header: Vec::new(), whole };
    let (decl, body, body_span) = p.declaration(&tokens)?;
    Ok(Parsed { decl, spans: SpanMap { header: p.header, body, body_span, whole } })
}

/// A stable fingerprint of a declaration as written, independent of where it is written: the
/// same inline declaration hashes the same in the proc macro and in the build script's scan, and
/// any change to a name, dim, type or the body changes it.
pub fn fingerprint(decl: &KernelDecl) -> String {
    crate::hash::hex(&[b"cleave-declaration-v1", canonical(decl).as_bytes()])
}

/// The declaration as text without positions: what [`fingerprint`] hashes, and what cache keys
/// of the build are made of.
pub fn canonical(decl: &KernelDecl) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "name {}", decl.name);
    let name = |a: &Option<AxisDecl>| a.as_ref().map_or("-", |a| a.name.as_str()).to_string();
    for d in &decl.dims {
        let _ = write!(s, "dim {} {} {}", d.name, d.value, if d.dynamic { "dynamic" } else { "static" });
        // Written only when present, so that declarations without it keep their fingerprints.
        if !d.also.is_empty() {
            let values: Vec<String> = d.also.iter().map(|(v, _)| v.to_string()).collect();
            let _ = write!(s, " also {}", values.join(" "));
        }
        match &d.per_request {
            None => {}
            Some(PerRequestDecl::Ragged { indptr, .. }) => {
                let _ = write!(s, " ragged {}", indptr.name);
            }
            Some(PerRequestDecl::Paged { indices, indptr, page_size, last_page_len, .. }) => {
                let _ =
                    write!(s, " paged {} {} {} {}", name(indices), name(indptr), name(page_size), name(last_page_len));
            }
        }
        s.push('\n');
    }
    let tensor = |s: &mut String, role: &str, t: &TensorSrc| {
        let axes: Vec<&str> = t.shape.iter().map(|a| a.name.as_str()).collect();
        let _ = write!(s, "{role} {} {}[{}]", t.name, t.dtype, axes.join(", "));
        if let Some(r) = &t.reduce {
            let names: Vec<&str> = r.iter().map(|a| a.name.as_str()).collect();
            let _ = write!(s, " reduce [{}]", names.join(", "));
        }
        if let Some(st) = &t.storage {
            let axes: Vec<String> = st
                .iter()
                .map(|g| {
                    let names: Vec<&str> = g.names.iter().map(|a| a.name.as_str()).collect();
                    if g.grouped {
                        format!("({})", names.join(" "))
                    } else {
                        names.join(" ")
                    }
                })
                .collect();
            let _ = write!(s, " as [{}]", axes.join(", "));
        }
        s.push('\n');
    };
    for t in &decl.inputs {
        tensor(&mut s, "input", t);
    }
    for t in &decl.outputs {
        tensor(&mut s, "output", t);
    }
    // The body as its tokens: spacing (which differs between the source and a token stream)
    // does not change the declaration.
    match super::expr::lex(&decl.body.text) {
        Ok(toks) => {
            let toks: Vec<String> = toks.iter().map(|(t, _)| format!("{t:?}")).collect();
            let _ = write!(s, "body {}", toks.join(" "));
        }
        Err(_) => {
            let _ = write!(s, "body-text {}", decl.body.text);
        }
    }
    s
}

/// Removes invisible groups (which `macro_rules!` wraps around forwarded fragments), so that
/// a declaration passed through another macro parses like one written directly.
fn flatten(tokens: TokenStream) -> Vec<TokenTree> {
    let mut out = Vec::new();
    for t in tokens {
        match t {
            TokenTree::Group(g) if g.delimiter() == Delimiter::None => out.extend(flatten(g.stream())),
            t => out.push(t),
        }
    }
    out
}

fn error<T>(span: Span, message: impl std::fmt::Display) -> syn::Result<T> {
    Err(syn::Error::new(span, message))
}

/// The fields of the inline form, in the order the error messages list them.
const FIELDS: [&str; 5] = ["name", "dims", "inputs", "outputs", "body"];

/// Body tokens: first column, one past the last column, span.
type Columns = Vec<(u32, u32, Span)>;

/// The parsed body: the declaration, the body's token columns and the body's span.
type DeclParts = (KernelDecl, Columns, Span);

struct Parser {
    header: Vec<Span>,
    whole: Span,
}

impl Parser {
    /// Records a token and returns its synthetic position.
    fn at(&mut self, span: Span) -> Pos {
        self.header.push(span);
        Pos::new(HEADER_LINE, self.header.len() as u32)
    }

    fn declaration(&mut self, tokens: &[TokenTree]) -> syn::Result<DeclParts> {
        let decl_pos = self.at(self.whole);
        let mut seen: [Option<Span>; 5] = [None; 5];
        let mut name = None;
        let mut dims = None;
        let mut inputs = None;
        let mut outputs = None;
        let mut body = None;
        for entry in split_commas(tokens) {
            let (key, value) = match entry {
                [TokenTree::Ident(key), TokenTree::Punct(colon), value @ ..] if colon.as_char() == ':' => (key, value),
                [TokenTree::Ident(key), ..] if FIELDS.contains(&key.to_string().as_str()) => {
                    return error(key.span(), format!("expected `:` after `{key}`"));
                }
                [first, ..] => {
                    return error(
                        first.span(),
                        format!("expected a field `name: value` (one of {}), found `{first}`", FIELDS.join(", ")),
                    );
                }
                [] => continue,
            };
            let key_text = key.to_string();
            let Some(index) = FIELDS.iter().position(|f| *f == key_text) else {
                return error(key.span(), format!("unknown field `{key_text}`; expected one of {}", FIELDS.join(", ")));
            };
            if seen[index].is_some() {
                return error(key.span(), format!("field `{key_text}` is given twice"));
            }
            seen[index] = Some(key.span());
            if value.is_empty() {
                return error(key.span(), format!("field `{key_text}` has no value"));
            }
            match index {
                0 => name = Some(self.name(value)?),
                1 => dims = Some(self.dims(key.span(), value)?),
                2 => inputs = Some(self.tensors(key.span(), value, "inputs")?),
                3 => outputs = Some(self.tensors(key.span(), value, "outputs")?),
                _ => body = Some(body_of(key.span(), value)?),
            }
        }
        let missing = |field: &str, example: &str| {
            syn::Error::new(self.whole, format!("the declaration is missing `{field}`, e.g. `{field}: {example}`"))
        };
        let (name, name_pos) = name.ok_or_else(|| missing("name", "my_kernel"))?;
        let dims = dims.ok_or_else(|| missing("dims", "{ s: dyn 4096, d: 128 }"))?;
        let inputs = inputs.ok_or_else(|| missing("inputs", "{ x: f16[s, d] }"))?;
        let outputs = outputs.ok_or_else(|| missing("outputs", "{ y: f16[s, d] }"))?;
        let (text, columns, body_span) = body.ok_or_else(|| missing("body", "{ y = exp(x) }"))?;
        let map = PosMap::from_lines(vec![(0, Pos::new(BODY_LINE, 1))]);
        let decl = KernelDecl { name, name_pos, pos: decl_pos, dims, inputs, outputs, body: Body { text, map } };
        Ok((decl, columns, body_span))
    }

    fn name(&mut self, value: &[TokenTree]) -> syn::Result<(String, Pos)> {
        match value {
            [TokenTree::Ident(name)] => Ok((name.to_string(), self.at(name.span()))),
            [first, ..] => error(first.span(), "the kernel name must be an identifier, e.g. `name: attention`"),
            [] => error(self.whole, "the kernel name is missing"),
        }
    }

    /// `{ s: dyn 4096, d: 128, .. }`
    fn dims(&mut self, key: Span, value: &[TokenTree]) -> syn::Result<Vec<DimDecl>> {
        let inner = braced(key, value, "dims", "{ s: dyn 4096, d: 128 }")?;
        let mut out = Vec::new();
        for entry in split_commas(&inner) {
            let (name, rest) = named_entry(entry, "a dim", "s: dyn 4096")?;
            let pos = self.at(name.span());
            let (per_request, rest) = match rest {
                [TokenTree::Ident(kind), TokenTree::Group(args), rest @ ..]
                    if (kind == "ragged" || kind == "paged") && args.delimiter() == Delimiter::Parenthesis =>
                {
                    let kpos = self.at(kind.span());
                    (Some(self.per_request(&name.to_string(), kind, kpos, args)?), rest)
                }
                rest => (None, rest),
            };
            let (dynamic, rest) = match rest {
                [TokenTree::Ident(d), rest @ ..] if d == "dyn" => {
                    if rest.is_empty() {
                        return error(
                            d.span(),
                            format!(
                                "dynamic dim `{name}` needs a representative extent to schedule for, e.g. `{name}: dyn 4096`"
                            ),
                        );
                    }
                    (true, rest)
                }
                rest => (false, rest),
            };
            if rest.is_empty() {
                return error(
                    name.span(),
                    format!(
                        "dim `{name}` needs a representative extent to schedule for, e.g. `{name}: ragged(indptr) 512`"
                    ),
                );
            }
            // `dyn 16 | 64 | 256`: the representative extent, then more to plan for. Each part
            // after the first keeps the `|` before it, where an empty one is reported.
            let mut parts: Vec<(Option<Span>, &[TokenTree])> = Vec::new();
            let mut start = 0;
            let mut bar = None;
            for (i, t) in rest.iter().enumerate() {
                if let TokenTree::Punct(p) = t {
                    if p.as_char() == '|' {
                        parts.push((bar, &rest[start..i]));
                        bar = Some(p.span());
                        start = i + 1;
                    }
                }
            }
            parts.push((bar, &rest[start..]));
            let first = parts[0].1;
            if first.is_empty() {
                let at = parts.get(1).and_then(|p| p.0).unwrap_or(name.span());
                return error(at, format!("dim `{name}` needs an extent before `|`, e.g. `{name}: dyn 16 | 64`"));
            }
            let (value, value_span) = integer(&name.to_string(), first)?;
            let value_pos = self.at(value_span);
            let mut also = Vec::new();
            for &(bar, part) in &parts[1..] {
                if part.is_empty() {
                    return error(
                        bar.unwrap_or(name.span()),
                        format!(
                            "dim `{name}` has an empty alternative; write its extents as `{name}: dyn 16 | 64 | 256`"
                        ),
                    );
                }
                let (v, span) = integer(&name.to_string(), part)?;
                also.push((v, self.at(span)));
            }
            out.push(DimDecl { name: name.to_string(), pos, value, value_pos, dynamic, per_request, also });
        }
        Ok(out)
    }

    /// `ragged(indptr)` or `paged(indices = a, indptr = b, page_size = 64, last_page_len = c)`.
    fn per_request(
        &mut self,
        dim: &str,
        kind: &proc_macro2::Ident,
        pos: Pos,
        args: &proc_macro2::Group,
    ) -> syn::Result<PerRequestDecl> {
        let tokens = flatten(args.stream());
        if kind == "ragged" {
            return match tokens.as_slice() {
                [TokenTree::Ident(t)] => {
                    Ok(PerRequestDecl::Ragged { pos, indptr: AxisDecl { name: t.to_string(), pos: self.at(t.span()) } })
                }
                _ => error(
                    args.span(),
                    format!(
                        "`ragged` of dim `{dim}` names the `i32[batch + 1]` tensor that packs it: `ragged(indptr)`"
                    ),
                ),
            };
        }
        let (mut indices, mut indptr, mut page_size, mut last_page_len) = (None, None, None, None);
        for entry in split_commas(&tokens) {
            let (key, value) = match entry {
                [TokenTree::Ident(k), TokenTree::Punct(eq), v] if eq.as_char() == '=' => (k, v),
                [first, ..] => {
                    return error(
                        first.span(),
                        format!("`paged` of dim `{dim}` takes `key = value` pairs, found `{}`", join(entry)),
                    )
                }
                [] => continue,
            };
            let slot = match key.to_string().as_str() {
                "indices" => &mut indices,
                "indptr" => &mut indptr,
                "page_size" => &mut page_size,
                "last_page_len" => &mut last_page_len,
                other => {
                    return error(
                        key.span(),
                        format!(
                        "unknown key `{other}` in `paged` of dim `{dim}`; expected `indices`, `indptr`, `page_size` \
                             and optionally `last_page_len`"
                    ),
                    )
                }
            };
            let (text, span) = match value {
                TokenTree::Ident(i) => (i.to_string(), i.span()),
                TokenTree::Literal(l) => (l.to_string(), l.span()),
                other => return error(other.span(), format!("expected a name or an integer, found `{other}`")),
            };
            *slot = Some(AxisDecl { name: text, pos: self.at(span) });
        }
        Ok(PerRequestDecl::Paged { pos, indices, indptr, page_size, last_page_len })
    }

    /// `{ x: f16[s, d], .. }`
    fn tensors(&mut self, key: Span, value: &[TokenTree], what: &str) -> syn::Result<Vec<TensorSrc>> {
        let inner = braced(key, value, what, "{ x: f16[s, d] }")?;
        let mut out = Vec::new();
        for entry in split_commas(&inner) {
            let (name, rest) = named_entry(entry, "a tensor", "x: f16[s, d]")?;
            let pos = self.at(name.span());
            let (dtype, shape, storage) = match rest {
                [TokenTree::Ident(dtype), TokenTree::Group(shape)] if shape.delimiter() == Delimiter::Bracket => {
                    (dtype, shape, None)
                }
                [TokenTree::Ident(dtype), TokenTree::Group(shape), TokenTree::Ident(kw), TokenTree::Group(storage)]
                    if shape.delimiter() == Delimiter::Bracket
                        && kw == "as"
                        && storage.delimiter() == Delimiter::Bracket =>
                {
                    (dtype, shape, Some(storage))
                }
                [first, ..] => {
                    return error(
                        first.span(),
                        format!("the type of `{name}` must look like `f16[s, d]` (a dtype, then its dims in brackets)"),
                    );
                }
                [] => return error(name.span(), format!("`{name}` has no type; write e.g. `{name}: f16[s, d]`")),
            };
            let dtype_pos = self.at(dtype.span());
            let mut axes = Vec::new();
            let shape_tokens = flatten(shape.stream());
            for axis in split_commas(&shape_tokens) {
                let (text, span) = match axis {
                    [TokenTree::Ident(dim)] => (dim.to_string(), dim.span()),
                    [TokenTree::Literal(lit)] => (lit.to_string(), lit.span()),
                    // `n + 1`: the length of an `indptr` over `n` requests.
                    [TokenTree::Ident(dim), TokenTree::Punct(plus), TokenTree::Literal(one)]
                        if plus.as_char() == '+' =>
                    {
                        (format!("{dim} + {one}"), dim.span())
                    }
                    [first, ..] => {
                        return error(
                            first.span(),
                            format!("each axis of `{name}` must be a dim name or `1`, found `{}`", join(axis)),
                        );
                    }
                    [] => return error(shape.span(), format!("empty axis in the shape of `{name}`")),
                };
                axes.push(AxisDecl { name: text, pos: self.at(span) });
            }
            let storage = match storage {
                None => None,
                Some(group) => {
                    let mut groups = Vec::new();
                    let tokens = flatten(group.stream());
                    for axis in split_commas(&tokens) {
                        let one = |this: &mut Self, t: &TokenTree| -> syn::Result<AxisDecl> {
                            match t {
                                TokenTree::Ident(i) => Ok(AxisDecl { name: i.to_string(), pos: this.at(i.span()) }),
                                TokenTree::Literal(l) => Ok(AxisDecl { name: l.to_string(), pos: this.at(l.span()) }),
                                other => error(
                                    other.span(),
                                    format!("a storage axis of `{name}` is a dim, `1` or `(a b ..)`, found `{other}`"),
                                ),
                            }
                        };
                        match axis {
                            [TokenTree::Group(g)] if g.delimiter() == Delimiter::Parenthesis => {
                                let pos = self.at(g.span());
                                let inner = flatten(g.stream());
                                let names = inner.iter().map(|t| one(self, t)).collect::<syn::Result<Vec<_>>>()?;
                                if names.is_empty() {
                                    return error(g.span(), format!("empty `()` in the storage of `{name}`"));
                                }
                                groups.push(StorageAxisDecl { names, grouped: true, pos });
                            }
                            [t] => {
                                let a = one(self, t)?;
                                groups.push(StorageAxisDecl { pos: a.pos, names: vec![a], grouped: false });
                            }
                            [first, ..] => {
                                return error(
                                    first.span(),
                                    format!(
                                        "a storage axis of `{name}` is a dim, `1` or `(a b ..)`, found `{}`",
                                        join(axis)
                                    ),
                                )
                            }
                            [] => {}
                        }
                    }
                    Some(groups)
                }
            };
            out.push(TensorSrc {
                name: name.to_string(),
                pos,
                dtype: dtype.to_string(),
                dtype_pos,
                shape: axes,
                reduce: None,
                storage,
            });
        }
        Ok(out)
    }
}

/// The tokens inside the `{ .. }` value of a field.
fn braced(key: Span, value: &[TokenTree], field: &str, example: &str) -> syn::Result<Vec<TokenTree>> {
    match value {
        [TokenTree::Group(g)] if g.delimiter() == Delimiter::Brace => Ok(flatten(g.stream())),
        [first, ..] => error(first.span(), format!("`{field}` must be a braced list, e.g. `{field}: {example}`")),
        [] => error(key, format!("`{field}` has no value")),
    }
}

/// `name: rest` inside a braced list.
fn named_entry<'t>(
    entry: &'t [TokenTree],
    what: &str,
    example: &str,
) -> syn::Result<(&'t proc_macro2::Ident, &'t [TokenTree])> {
    match entry {
        [TokenTree::Ident(name), TokenTree::Punct(colon), rest @ ..] if colon.as_char() == ':' => Ok((name, rest)),
        [first, ..] => error(first.span(), format!("expected {what} as `{example}`, found `{}`", join(entry))),
        [] => unreachable!("split_commas yields no empty entries"),
    }
}

/// A dim extent: an integer literal, optionally negated (which `lower` then rejects with its
/// usual message).
fn integer(dim: &str, tokens: &[TokenTree]) -> syn::Result<(i128, Span)> {
    let (negative, lit) = match tokens {
        [TokenTree::Literal(lit)] => (false, lit),
        [TokenTree::Punct(minus), TokenTree::Literal(lit)] if minus.as_char() == '-' => (true, lit),
        [first, ..] => {
            return error(
                first.span(),
                format!("dim `{dim}` must be an integer extent (or `dyn N`), found `{}`", join(tokens)),
            )
        }
        [] => unreachable!("named_entry leaves at least the value"),
    };
    let text = lit.to_string().replace('_', "");
    let parsed =
        if let Some(hex) = text.strip_prefix("0x") { i128::from_str_radix(hex, 16) } else { text.parse::<i128>() };
    match parsed {
        Ok(v) => Ok((if negative { -v } else { v }, lit.span())),
        Err(e) if matches!(e.kind(), std::num::IntErrorKind::PosOverflow) => {
            error(lit.span(), format!("dim `{dim}` = {text} is too large"))
        }
        Err(_) => error(lit.span(), format!("dim `{dim}` must be a positive integer without a suffix, found `{lit}`")),
    }
}

/// The body `{ .. }` as text, with the columns and span of each token.
fn body_of(key: Span, value: &[TokenTree]) -> syn::Result<(String, Columns, Span)> {
    let group = match value {
        [TokenTree::Group(g)] if g.delimiter() == Delimiter::Brace => g,
        [first, ..] => {
            return error(first.span(), "`body` must be a braced list of assignments, e.g. `body: { y = exp(x) }`")
        }
        [] => return error(key, "`body` has no value"),
    };
    let mut w = BodyWriter { text: String::new(), columns: Vec::new(), glue: false };
    w.write(&flatten(group.stream()))?;
    Ok((w.text, w.columns, group.span()))
}

/// Writes body tokens as expression-language text, one space between tokens except after a
/// joint punctuation character, so that `==` and `**` reach the lexer as written and get its
/// messages.
struct BodyWriter {
    text: String,
    /// First column, one past the last column, and span of each token written.
    columns: Columns,
    /// The previous token was joint punctuation: the next one follows without a space.
    glue: bool,
}

impl BodyWriter {
    fn push(&mut self, piece: &str, span: Span, joint: bool) {
        // Spaced like hand-written code: `f(x, y)`, so the text reads well in generated docs.
        let call = piece == "(" && self.text.ends_with(|c: char| c.is_alphanumeric() || c == '_');
        let tight = self.glue || call || self.text.ends_with('(') || piece == ")" || piece == ",";
        if !self.text.is_empty() && !tight {
            self.text.push(' ');
        }
        let start = self.text.chars().count() as u32 + 1;
        self.text.push_str(piece);
        self.columns.push((start, start + piece.chars().count() as u32, span));
        self.glue = joint;
    }

    fn write(&mut self, tokens: &[TokenTree]) -> syn::Result<()> {
        for t in tokens {
            match t {
                TokenTree::Ident(i) => self.push(&i.to_string(), i.span(), false),
                TokenTree::Literal(l) => self.push(&l.to_string(), l.span(), false),
                TokenTree::Punct(p) => self.push(&p.as_char().to_string(), p.span(), p.spacing() == Spacing::Joint),
                TokenTree::Group(g) => match g.delimiter() {
                    Delimiter::Parenthesis => {
                        self.push("(", g.span_open(), false);
                        self.write(&flatten(g.stream()))?;
                        self.push(")", g.span_close(), false);
                    }
                    Delimiter::None => self.write(&flatten(g.stream()))?,
                    Delimiter::Bracket | Delimiter::Brace => {
                        let open = if g.delimiter() == Delimiter::Bracket { '[' } else { '{' };
                        return error(
                            g.span_open(),
                            format!("`{open}` is not part of the body language (use `( )` to group expressions)"),
                        );
                    }
                },
            }
        }
        Ok(())
    }
}

/// Splits tokens at top-level commas, dropping empty pieces (a trailing comma).
fn split_commas(tokens: &[TokenTree]) -> Vec<&[TokenTree]> {
    tokens.split(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == ',')).filter(|piece| !piece.is_empty()).collect()
}

/// Tokens as text, for messages.
fn join(tokens: &[TokenTree]) -> String {
    tokens.iter().map(ToString::to_string).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::lower;

    fn tokens(text: &str) -> TokenStream {
        text.parse().expect("tokens")
    }

    const SWIGLU: &str = "name: swiglu,
        dims: { t: dyn 256, k: 4096, f: 14336 },
        inputs: { x: f16[t, k], w1: f16[k, f], w2: f16[k, f] },
        outputs: { y: f16[t, f] },
        body: { y = silu(matmul(x, w1)) * matmul(x, w2) }";

    #[test]
    fn the_inline_form_lowers_like_the_yaml_form() {
        let p = parse(tokens(SWIGLU)).unwrap();
        assert_eq!(p.decl.name, "swiglu");
        assert_eq!(p.decl.dims.len(), 3);
        assert!(p.decl.dims[0].dynamic && !p.decl.dims[1].dynamic);
        assert_eq!(p.decl.dims[2].value, 14336);
        assert_eq!(p.decl.body.text, "y = silu(matmul(x, w1)) * matmul(x, w2)");
        assert_eq!(p.decl.inputs[1].shape.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["k", "f"]);
        let g = lower(&p.decl).unwrap();
        assert_eq!(g.inputs.len(), 3);

        let yaml = "kernels:\n  - name: swiglu\n    dims: { t: { value: 256, dynamic: true }, k: 4096, f: 14336 }\n    \
                    inputs: { x: \"f16[t, k]\", w1: \"f16[k, f]\", w2: \"f16[k, f]\" }\n    outputs: { y: \"f16[t, f]\" }\n    \
                    body: |\n      y = silu(matmul(x, w1)) * matmul(x, w2)\n";
        let m = crate::front::check_source(yaml.as_bytes()).unwrap();
        assert_eq!(m.kernels[0].1.listing(), g.listing());
    }

    /// `dyn 16 | 64 | 256` is `also: [64, 256]`; both forms give the same points, and the
    /// extents enter the fingerprint only when there are some.
    #[test]
    fn extents_to_plan_for_are_written_alike_in_both_forms() {
        let inline = "name: gemv, dims: { b: dyn 16 | 64 | 256, k: 512, n: 256 },
            inputs: { x: f16[b, k], w: f16[k, n] }, outputs: { y: f16[b, n] }, body: { y = matmul(x, w) }";
        let yaml = "kernels:\n  - name: gemv\n    dims: { b: { value: 16, dynamic: true, also: [64, 256] }, k: 512, n: 256 }\n    \
                    inputs: { x: \"f16[b, k]\", w: \"f16[k, n]\" }\n    outputs: { y: \"f16[b, n]\" }\n    \
                    body: |\n      y = matmul(x, w)\n";
        let p = parse(tokens(inline)).unwrap();
        let y = crate::front::parse_yaml(yaml).unwrap().remove(0);
        let values = |d: &DimDecl| d.also.iter().map(|(v, _)| *v).collect::<Vec<_>>();
        assert_eq!(values(&p.decl.dims[0]), [64, 256]);
        assert_eq!(values(&y.dims[0]), [64, 256]);
        let dim_lines =
            |d: &KernelDecl| canonical(d).lines().filter(|l| l.starts_with("dim ")).collect::<Vec<_>>().join("\n");
        assert_eq!(dim_lines(&p.decl), dim_lines(&y));
        assert!(canonical(&y).contains("dim b 16 dynamic also 64 256\n"), "{}", canonical(&y));
        let points = crate::front::points(&p.decl).unwrap();
        let at: Vec<Vec<(String, u64)>> = points.iter().map(|p| p.at.clone()).collect();
        assert_eq!(at, [vec![("b".to_string(), 64)], vec![("b".to_string(), 256)]]);
        assert_eq!(points[1].label(), "b=256");
        assert_eq!(points[1].suffix(), "b256");
        let b = points[1].graph.dims.find("b").unwrap();
        assert_eq!(points[1].graph.dims.get(b).value, 256);
        assert!(points[1].graph.dims.get(b).dynamic);
        // Without extents to plan for, the fingerprint is what it always was.
        let mut plain = p.decl;
        plain.dims[0].also.clear();
        assert!(!canonical(&plain).contains("also"));
        assert!(crate::front::points(&plain).unwrap().is_empty());
        // Two dims: every combination but the declared one, the last dim fastest.
        let two = "name: attn, dims: { b: dyn 16 | 64, l: dyn 4096 | 512 },
            inputs: { x: f16[b, l] }, outputs: { y: f16[b, l] }, body: { y = exp(x) }";
        let p = parse(tokens(two)).unwrap();
        let labels: Vec<String> = crate::front::points(&p.decl).unwrap().iter().map(|p| p.label()).collect();
        assert_eq!(labels, ["l=512", "b=64", "b=64, l=512"]);
    }

    #[test]
    fn serving_declarations_lower_like_the_yaml_form() {
        // A paged decode with a page size, the last page's length, a runtime scale, grouped
        // heads and two outputs; a ragged, causal prefill.
        let inline = "name: decode,
            dims: { b: dyn 16, pages: dyn 1024, entries: dyn 512, page: 64, g: 8, r: 4, d: 128,
                    l: paged(indices = idx, indptr = ptr, page_size = page, last_page_len = last) 2048 },
            inputs: { q: bf16[b, g, r, d] as [b, (g r), d], k: bf16[b, g, l, d] as [pages, page, g, d],
                      ptr: i32[b + 1], idx: i32[entries], last: i32[b], scale: f32[] },
            outputs: { o: bf16[b, g, r, d] as [b, (g r), d], lse: f32[b, g, r, 1] as [b, (g r)] },
            body: { s = matmul(q, transpose(k)) * scale
                    o = matmul(softmax(s), k)
                    lse = log(sum(exp(s), axis=-1)) }";
        let yaml = "kernels:\n  - name: decode\n    dims:\n      b: { value: 16, dynamic: true }\n      \
                    pages: { value: 1024, dynamic: true }\n      entries: { value: 512, dynamic: true }\n      \
                    page: 64\n      g: 8\n      r: 4\n      d: 128\n      l: { value: 2048, paged: { indices: idx, \
                    indptr: ptr, page_size: page, last_page_len: last } }\n    inputs:\n      \
                    q: \"bf16[b, g, r, d] as [b, (g r), d]\"\n      k: \"bf16[b, g, l, d] as [pages, page, g, d]\"\n      \
                    ptr: \"i32[b + 1]\"\n      idx: \"i32[entries]\"\n      last: \"i32[b]\"\n      \
                    scale: \"f32[]\"\n    outputs:\n      o: \"bf16[b, g, r, d] as [b, (g r), d]\"\n      \
                    lse: \"f32[b, g, r, 1] as [b, (g r)]\"\n    body: |\n      s = matmul(q, transpose(k)) * scale\n      \
                    o = matmul(softmax(s), k)\n      lse = log(sum(exp(s), axis=-1))\n";
        let prefill = "name: prefill,
            dims: { b: dyn 8, total: dyn 4096, h: 4, d: 64, s: ragged(qo) 512, l: ragged(kv) 512 },
            inputs: { q: f16[b, h, s, d] as [total, h, d], k: f16[b, h, l, d] as [total, h, d],
                      qo: i32[b + 1], kv: i32[b + 1] },
            outputs: { o: f16[b, h, s, d] as [total, h, d] },
            body: { o = matmul(softmax(causal(matmul(q, transpose(k)), diagonal=-1)), k) }";
        let p = parse(tokens(inline)).unwrap();
        let g = lower(&p.decl).unwrap();
        let m = crate::front::check_source(yaml.as_bytes()).unwrap();
        let y = &m.kernels[0].1;
        assert_eq!(y.listing(), g.listing());
        let shape = |g: &crate::graph::ValidGraph| -> Vec<String> {
            let decls = g.inputs.iter().map(|t| &t.decl).chain(g.outputs.iter().map(|t| &t.decl));
            decls.map(|d| format!("{:?} {:?}", d.dtype, d.layout)).collect()
        };
        assert_eq!(shape(y), shape(&g));
        assert!(g.dims.iter().any(|(_, d)| d.per_request.is_some()));
        let g = lower(&parse(tokens(prefill)).unwrap().decl).unwrap();
        assert!(g.listing().contains("causal(") && g.listing().contains("diagonal=-1"), "{}", g.listing());
        assert_eq!(g.dims.iter().filter(|(_, d)| d.per_request.is_some()).count(), 2);
    }

    #[test]
    fn diagnostics_map_to_the_offending_token() {
        // An unknown function inside the body: the error names it and points at it.
        let src = SWIGLU.replace("silu(", "frobnicate(");
        let p = parse(tokens(&src)).unwrap();
        let d = lower(&p.decl).unwrap_err();
        assert!(d.message.contains("frobnicate"), "{}", d.message);
        let span = p.spans.span(d.pos);
        assert_eq!(span.source_text().as_deref(), Some("frobnicate"));

        // An undeclared dim in a shape.
        let src = SWIGLU.replace("y: f16[t, f]", "y: f16[t, g]");
        let p = parse(tokens(&src)).unwrap();
        let d = lower(&p.decl).unwrap_err();
        assert_eq!(p.spans.span(d.pos).source_text().as_deref(), Some("g"), "{}", d.message);

        // A bad dtype.
        let src = SWIGLU.replace("w2: f16", "w2: f64");
        let p = parse(tokens(&src)).unwrap();
        let d = lower(&p.decl).unwrap_err();
        assert_eq!(p.spans.span(d.pos).source_text().as_deref(), Some("f64"), "{}", d.message);
    }

    #[test]
    fn syntax_errors_point_at_tokens() {
        let err = |src: &str| parse(tokens(src)).unwrap_err().to_string();
        assert!(err(&SWIGLU.replace("name: swiglu,", "")).contains("missing `name"));
        assert!(err(&SWIGLU.replace("outputs", "outptus")).contains("unknown field `outptus`"));
        assert!(err(&format!("{SWIGLU}, name: again")).contains("given twice"));
        assert!(err(&SWIGLU.replace("dyn 256", "dyn")).contains("representative extent"));
        assert!(err(&SWIGLU.replace("f16[t, k]", "f16(t, k)")).contains("must look like"));
        assert!(err(&SWIGLU.replace("matmul(x, w2)", "x[0]")).contains("not part of the body language"));
    }

    #[test]
    fn fingerprints_ignore_positions_and_spacing_but_not_content() {
        let a = parse(tokens(SWIGLU)).unwrap().decl;
        let spaced = SWIGLU.replace("silu(matmul(x, w1))", "silu( matmul( x,w1 ) )");
        let b = parse(tokens(&format!("\n\n{spaced}"))).unwrap().decl;
        assert_eq!(fingerprint(&a), fingerprint(&b));
        let c = parse(tokens(&SWIGLU.replace("256", "512"))).unwrap().decl;
        assert_ne!(fingerprint(&a), fingerprint(&c));
        assert_eq!(reference(&tokens("attention")).map(|i| i.to_string()).as_deref(), Some("attention"));
        assert!(reference(&tokens(SWIGLU)).is_none());
    }
}
