//! Expansion of the crate's own `macro_rules!` macros, so that a `kernel!` written inside one
//! (an engine stamping out head dims and dtypes) is found by the build script too.
//!
//! This is a subset of `macro_rules!`: literal tokens, `$name:fragment` and `$( .. ) sep op`
//! repetitions in matchers and transcribers, the first rule that matches winning. Fragments
//! that are one token (`ident`, `literal`, `lifetime`, `tt`) match exactly as rustc does; the
//! others (`ty`, `expr`, `path`, ..) take the tokens up to what the matcher expects next. An
//! expansion that differs from rustc's can never build a wrong kernel: the macro includes the
//! generated module only when its own tokens have the same fingerprint, and reports the
//! mismatch otherwise.

use std::collections::BTreeMap;

use proc_macro2::{Delimiter, Group, Spacing, TokenStream, TokenTree};

/// How deep macros may expand into one another before the build script gives up (rustc's own
/// limit is much higher; kernels stamped out by macros rarely nest more than twice).
pub(crate) const MAX_DEPTH: usize = 8;

/// One `macro_rules!` definition: its rules, in order.
#[derive(Clone, Debug)]
pub(crate) struct MacroDef {
    rules: Vec<(Vec<Matcher>, TokenStream)>,
}

#[derive(Clone, Debug)]
enum Matcher {
    Token(TokenTree),
    Group(Delimiter, Vec<Matcher>),
    Fragment(String, String),
    Repeat(Vec<Matcher>, Option<TokenTree>, char),
}

#[derive(Clone, Debug)]
enum Binding {
    One(Vec<TokenTree>),
    Many(Vec<BTreeMap<String, Binding>>),
}

impl MacroDef {
    /// Reads the body of `macro_rules! name { .. }`: `(matcher) => { transcriber }` rules
    /// separated by `;`. `None` if it is not of that form.
    pub(crate) fn parse(body: TokenStream) -> Option<MacroDef> {
        let tokens: Vec<TokenTree> = body.into_iter().collect();
        let mut rules = Vec::new();
        let mut i = 0;
        while i < tokens.len() {
            let TokenTree::Group(m) = &tokens[i] else { return None };
            let arrow = matches!(
                (tokens.get(i + 1), tokens.get(i + 2)),
                (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) if a.as_char() == '=' && b.as_char() == '>'
            );
            let Some(TokenTree::Group(t)) = tokens.get(i + 3).filter(|_| arrow) else { return None };
            rules.push((matcher(m.stream())?, t.stream()));
            i += 4;
            if matches!(tokens.get(i), Some(TokenTree::Punct(p)) if p.as_char() == ';') {
                i += 1;
            }
        }
        Some(MacroDef { rules })
    }

    /// The expansion of an invocation with these arguments, by the first rule that matches.
    pub(crate) fn expand(&self, args: TokenStream) -> Option<TokenStream> {
        let input: Vec<TokenTree> = args.into_iter().collect();
        self.rules.iter().find_map(|(m, t)| {
            let mut b = BTreeMap::new();
            let used = match_seq(m, &input, &mut b, None)?;
            (used == input.len()).then(|| transcribe(t.clone(), &b)).flatten()
        })
    }
}

fn is_punct(t: Option<&TokenTree>, c: char) -> bool {
    matches!(t, Some(TokenTree::Punct(p)) if p.as_char() == c)
}

fn matcher(stream: TokenStream) -> Option<Vec<Matcher>> {
    let tokens: Vec<TokenTree> = stream.into_iter().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Punct(p) if p.as_char() == '$' => match tokens.get(i + 1) {
                Some(TokenTree::Ident(name)) if is_punct(tokens.get(i + 2), ':') => {
                    let Some(TokenTree::Ident(kind)) = tokens.get(i + 3) else { return None };
                    out.push(Matcher::Fragment(name.to_string(), kind.to_string()));
                    i += 4;
                }
                Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Parenthesis => {
                    let inner = matcher(g.stream())?;
                    let (sep, op, used) = repetition_tail(&tokens[i + 2..])?;
                    out.push(Matcher::Repeat(inner, sep, op));
                    i += 2 + used;
                }
                _ => return None,
            },
            TokenTree::Group(g) => {
                out.push(Matcher::Group(g.delimiter(), matcher(g.stream())?));
                i += 1;
            }
            t => {
                out.push(Matcher::Token(t.clone()));
                i += 1;
            }
        }
    }
    Some(out)
}

/// The separator and operator after `$( .. )`, and how many tokens they took.
fn repetition_tail(rest: &[TokenTree]) -> Option<(Option<TokenTree>, char, usize)> {
    let op = |t: Option<&TokenTree>| match t {
        Some(TokenTree::Punct(p)) if matches!(p.as_char(), '*' | '+' | '?') => Some(p.as_char()),
        _ => None,
    };
    if let Some(c) = op(rest.first()) {
        return Some((None, c, 1));
    }
    let c = op(rest.get(1))?;
    Some((rest.first().cloned(), c, 2))
}

