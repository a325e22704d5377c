//! Macro input to a checked request: which kernel module to include, or what is wrong and
//! where.

use cleave_core::front::tokens::{self, Parsed, SpanMap};
use cleave_core::front::{lower, KernelDecl, Pos};
use proc_macro2::{Ident, TokenStream, TokenTree};

/// What a `kernel!` invocation asks for.
pub(crate) enum KernelRequest {
    /// `kernel!(name)`: a kernel of the YAML files.
    Reference(Ident),
    /// A valid inline declaration.
    Inline {
        /// The declaration.
        decl: KernelDecl,
        /// The name, with the span it was written with.
        name: Ident,
    },
    /// An invalid invocation.
    Invalid {
        /// What is wrong, at the offending token.
        error: syn::Error,
        /// The module name, when it could be found, for a stub module.
        name: Option<Ident>,
        /// The declaration, when it parsed, for a stub with its signatures.
        decl: Option<KernelDecl>,
    },
}

/// Reads a `kernel!` invocation: the one-identifier reference form, or an inline declaration
/// checked by the shared front end, whose diagnostics are mapped back to token spans.
pub(crate) fn kernel(input: TokenStream) -> KernelRequest {
    if let Some(name) = tokens::reference(&input) {
        return KernelRequest::Reference(name);
    }
    let name = find_name(&input);
    let Parsed { decl, spans } = match tokens::parse(input) {
        Ok(p) => p,
        Err(error) => return KernelRequest::Invalid { error, name, decl: None },
    };
    match lower(&decl) {
        Ok(_) => {
            let name = name.unwrap_or_else(|| Ident::new(&decl.name, spans.whole()));
            KernelRequest::Inline { decl, name }
        }
        Err(diag) => {
            let error = located(&spans, diag.pos, &diag.message);
            // A declaration whose name is not an identifier Rust accepts gets no stub.
            let name = name.filter(|n| cleave_core::front::check_ident(&n.to_string()).is_none());
            KernelRequest::Invalid { error, name, decl: Some(decl) }
        }
    }
}

/// The error at the token `pos` maps to. The front end refers to an earlier item as
/// `(first at LINE:COL)`, which for tokens is a synthetic position: that part becomes a second
/// error pointing at the earlier token instead.
fn located(spans: &SpanMap, pos: Pos, message: &str) -> syn::Error {
    let earlier = message.find(" (first at ").and_then(|start| {
        let rest = &message[start + " (first at ".len()..];
        let end = rest.find(')')?;
        let (line, col) = rest[..end].split_once(':')?;
        let pos = Pos::new(line.parse().ok()?, col.parse().ok()?);
        Some((start, start + " (first at ".len() + end + 1, pos))
    });
    match earlier {
        Some((start, end, first)) => {
            let mut error = syn::Error::new(spans.span(pos), format!("{}{}", &message[..start], &message[end..]));
            let what = if message.contains("assigned") { "first assigned here" } else { "first declared here" };
            error.combine(syn::Error::new(spans.span(first), what));
            error
        }
        None => syn::Error::new(spans.span(pos), message),
    }
}

/// `name: <ident>` at the top level of an inline declaration, if present.
fn find_name(input: &TokenStream) -> Option<Ident> {
    let tokens: Vec<TokenTree> = input.clone().into_iter().collect();
    tokens.windows(3).find_map(|w| match w {
        [TokenTree::Ident(key), TokenTree::Punct(colon), TokenTree::Ident(name)]
            if key == "name" && colon.as_char() == ':' =>
        {
            Some(name.clone())
        }
        _ => None,
    })
}

/// `include_kernels!()` takes no arguments.
pub(crate) fn include_kernels(input: TokenStream) -> Result<(), syn::Error> {
    match input.into_iter().next() {
        None => Ok(()),
        Some(t) => Err(syn::Error::new(
            t.span(),
            "`include_kernels!()` takes no arguments: the YAML files are given to `cleave::build::Builder::kernels` \
             in build.rs",
        )),
    }
}
