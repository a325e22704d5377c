//! `kernels.yaml` → [`KernelDecl`]s, keeping the file position of every item.

use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};

use super::decl::{AxisDecl, Body, DimDecl, KernelDecl, PerRequestDecl, StorageAxisDecl, TensorSrc};
use super::diag::{Diagnostic, Pos, PosMap};

fn pos_of(node: &MarkedYaml<'_>) -> Pos {
    let m = node.span.start;
    Pos::new(m.line() as u32, m.col() as u32 + 1)
}

fn describe(node: &MarkedYaml<'_>) -> &'static str {
    match &node.data {
        YamlData::Value(Scalar::Null) => "nothing",
        YamlData::Value(Scalar::Boolean(_)) => "a boolean",
        YamlData::Value(Scalar::Integer(_)) => "an integer",
        YamlData::Value(Scalar::FloatingPoint(_)) => "a number",
        YamlData::Value(Scalar::String(_)) => "a string",
        YamlData::Sequence(_) => "a list",
        YamlData::Mapping(_) => "a mapping",
        _ => "an unsupported YAML value",
    }
}

fn as_str<'a>(node: &'a MarkedYaml<'_>) -> Option<&'a str> {
    match &node.data {
        YamlData::Value(Scalar::String(s)) => Some(s),
        _ => None,
    }
}

type Entries<'a, 'i> = Vec<(&'a MarkedYaml<'i>, &'a MarkedYaml<'i>)>;

/// The entries of a mapping whose keys are all strings, rejecting duplicate keys.
fn mapping<'a, 'i>(node: &'a MarkedYaml<'i>, what: &str) -> Result<Entries<'a, 'i>, Diagnostic> {
    let YamlData::Mapping(map) = &node.data else {
        return Err(Diagnostic::new(pos_of(node), format!("{what} must be a mapping, found {}", describe(node))));
    };
    let mut out: Entries<'a, 'i> = Vec::new();
    for (k, v) in map {
        if as_str(k).is_none() {
            return Err(Diagnostic::new(pos_of(k), format!("keys of {what} must be names, found {}", describe(k))));
        }
        out.push((k, v));
    }
    Ok(out)
}

/// Parses a whole `kernels.yaml`. All kernels are read even when one is malformed, so every
/// error in the file is reported at once.
pub fn parse_yaml(text: &str) -> Result<Vec<KernelDecl>, Vec<Diagnostic>> {
    if text.trim().is_empty() {
        return Err(vec![Diagnostic::new(Pos::start(), "the file is empty: expected a `kernels:` list")]);
    }
    let docs = MarkedYaml::load_from_str(text).map_err(|e| {
        let m = e.marker();
        vec![Diagnostic::new(Pos::new(m.line() as u32, m.col() as u32 + 1), format!("YAML syntax error: {}", e.info()))]
    })?;
    // A file of comments alone loads as no document (or a null one): it is as empty as an
    // empty file.
    let Some(root) = docs.first().filter(|d| !matches!(d.data, YamlData::Value(Scalar::Null))) else {
        return Err(vec![Diagnostic::new(Pos::start(), "the file is empty: expected a `kernels:` list")]);
    };
    if docs.len() > 1 {
        return Err(vec![Diagnostic::new(pos_of(&docs[1]), "expected one YAML document, found several")]);
    }
    let top = mapping(root, "the top level").map_err(|d| vec![d])?;
    let mut kernels_node = None;
    for (k, v) in top {
        match as_str(k) {
            Some("kernels") => kernels_node = Some(v),
            Some(other) => {
                return Err(vec![Diagnostic::new(
                    pos_of(k),
                    format!("unknown top-level key `{other}`; expected `kernels`"),
                )])
            }
            None => unreachable!("mapping() checked the keys"),
        }
    }
    let Some(list) = kernels_node else {
        return Err(vec![Diagnostic::new(pos_of(root), "missing the `kernels:` list")]);
    };
    let YamlData::Sequence(items) = &list.data else {
        return Err(vec![Diagnostic::new(pos_of(list), format!("`kernels` must be a list, found {}", describe(list)))]);
    };
    let mut decls = Vec::new();
    let mut errors = Vec::new();
    let file = FileIndex::new(text);
    for item in items {
        match kernel(item, &file) {
            Ok(d) => decls.push(d),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(decls)
    } else {
        Err(errors)
    }
}

/// The file's lines and character offsets, computed once: looking them up per kernel keeps
/// checking linear in the file's size.
struct FileIndex<'t> {
    text: &'t str,
    lines: Vec<&'t str>,
    /// Byte offset of every character, for files that are not ASCII (where the YAML markers'
    /// character indices are not byte offsets); empty for ASCII files.
    char_bytes: Vec<usize>,
}

impl<'t> FileIndex<'t> {
    fn new(text: &'t str) -> Self {
        let char_bytes = if text.is_ascii() { Vec::new() } else { text.char_indices().map(|(b, _)| b).collect() };
        FileIndex { text, lines: text.lines().collect(), char_bytes }
    }

    /// Up to `n` characters from character index `at`.
    fn chars_at(&self, at: usize, n: usize) -> &'t str {
        let byte = |c: usize| -> usize {
            if self.char_bytes.is_empty() {
                c.min(self.text.len())
            } else {
                self.char_bytes.get(c).copied().unwrap_or(self.text.len())
            }
        };
        &self.text[byte(at)..byte(at.saturating_add(n))]
    }
}

