//! Requests to tokens: an `include!` of the module the build script generated, or a
//! `compile_error!` with a stub module that keeps the rest of the crate type-checking.

use std::path::{Path, PathBuf};

use cleave_core::front::tokens::fingerprint;
use cleave_core::front::KernelDecl;
use proc_macro2::{Ident, Span, TokenStream};
use quote::quote;

use crate::parse::KernelRequest;

/// What to add to build.rs, for every message that asks for it.
const BUILD_RS: &str = "add `cleave` to [build-dependencies] and a build.rs with `fn main() -> Result<(), Box<dyn \
                        std::error::Error>> { cleave::build::Builder::new().kernels(\"kernels.yaml\").compile()?; \
                        Ok(()) }`";

/// Where the build script's output is, as the compiler invocation of this crate sees it.
pub(crate) struct BuildOutput {
    /// `OUT_DIR`, set by Cargo only for crates with a build script.
    out_dir: Option<PathBuf>,
}

impl BuildOutput {
    pub(crate) fn from_env() -> Self {
        BuildOutput { out_dir: std::env::var_os("OUT_DIR").map(PathBuf::from) }
    }

    /// `OUT_DIR/cleave`, or why there is none.
    fn dir(&self) -> Result<PathBuf, String> {
        let Some(out) = &self.out_dir else {
            return Err(format!("this crate has no build script, so cleave generated no kernels: {BUILD_RS}"));
        };
        let dir = out.join("cleave");
        if dir.join("kernels.rs").is_file() {
            Ok(dir)
        } else {
            Err(format!(
                "the build script did not run `cleave::build::Builder` (nothing under OUT_DIR/cleave): {BUILD_RS}"
            ))
        }
    }
}