fn same(a: &TokenTree, b: &TokenTree) -> bool {
    match (a, b) {
        (TokenTree::Ident(x), TokenTree::Ident(y)) => x == y,
        (TokenTree::Punct(x), TokenTree::Punct(y)) => x.as_char() == y.as_char(),
        (TokenTree::Literal(x), TokenTree::Literal(y)) => x.to_string() == y.to_string(),
        _ => false,
    }
}

/// Matches `m` against a prefix of `input`; returns how many tokens it took. `follow` is the
/// token expected after the sequence, which ends a fragment at its end.
fn match_seq(
    m: &[Matcher],
    input: &[TokenTree],
    b: &mut BTreeMap<String, Binding>,
    follow: Option<&TokenTree>,
) -> Option<usize> {
    let mut at = 0;
    for (k, item) in m.iter().enumerate() {
        match item {
            Matcher::Token(t) => {
                if !input.get(at).is_some_and(|x| same(t, x)) {
                    return None;
                }
                at += 1;
            }
            Matcher::Group(d, inner) => {
                let TokenTree::Group(g) = input.get(at)? else { return None };
                if g.delimiter() != *d {
                    return None;
                }
                let sub: Vec<TokenTree> = g.stream().into_iter().collect();
                if match_seq(inner, &sub, b, None)? != sub.len() {
                    return None;
                }
                at += 1;
            }
            Matcher::Fragment(name, kind) => {
                let n = fragment_len(kind, &input[at..], next_token(m, k, follow))?;
                b.insert(name.clone(), Binding::One(input[at..at + n].to_vec()));
                at += n;
            }
            Matcher::Repeat(inner, sep, op) => {
                let mut runs = Vec::new();
                loop {
                    if *op == '?' && runs.len() == 1 {
                        break;
                    }
                    let mut start = at;
                    if !runs.is_empty() {
                        if let Some(s) = sep {
                            if !input.get(at).is_some_and(|x| same(s, x)) {
                                break;
                            }
                            start += 1;
                        }
                    }
                    let mut rb = BTreeMap::new();
                    let after = sep.as_ref().or(next_token(m, k, follow));
                    match match_seq(inner, &input[start.min(input.len())..], &mut rb, after) {
                        Some(n) if n > 0 => {
                            runs.push(rb);
                            at = start + n;
                        }
                        _ => break,
                    }
                }
                if *op == '+' && runs.is_empty() {
                    return None;
                }
                for name in names(inner) {
                    let each = runs
                        .iter()
                        .map(|r| r.get(&name).cloned().map_or_else(BTreeMap::new, |v| [(name.clone(), v)].into()))
                        .collect();
                    b.insert(name, Binding::Many(each));
                }
            }
        }
    }
    Some(at)
}

/// The token the matcher expects right after element `k`: the next element when it is a token,
/// `follow` when `k` is the last.
fn next_token<'a>(m: &'a [Matcher], k: usize, follow: Option<&'a TokenTree>) -> Option<&'a TokenTree> {
    match m.get(k + 1) {
        Some(Matcher::Token(t)) => Some(t),
        Some(_) => None,
        None => follow,
    }
}

fn names(m: &[Matcher]) -> Vec<String> {
    let mut out = Vec::new();
    for item in m {
        match item {
            Matcher::Fragment(n, _) => out.push(n.clone()),
            Matcher::Group(_, inner) | Matcher::Repeat(inner, ..) => out.extend(names(inner)),
            Matcher::Token(_) => {}
        }
    }
    out
}

/// How many tokens a fragment takes at the start of `input`, given the token the matcher
/// expects after it.
fn fragment_len(kind: &str, input: &[TokenTree], stop: Option<&TokenTree>) -> Option<usize> {
    let first = input.first()?;
    match kind {
        "ident" => matches!(first, TokenTree::Ident(_)).then_some(1),
        "tt" => Some(1),
        "literal" => match first {
            TokenTree::Literal(_) => Some(1),
            TokenTree::Punct(p) if p.as_char() == '-' => {
                matches!(input.get(1), Some(TokenTree::Literal(_))).then_some(2)
            }
            TokenTree::Ident(i) if i == "true" || i == "false" => Some(1),
            _ => None,
        },
        "lifetime" => (matches!(first, TokenTree::Punct(p) if p.as_char() == '\'' && p.spacing() == Spacing::Joint)
            && matches!(input.get(1), Some(TokenTree::Ident(_))))
        .then_some(2),
        "block" => matches!(first, TokenTree::Group(g) if g.delimiter() == Delimiter::Brace).then_some(1),
        // The rest: up to the token the matcher expects next, or to a `,`, `;` or `=>`, none
        // of which can stand at the top level of an expression or a type (outside the `<..>`
        // of types and paths).
        _ => {
            let mut angle = 0i32;
            let mut n = 0;
            while n < input.len() {
                let t = &input[n];
                if angle == 0 && stop.is_some_and(|s| same(s, t)) {
                    break;
                }
                let ends = is_punct(Some(t), ',')
                    || is_punct(Some(t), ';')
                    || (is_punct(Some(t), '=') && is_punct(input.get(n + 1), '>'));
                if angle == 0 && ends {
                    break;
                }
                if matches!(kind, "ty" | "path") {
                    if is_punct(Some(t), '<') {
                        angle += 1;
                    } else if is_punct(Some(t), '>') && angle > 0 {
                        angle -= 1;
                    }
                }
                n += 1;
            }
            (n > 0).then_some(n)
        }
    }
}