fn kernel(node: &MarkedYaml<'_>, text: &FileIndex<'_>) -> Result<KernelDecl, Diagnostic> {
    let entries = mapping(node, "a kernel")?;
    let mut name = None;
    let mut dims = None;
    let mut inputs = None;
    let mut outputs = None;
    let mut body = None;
    for (k, v) in &entries {
        let slot = match as_str(k) {
            Some("name") => &mut name,
            Some("dims") => &mut dims,
            Some("inputs") => &mut inputs,
            Some("outputs") => &mut outputs,
            Some("body") => &mut body,
            Some(other) => {
                return Err(Diagnostic::new(
                    pos_of(k),
                    format!("unknown kernel key `{other}`; expected one of name, dims, inputs, outputs, body"),
                ))
            }
            None => unreachable!(),
        };
        *slot = Some(*v);
    }
    let at = pos_of(node);
    let missing = |key: &str| Diagnostic::new(at, format!("kernel is missing `{key}:`"));
    let name_node = name.ok_or_else(|| missing("name"))?;
    let name = match &name_node.data {
        YamlData::Value(Scalar::String(s)) => s.to_string(),
        _ => {
            return Err(Diagnostic::new(
                pos_of(name_node),
                format!("the kernel name must be an identifier, found {}", describe(name_node)),
            ))
        }
    };
    let dims = dim_list(dims.ok_or_else(|| missing("dims"))?)?;
    let inputs = tensor_list(inputs.ok_or_else(|| missing("inputs"))?, "inputs", true)?;
    let outputs = tensor_list(outputs.ok_or_else(|| missing("outputs"))?, "outputs", false)?;
    let body_node = body.ok_or_else(|| missing("body"))?;
    let Some(body_text) = as_str(body_node) else {
        return Err(Diagnostic::new(
            pos_of(body_node),
            format!("`body` must be text (one assignment per line), found {}", describe(body_node)),
        ));
    };
    let body = Body { text: body_text.to_string(), map: body_map(body_node, body_text, text) };
    Ok(KernelDecl { name, name_pos: pos_of(name_node), pos: at, dims, inputs, outputs, body })
}

/// Locates the characters of a string scalar in the file. Literal blocks (`|`) and plain
/// single-line scalars map exactly; quoted scalars map past their opening quote; anything else
/// (folded blocks) maps to the scalar's first position.
fn body_map(node: &MarkedYaml<'_>, value: &str, file: &FileIndex<'_>) -> PosMap {
    let start = pos_of(node);
    let index = node.span.start.index();
    // The marker counts characters; slice by characters to be safe with non-ASCII input.
    let raw = file.chars_at(index, value.len() + 2);
    if raw.starts_with('"') || raw.starts_with('\'') {
        return if value.contains('\n') {
            PosMap::single(start)
        } else {
            PosMap::from_lines(vec![(0, Pos::new(start.line, start.col + 1))])
        };
    }
    let file_lines = &file.lines;
    let body_lines: Vec<&str> = value.split('\n').collect();
    let col0 = start.col as usize - 1;
    let fits = body_lines.iter().enumerate().all(|(i, line)| {
        let Some(fl) = file_lines.get(start.line as usize - 1 + i) else {
            return line.is_empty();
        };
        let fl: Vec<char> = fl.chars().collect();
        let tail: String = fl.iter().skip(col0).collect();
        line.is_empty() || tail.trim_end() == line.trim_end()
    });
    if fits {
        PosMap::block(value, start)
    } else {
        PosMap::single(start)
    }
}