/// The tokens for a `kernel!` request.
pub(crate) fn kernel(request: KernelRequest, build: &BuildOutput) -> TokenStream {
    match request {
        KernelRequest::Reference(name) => reference(&name, build),
        KernelRequest::Inline { decl, name } => inline(&decl, &name, build),
        KernelRequest::Invalid { error, name, decl } => {
            let error = error.to_compile_error();
            let stub = name.map(|n| stub(&n, decl.as_ref())).unwrap_or_default();
            quote! { #error #stub }
        }
    }
}

fn include(relative: &str) -> TokenStream {
    let path = format!("/cleave/{relative}");
    quote! { include!(concat!(env!("OUT_DIR"), #path)); }
}

fn fail(span: Span, message: &str, stub: &TokenStream) -> TokenStream {
    let error = syn::Error::new(span, format!("cleave: {message}")).to_compile_error();
    quote! { #error #stub }
}

fn reference(name: &Ident, build: &BuildOutput) -> TokenStream {
    let dir = match build.dir() {
        Ok(d) => d,
        Err(message) => return fail(name.span(), &message, &stub(name, None)),
    };
    let file = format!("yaml/{name}.rs");
    if dir.join(&file).is_file() {
        return include(&file);
    }
    let known = yaml_kernels(&dir);
    let known = if known.is_empty() {
        "the build script was given no YAML kernels (`Builder::kernels(\"kernels.yaml\")`)".to_string()
    } else {
        format!("the YAML files declare {}", known.join(", "))
    };
    fail(name.span(), &format!("no kernel `{name}` in the YAML files: {known}"), &stub(name, None))
}

/// The kernel names the build script generated from YAML, sorted.
fn yaml_kernels(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("yaml"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".rs")).map(|n| format!("`{n}`")))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn inline(decl: &KernelDecl, name: &Ident, build: &BuildOutput) -> TokenStream {
    let dir = match build.dir() {
        Ok(d) => d,
        Err(message) => return fail(name.span(), &message, &stub(name, Some(decl))),
    };
    let file = format!("inline/{}-{}.rs", decl.name, fingerprint(decl));
    if dir.join(&file).is_file() {
        return include(&file);
    }
    let prefix = format!("{}-", decl.name);
    let generated_other = std::fs::read_dir(dir.join("inline"))
        .map(|entries| entries.flatten().any(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix))))
        .unwrap_or(false);
    let message = if generated_other {
        format!(
            "the build script generated inline kernel `{name}` from a different version of this declaration; it reruns \
             when a scanned file changes, so this declaration is probably outside `src/`: add \
             `.scan(\"path/to/this/file.rs\")` to the `cleave::build::Builder` in build.rs"
        )
    } else {
        format!(
            "the build script did not generate inline kernel `{name}`: it scans `src/**/*.rs` (unless \
             `.scan_sources(false)`); for a declaration elsewhere add `.scan(\"path/to/this/file.rs\")` to the \
             `cleave::build::Builder` in build.rs"
        )
    };
    fail(name.span(), &message, &stub(name, Some(decl)))
}

/// The tokens for `include_kernels!()`.
pub(crate) fn include_kernels(args: Result<(), syn::Error>, build: &BuildOutput) -> TokenStream {
    let empty = quote! {
        /// Kernels generated by cleave from the YAML declarations (none: see the error above).
        #[allow(unreachable_pub)]
        pub mod kernels {}
    };
    if let Err(e) = args {
        let error = e.to_compile_error();
        return quote! { #error #empty };
    }
    match build.dir() {
        Ok(_) => {
            let body = include("kernels.rs");
            quote! {
                /// Kernels generated by cleave from the YAML declarations given to the build script.
                #[allow(unreachable_pub)]
                pub mod kernels { #body }
            }
        }
        Err(message) => fail(Span::call_site(), &message, &empty),
    }
}

/// A module with the declared signatures whose functions return `Error::NotBuilt`, or an empty
/// module when the declaration is not known well enough.
fn stub(name: &Ident, decl: Option<&KernelDecl>) -> TokenStream {
    let body = decl.and_then(stub_items).unwrap_or_default();
    quote! {
        #[allow(dead_code, unused_variables, unreachable_pub, unused_qualifications, non_snake_case, clippy::all)]
        pub mod #name { #body }
    }
}

fn stub_items(decl: &KernelDecl) -> Option<TokenStream> {
    let ty = |dtype: &str| -> Option<TokenStream> {
        match dtype {
            "f16" => Some(quote!(::cleave::runtime::f16)),
            "bf16" => Some(quote!(::cleave::runtime::bf16)),
            "f32" => Some(quote!(f32)),
            _ => None,
        }
    };
    let dims: Vec<Ident> =
        decl.dims.iter().filter(|d| d.dynamic).map(|d| syn::parse_str::<Ident>(&d.name).ok()).collect::<Option<_>>()?;
    let inputs: Vec<TokenStream> = decl.inputs.iter().map(|t| ty(&t.dtype)).collect::<Option<_>>()?;
    let outputs: Vec<TokenStream> = decl.outputs.iter().map(|t| ty(&t.dtype)).collect::<Option<_>>()?;
    let kernel = &decl.name;
    let driver = quote!(::cleave::runtime::cudarc::driver);
    let not_built = quote! {
        ::core::result::Result::Err(::cleave::Error::NotBuilt { kernel: #kernel })
    };
    Some(quote! {
        /// The extents of the dynamic axes.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct Dims { #(pub #dims: usize,)* }
        /// Not built: see the error at the declaration.
        pub fn launch(
            _: &::std::sync::Arc<#driver::CudaStream>,
            #(_: &impl #driver::DevicePtr<#inputs>,)*
            #(_: &mut impl #driver::DevicePtrMut<#outputs>,)*
            _: Dims,
        ) -> ::core::result::Result<(), ::cleave::Error> {
            #not_built
        }
        /// Not built: see the error at the declaration.
        pub fn workspace_bytes(_: Dims) -> ::core::result::Result<u64, ::cleave::Error> {
            #not_built
        }
        /// Not built: see the error at the declaration.
        #[derive(Debug, Clone)]
        pub struct Kernel(());
        /// Not built: see the error at the declaration.
        pub fn load(
            _: &::std::sync::Arc<#driver::CudaContext>,
        ) -> ::core::result::Result<Kernel, ::cleave::Error> {
            #not_built
        }
        impl Kernel {
            /// Not built: see the error at the declaration.
            pub fn launch(
                &self,
                _: &::std::sync::Arc<#driver::CudaStream>,
                #(_: &impl #driver::DevicePtr<#inputs>,)*
                #(_: &mut impl #driver::DevicePtrMut<#outputs>,)*
                _: &mut ::cleave::runtime::cuda::Workspace,
                _: Dims,
            ) -> ::core::result::Result<(), ::cleave::Error> {
                #not_built
            }
        }
        /// Not built: see the error at the declaration.
        pub fn run_host(
            #(_: &[#inputs],)*
            #(_: &mut [#outputs],)*
            _: Dims,
        ) -> ::core::result::Result<(), ::cleave::Error> {
            #not_built
        }
    })
}