/// The transcriber with every `$name` and `$( .. )` filled in from the bindings.
fn transcribe(stream: TokenStream, b: &BTreeMap<String, Binding>) -> Option<TokenStream> {
    let tokens: Vec<TokenTree> = stream.into_iter().collect();
    let mut out = TokenStream::new();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Punct(p) if p.as_char() == '$' => match tokens.get(i + 1) {
                Some(TokenTree::Ident(name)) if name == "crate" => {
                    out.extend([TokenTree::Ident(proc_macro2::Ident::new("crate", name.span()))]);
                    i += 2;
                }
                Some(TokenTree::Ident(name)) => {
                    match b.get(&name.to_string()) {
                        Some(Binding::One(ts)) => out.extend(ts.iter().cloned()),
                        // `$crate` and unbound names are copied; a bound repetition outside
                        // its `$( .. )` is an error, as in rustc.
                        Some(Binding::Many(_)) => return None,
                        None => {
                            out.extend([tokens[i].clone(), tokens[i + 1].clone()]);
                        }
                    }
                    i += 2;
                }
                Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Parenthesis => {
                    let (sep, _, used) = repetition_tail(&tokens[i + 2..])?;
                    let inner = g.stream();
                    let used_names: Vec<String> = b
                        .iter()
                        .filter(|(n, v)| matches!(v, Binding::Many(_)) && mentions(&inner, n))
                        .map(|(n, _)| n.clone())
                        .collect();
                    let count = used_names
                        .iter()
                        .filter_map(|n| match b.get(n) {
                            Some(Binding::Many(v)) => Some(v.len()),
                            _ => None,
                        })
                        .max()?;
                    for k in 0..count {
                        if k > 0 {
                            out.extend(sep.clone());
                        }
                        let mut local = b.clone();
                        for n in &used_names {
                            if let Some(Binding::Many(v)) = b.get(n) {
                                let run = v.get(k)?;
                                local.extend(run.clone());
                            }
                        }
                        out.extend(transcribe(inner.clone(), &local)?);
                    }
                    i += 2 + used;
                }
                _ => {
                    out.extend([tokens[i].clone()]);
                    i += 1;
                }
            },
            TokenTree::Group(g) => {
                let mut ng = Group::new(g.delimiter(), transcribe(g.stream(), b)?);
                ng.set_span(g.span());
                out.extend([TokenTree::Group(ng)]);
                i += 1;
            }
            t => {
                out.extend([t.clone()]);
                i += 1;
            }
        }
    }
    Some(out)
}

fn mentions(stream: &TokenStream, name: &str) -> bool {
    let tokens: Vec<TokenTree> = stream.clone().into_iter().collect();
    tokens.iter().enumerate().any(|(i, t)| match t {
        TokenTree::Punct(p) if p.as_char() == '$' => {
            matches!(tokens.get(i + 1), Some(TokenTree::Ident(n)) if n == name)
        }
        TokenTree::Group(g) => mentions(&g.stream(), name),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(text: &str) -> MacroDef {
        MacroDef::parse(text.parse().expect("tokens")).expect("a macro_rules body")
    }

    /// The expansion's text without spaces (how tokens print their spacing is not the point).
    fn expand(d: &MacroDef, args: &str) -> Option<String> {
        d.expand(args.parse().expect("tokens")).map(|t| t.to_string().replace(' ', ""))
    }

    #[test]
    fn fragments_repetitions_and_rule_order_follow_macro_rules() {
        let d = def("(one $x:literal) => { a($x) }; ($($t:ty),+ ; $e:expr) => { $( f::<$t>() );+ ; g($e) }; ($i:ident $(= $v:tt)?) => { $i $(+ $v)? }");
        assert_eq!(expand(&d, "one -2.5").as_deref(), Some("a(-2.5)"));
        assert_eq!(expand(&d, "Vec<u8, A>, f32 ; 1 + 2").as_deref(), Some("f::<Vec<u8,A>>();f::<f32>();g(1+2)"));
        assert_eq!(expand(&d, "x = 3").as_deref(), Some("x+3"));
        assert_eq!(expand(&d, "x").as_deref(), Some("x"));
        // No rule matches: not expanded.
        assert_eq!(expand(&d, "one two"), None);
        assert_eq!(expand(&d, "; 1"), None);
    }

    #[test]
    fn groups_nest_and_crate_paths_stay_paths() {
        let d = def("({ $($k:ident: $v:literal),* }) => { $crate::m!{ $( [$k $v] )* } }");
        assert_eq!(expand(&d, "{ a: 1, b: 2 }").as_deref(), Some("crate::m!{[a1][b2]}"));
        assert!(MacroDef::parse("not a macro".parse().expect("tokens")).is_none());
    }
}