fn dim_list(node: &MarkedYaml<'_>) -> Result<Vec<DimDecl>, Diagnostic> {
    let mut out = Vec::new();
    for (k, v) in mapping(node, "`dims`")? {
        let name = as_str(k).unwrap_or_default().to_string();
        let pos = pos_of(k);
        let (value_node, dynamic, per_request, also) = match &v.data {
            YamlData::Mapping(_) => {
                let mut value = None;
                let mut dynamic = false;
                let mut per_request = None;
                let mut also = Vec::new();
                for (mk, mv) in mapping(v, &format!("dim `{name}`"))? {
                    match as_str(mk) {
                        Some("value") => value = Some(mv),
                        Some("dynamic") => match &mv.data {
                            YamlData::Value(Scalar::Boolean(b)) => dynamic = *b,
                            _ => {
                                return Err(Diagnostic::new(
                                    pos_of(mv),
                                    format!("`dynamic` of dim `{name}` must be true or false, found {}", describe(mv)),
                                ))
                            }
                        },
                        Some("also") => also = also_list(mv, &name)?,
                        Some(key @ ("ragged" | "paged")) => {
                            if per_request.is_some() {
                                return Err(Diagnostic::new(
                                    pos_of(mk),
                                    format!("dim `{name}` is declared both ragged and paged; it is one or the other"),
                                ));
                            }
                            per_request = Some(if key == "ragged" {
                                ragged_decl(mk, mv, &name)?
                            } else {
                                paged_decl(mk, mv, &name)?
                            });
                        }
                        Some(other) => {
                            return Err(Diagnostic::new(
                                pos_of(mk),
                                format!(
                                    "unknown key `{other}` in dim `{name}`; expected `value`, `dynamic`, `also`, `ragged` or `paged`"
                                ),
                            ))
                        }
                        None => unreachable!(),
                    }
                }
                let value = value.ok_or_else(|| {
                    Diagnostic::new(pos_of(v), format!("dim `{name}` is missing `value:` (its representative size)"))
                })?;
                (value, dynamic, per_request, also)
            }
            _ => (v, false, None, Vec::new()),
        };
        let value = extent(value_node, &name)?;
        out.push(DimDecl { name, pos, value, value_pos: pos_of(value_node), dynamic, per_request, also });
    }
    Ok(out)
}

/// A dim's extent as written: an integer (a float with no fraction is one too), not yet
/// range-checked.
fn extent(node: &MarkedYaml<'_>, name: &str) -> Result<i128, Diagnostic> {
    match &node.data {
        YamlData::Value(Scalar::Integer(i)) => Ok(i128::from(*i)),
        YamlData::Value(Scalar::FloatingPoint(f)) if f.fract() == 0.0 && f.abs() < 1e30 => Ok(f.into_inner() as i128),
        _ => Err(Diagnostic::new(
            pos_of(node),
            format!("dim `{name}` must be a positive integer, found {}", describe(node)),
        )),
    }
}

/// `also: [64, 256]`: more extents of a dynamic dim to plan for, each with its position.
fn also_list(node: &MarkedYaml<'_>, name: &str) -> Result<Vec<(i128, Pos)>, Diagnostic> {
    match &node.data {
        YamlData::Sequence(items) => items.iter().map(|i| Ok((extent(i, name)?, pos_of(i)))).collect(),
        _ => Err(Diagnostic::new(
            pos_of(node),
            format!(
                "`also` of dim `{name}` must be a list of extents, e.g. `also: [64, 256]`, found {}",
                describe(node)
            ),
        )),
    }
}

/// A name given as a YAML scalar (a string, or an integer where a page size may be one).
fn name_of(node: &MarkedYaml<'_>, integer_ok: bool) -> Option<AxisDecl> {
    match &node.data {
        YamlData::Value(Scalar::String(s)) => Some(AxisDecl { name: s.trim().to_string(), pos: pos_of(node) }),
        YamlData::Value(Scalar::Integer(i)) if integer_ok => Some(AxisDecl { name: i.to_string(), pos: pos_of(node) }),
        _ => None,
    }
}

/// `ragged: indptr`.
fn ragged_decl(key: &MarkedYaml<'_>, v: &MarkedYaml<'_>, dim: &str) -> Result<PerRequestDecl, Diagnostic> {
    let Some(indptr) = name_of(v, false) else {
        return Err(Diagnostic::new(
            pos_of(v),
            format!(
                "`ragged` of dim `{dim}` names the `i32[batch + 1]` tensor that packs it (`ragged: qo_indptr`), found {}",
                describe(v)
            ),
        ));
    };
    if indptr.name.is_empty() {
        return Err(Diagnostic::new(pos_of(v), format!("ragged dim `{dim}` has no `indptr` tensor")));
    }
    Ok(PerRequestDecl::Ragged { pos: pos_of(key), indptr })
}

/// `paged: { indices: .., indptr: .., page_size: .., last_page_len: .. }`.
fn paged_decl(key: &MarkedYaml<'_>, v: &MarkedYaml<'_>, dim: &str) -> Result<PerRequestDecl, Diagnostic> {
    let (mut indices, mut indptr, mut page_size, mut last_page_len) = (None, None, None, None);
    for (mk, mv) in mapping(v, &format!("`paged` of dim `{dim}`"))? {
        let k = as_str(mk).unwrap_or_default();
        let slot = match k {
            "indices" => &mut indices,
            "indptr" => &mut indptr,
            "page_size" => &mut page_size,
            "last_page_len" => &mut last_page_len,
            other => {
                return Err(Diagnostic::new(
                    pos_of(mk),
                    format!(
                    "unknown key `{other}` in `paged` of dim `{dim}`; expected `indices`, `indptr`, `page_size` and \
                         optionally `last_page_len`"
                ),
                ))
            }
        };
        let Some(name) = name_of(mv, k == "page_size") else {
            let want = if k == "page_size" { "a dim name or a positive integer" } else { "a tensor name" };
            return Err(Diagnostic::new(
                pos_of(mv),
                format!("`{k}` in `paged` of dim `{dim}` must be {want}, found {}", describe(mv)),
            ));
        };
        *slot = Some(name);
    }
    Ok(PerRequestDecl::Paged { pos: pos_of(key), indices, indptr, page_size, last_page_len })
}

fn tensor_list(node: &MarkedYaml<'_>, what: &str, allow_reduce: bool) -> Result<Vec<TensorSrc>, Diagnostic> {
    let mut out = Vec::new();
    for (k, v) in mapping(node, &format!("`{what}`"))? {
        let name = as_str(k).unwrap_or_default().to_string();
        let pos = pos_of(k);
        let (ty_node, reduce) = match &v.data {
            YamlData::Mapping(_) => {
                let mut ty = None;
                let mut reduce = None;
                for (mk, mv) in mapping(v, &format!("`{name}`"))? {
                    match as_str(mk) {
                        Some("type") => ty = Some(mv),
                        Some("reduce") if allow_reduce => reduce = Some(reduce_list(mv, &name)?),
                        Some(other) => {
                            let expected = if allow_reduce { "`type` and `reduce`" } else { "`type`" };
                            return Err(Diagnostic::new(
                                pos_of(mk),
                                format!("unknown key `{other}` in `{name}`; expected {expected}"),
                            ));
                        }
                        None => unreachable!(),
                    }
                }
                let ty = ty.ok_or_else(|| Diagnostic::new(pos_of(v), format!("`{name}` is missing `type:`")))?;
                (ty, reduce)
            }
            _ => (v, None),
        };
        let Some(ty) = as_str(ty_node) else {
            return Err(Diagnostic::new(
                pos_of(ty_node),
                format!("the type of `{name}` must look like `f16[h, s, d]`, found {}", describe(ty_node)),
            ));
        };
        let (dtype, dtype_pos, shape, storage) = parse_tensor_type(ty, pos_of(ty_node))?;
        out.push(TensorSrc { name, pos, dtype, dtype_pos, shape, reduce, storage });
    }
    Ok(out)
}

fn reduce_list(node: &MarkedYaml<'_>, tensor: &str) -> Result<Vec<AxisDecl>, Diagnostic> {
    let YamlData::Sequence(items) = &node.data else {
        return Err(Diagnostic::new(
            pos_of(node),
            format!("`reduce` of `{tensor}` must be a list of dim names, found {}", describe(node)),
        ));
    };
    items
        .iter()
        .map(|it| match as_str(it) {
            Some(s) => Ok(AxisDecl { name: s.to_string(), pos: pos_of(it) }),
            None => {
                Err(Diagnostic::new(pos_of(it), format!("`reduce` entries must be dim names, found {}", describe(it))))
            }
        })
        .collect()
}

/// A parsed tensor type: the dtype, its position, the shape's axes and the storage's, if an
/// `as [..]` clause gives one.
pub type TensorType = (String, Pos, Vec<AxisDecl>, Option<Vec<StorageAxisDecl>>);

/// Parses `f16[h, s, d]`, or `bf16[b, g, r, d] as [b, (g r), d]`, written at `at`; positions of
/// parts are offsets from `at`.
pub fn parse_tensor_type(ty: &str, at: Pos) -> Result<TensorType, Diagnostic> {
    let col = |off: usize| Pos::new(at.line, at.col + ty[..off].chars().count() as u32);
    let lead = ty.len() - ty.trim_start().len();
    let Some(open) = ty.find('[') else {
        return Err(Diagnostic::new(at, format!("expected a tensor type like `f16[h, s, d]`, found `{ty}`")));
    };
    let dtype = ty[..open].trim().to_string();
    let Some(close) = ty[open..].find(']').map(|c| open + c) else {
        return Err(Diagnostic::new(col(ty.len()), format!("expected `]` to close the shape of `{ty}`")));
    };
    let inner = &ty[open + 1..close];
    let mut shape = Vec::new();
    if !inner.trim().is_empty() {
        let mut off = open + 1;
        for part in inner.split(',') {
            let trimmed = part.trim();
            let lead_ws = part.len() - part.trim_start().len();
            if trimmed.is_empty() {
                return Err(Diagnostic::new(col(off + lead_ws), format!("empty axis in the shape of `{ty}`")));
            }
            shape.push(AxisDecl { name: trimmed.to_string(), pos: col(off + lead_ws) });
            off += part.len() + 1;
        }
    }
    let rest = &ty[close + 1..];
    if rest.trim().is_empty() {
        return Ok((dtype, col(lead), shape, None));
    }
    let rest_at = close + 1 + (rest.len() - rest.trim_start().len());
    let after_as =
        rest.trim_start().strip_prefix("as").filter(|r| r.starts_with(|c: char| c.is_whitespace() || c == '['));
    let Some(after_as) = after_as else {
        return Err(Diagnostic::new(
            col(rest_at),
            format!("expected `as [..]` (the buffer's axes) or nothing after the shape of `{ty}`"),
        ));
    };
    let sopen = ty.len() - after_as.trim_start().len();
    if !ty[sopen..].starts_with('[') || !ty.trim_end().ends_with(']') {
        return Err(Diagnostic::new(
            col(sopen.min(ty.len())),
            format!("the storage of `{ty}` must be a bracketed list of axes, e.g. `as [b, (g r), d]`"),
        ));
    }
    let sclose = ty.trim_end().len() - 1;
    let body = &ty[sopen + 1..sclose];
    let mut storage = Vec::new();
    let mut off = sopen + 1;
    for part in split_top_commas(body) {
        let trimmed = part.trim();
        let lead_ws = part.len() - part.trim_start().len();
        let at_part = col(off + lead_ws);
        if trimmed.is_empty() {
            return Err(Diagnostic::new(at_part, format!("empty axis in the storage of `{ty}`")));
        }
        let (grouped, names_text, names_off) = match trimmed.strip_prefix('(') {
            Some(g) => match g.strip_suffix(')') {
                Some(names) => (true, names, off + lead_ws + 1),
                None => {
                    return Err(Diagnostic::new(at_part, format!("unclosed `(` in the storage of `{ty}`")));
                }
            },
            None => (false, trimmed, off + lead_ws),
        };
        let mut names = Vec::new();
        let mut noff = names_off;
        for word in names_text.split(' ') {
            if !word.is_empty() {
                if word.contains(['(', ')', '[', ']']) {
                    return Err(Diagnostic::new(
                        col(noff),
                        format!("`{word}` in the storage of `{ty}`: a storage axis is a dim, `1` or `(a b ..)`"),
                    ));
                }
                names.push(AxisDecl { name: word.to_string(), pos: col(noff) });
            }
            noff += word.len() + 1;
        }
        if names.is_empty() {
            return Err(Diagnostic::new(at_part, format!("empty `()` in the storage of `{ty}`")));
        }
        if !grouped && names.len() > 1 {
            return Err(Diagnostic::new(
                at_part,
                format!("`{trimmed}` in the storage of `{ty}`: write several dims of one axis as `({trimmed})`"),
            ));
        }
        storage.push(StorageAxisDecl { names, grouped, pos: at_part });
        off += part.len() + 1;
    }
    Ok((dtype, col(lead), shape, Some(storage)))
}

/// Splits at commas outside parentheses.
fn split_top_commas(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    if out.len() == 1 && out[0].trim().is_empty() {
        out.clear();
    }
    out
}
